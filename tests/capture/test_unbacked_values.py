"""Values known only at run time (issue #39 item 2, [Note: unbacked sizes]): what torch.compile keeps
in one graph under fullgraph=True by reasoning about unbacked values, kiln keeps too, with the same
answers as eager, and a check assumed while compiling still raises when it fails at run time.

Each case is compared with eager, and with torch.compile (backend="eager") on this machine: where
torch.compile keeps one graph kiln must; where torch.compile refuses under fullgraph (a Python branch
on a count), kiln refuses too, naming the user's line, and without fullgraph gives eager's answers.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.errors import Unsupported

POSITIVE_3 = torch.tensor([1.0, -2.0, 3.0, 0.5, -1.0])     # three positives
POSITIVE_1 = torch.tensor([1.0, -2.0, -3.0, -0.5, -1.0])   # one positive
POSITIVE_0 = -torch.ones(5)
INPUTS = (POSITIVE_3, POSITIVE_1, POSITIVE_0)


# --- torch._check and torch._check_is_size: assumed while compiling, checked at run time ----------
def check_ge(x):
    n = (x > 0).sum().item()
    torch._check(n >= 2, lambda: "need two positives")
    return x.new_zeros(n) + 1


def check_is_size(x):
    n = (x > 0).sum().item()
    torch._check_is_size(n)
    torch._check(n <= x.shape[0])
    return x[:n].sum() + torch.ones(n).sum() + x


def check_bool_item(x):
    torch._check((x > -10).all().item())
    return x * 2


def bool_item_unused(x):
    # longformer: `is_global_attn = mask.flatten().any().item()`, read only where a short-circuit skips it
    g = (x > 0).flatten().any().item()
    extra = () if (False and g) else None
    return x * 2 if extra is None else x


def branch_after_check(x):
    n = (x > 0).sum().item()
    torch._check(n > 0)
    if n == 0:              # decided by the assumption above: no branch at run time
        return x * 0
    return x * n


def branch_ge0_after_is_size(x):
    n = (x > 0).sum().item()
    torch._check_is_size(n)
    if n >= 0:
        return x * n
    return x * 0


def mask_then_view(x):
    y = x[x > 0]
    return (y.view(-1, 1) * torch.ones(1, 3)).sum(0)


# --- min / max over unbacked values and sizes ------------------------------------------------------
def min_max_sizes(x):
    n = (x > 0).sum().item()
    torch._check_is_size(n)
    m = min(n, x.shape[0])
    k = max(n, 2)
    return torch.ones(m).sum() + torch.ones(k).sum() + x


def min_max_ints(x):
    n = (x > 0).sum().item()
    m = (x < 0).sum().item()
    return torch.zeros(max(n, m) + 1).sum() + min(n, m) + x


# --- indexing by values read from data -------------------------------------------------------------
def setitem_unbacked_int(x):
    i = x.argmax().item()
    y = x.clone()
    y[i] = 5.0
    return y


def setitem_negative_unbacked_int(x):
    i = x.argmax().item() - x.shape[0]     # a negative index, wrapped as eager wraps it
    y = x.clone()
    y[i] = 5.0
    return y


def slice_bounds_from_tensor(x):
    # aria's sequential_experts_gemm: `output[start:end] = tokens[start:end] @ w` with cumsum bounds
    counts = (x > 0).long() + 1
    bounds = torch.cat((torch.zeros(1, dtype=torch.long), counts.cumsum(0)))
    out = torch.zeros(12, 3)
    tokens = torch.arange(36.0).reshape(12, 3) * x.sum()
    for i in range(3):
        start, end = bounds[i], bounds[i + 1]
        out[start:end] = tokens[start:end] * 2
    return out


def block_mask_from_tensor(x):
    # pixtral's generate_block_attention_mask: `mask[start:end, start:end] = 0` over cumsum bounds
    sizes = (x[:2] > 0).long() + 2
    ends = sizes.cumsum(-1)
    starts = torch.cat((torch.zeros(1, dtype=torch.long), sizes[:-1])).cumsum(-1)
    mask = torch.full((6, 6), -1.0)
    for start, end in zip(starts, ends):
        mask[start:end, start:end] = 0
    return mask + x.sum()


def setitem_tensor_index(x):
    y = x.clone()
    y[x.argmax()] = 0.0     # a 0-d integer tensor as the index (torch.compile refuses this one)
    return y


def setitem_mask(x):
    y = x.clone()
    y[y > 0] = 0.0
    return y


ONE_GRAPH = [check_ge, check_is_size, check_bool_item, bool_item_unused, branch_after_check,
             branch_ge0_after_is_size, mask_then_view, min_max_sizes, min_max_ints, setitem_unbacked_int,
             setitem_negative_unbacked_int, slice_bounds_from_tensor, block_mask_from_tensor, setitem_mask]

# One graph only from this torch on: torch 2.11's fake slicing gives `tokens[start:end]` and
# `out[start:end]` different unbacked sizes, so the write's size check branches on Eq(u4, u2)
# (torch.compile breaks the graph there too; kiln raises under fullgraph, naming the line)
NEEDS_TORCH = {slice_bounds_from_tensor: (2, 13)}


def _skip_on_older_torch(fn):
    need = NEEDS_TORCH.get(fn)
    if need is not None and tuple(int(p) for p in torch.__version__.split(".")[:2]) < need:
        pytest.skip(f"one graph needs torch >= {need[0]}.{need[1]} (this is {torch.__version__})")


def _eager_or_error(fn, x):
    try:
        return fn(x), None
    except RuntimeError as e:
        return None, e


def _torch_compile_keeps_one_graph(fn) -> bool:
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    try:
        compiled(POSITIVE_3)
    except RuntimeError as e:     # an assumption that fails on the first input is still one graph
        return "data-dependent" not in str(e) and "Unsupported" not in type(e).__name__
    except Exception:
        return False
    return True


@pytest.mark.parametrize("fn", ONE_GRAPH, ids=lambda f: f.__name__)
def test_torch_compile_keeps_these_in_one_graph(fn):
    _skip_on_older_torch(fn)
    assert _torch_compile_keeps_one_graph(fn)


# Captured in one graph (backend="eager" passes), but kiln's own backend cannot compile the graph yet:
# aot's functionalization turns the write into select_scatter / slice_scatter / index_put, whose
# decompositions branch on the sign of the unbacked index (or on the mask's count being 0 or 1).
_WRITE_THROUGH_DATA_INDEX = "aot: the scatter of a write at an index read from data branches on its sign"
KILN_BACKEND_FAILS = {
    setitem_unbacked_int: _WRITE_THROUGH_DATA_INDEX,
    setitem_negative_unbacked_int: _WRITE_THROUGH_DATA_INDEX,
    slice_bounds_from_tensor: _WRITE_THROUGH_DATA_INDEX,
    block_mask_from_tensor: _WRITE_THROUGH_DATA_INDEX,
}


def _cases():
    for fn in ONE_GRAPH:
        for backend in ("eager", "kiln"):
            reason = KILN_BACKEND_FAILS.get(fn) if backend == "kiln" else None
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            yield pytest.param(fn, backend, marks=marks, id=f"{fn.__name__}-{backend}")


@pytest.mark.parametrize("fn, backend", list(_cases()))
def test_one_graph_and_eagers_answers(fn, backend):
    _skip_on_older_torch(fn)
    kiln.reset()
    compiled = kiln.compile(fn, fullgraph=True, backend=backend)
    for x in INPUTS:
        expected, error = _eager_or_error(fn, x)
        if error is not None:
            with pytest.raises(RuntimeError):
                compiled(x)
            continue
        torch.testing.assert_close(compiled(x), expected)
    report = kiln.explain(fn, POSITIVE_3)
    assert len(report.graphs) == 1 and not report.breaks, report


_CHECK_LINE = check_ge.__code__.co_firstlineno + 2


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_a_failed_check_raises_eagers_error_naming_the_users_line(backend):
    kiln.reset()
    compiled = kiln.compile(check_ge, fullgraph=True, backend=backend)
    compiled(POSITIVE_3)
    with pytest.raises(RuntimeError, match="need two positives") as info:
        compiled(POSITIVE_1)
    assert f"{__file__}:{_CHECK_LINE}" in str(info.value) or \
        any(f.lineno == _CHECK_LINE and f.filename == __file__ for f in info.traceback)


def check_bool_fails(x):
    torch._check((x > 0).all().item())
    return x * 2


def is_size_of_negative(x):
    n = x.argmax().item() - 10      # always negative: eager's _check_is_size refuses it
    torch._check_is_size(n)
    return x + n


@pytest.mark.parametrize("backend", ["eager", "kiln"])
@pytest.mark.parametrize("fn", [check_bool_fails, is_size_of_negative], ids=lambda f: f.__name__)
def test_an_assumption_that_fails_raises_never_a_wrong_answer(fn, backend):
    with pytest.raises(RuntimeError):
        fn(POSITIVE_3)
    kiln.reset()
    with pytest.raises(RuntimeError):
        kiln.compile(fn, fullgraph=True, backend=backend)(POSITIVE_3)


# --- what torch.compile refuses under fullgraph too: a Python branch on a run-time value -----------
def branch_eq0_after_is_size(x):
    n = (x > 0).sum().item()
    torch._check_is_size(n)
    if n == 0:
        return x * 0
    return x * n


def branch_on_bool_item(x):
    if (x > 0).any().item():
        return x * 2
    return x


REFUSED = [branch_eq0_after_is_size, branch_on_bool_item]
_BRANCH_LINE = {branch_eq0_after_is_size: 3, branch_on_bool_item: 1}


@pytest.mark.parametrize("fn", REFUSED, ids=lambda f: f.__name__)
def test_a_branch_on_a_run_time_value_is_refused_as_torch_compile_refuses_it(fn):
    assert not _torch_compile_keeps_one_graph(fn)
    kiln.reset()
    with pytest.raises(Unsupported) as info:
        kiln.compile(fn, fullgraph=True, backend="eager")(POSITIVE_3)
    assert f"{__file__}:{fn.__code__.co_firstlineno + _BRANCH_LINE[fn]}" in str(info.value)
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = kiln.compile(fn, backend="eager")
        for x in INPUTS:
            torch.testing.assert_close(compiled(x), fn(x))


def test_a_zero_d_tensor_index_is_one_graph_where_torch_compile_refuses_it():
    """`y[t] = v` with a 0-d integer tensor t: eager reads it as an int; kiln reads it as `.item()`."""
    assert not _torch_compile_keeps_one_graph(setitem_tensor_index)
    kiln.reset()
    compiled = kiln.compile(setitem_tensor_index, fullgraph=True, backend="eager")
    for x in INPUTS:
        torch.testing.assert_close(compiled(x), setitem_tensor_index(x))
