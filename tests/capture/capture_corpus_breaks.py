"""Graph-break corpus: programs that cannot be one graph. Each must still equal eager, with the
expected graphs and breaks; side effects before and after the break must land in program order."""
from __future__ import annotations

import torch

from capture_corpus import PROGRAMS, T, Program, t


def signed(seed):
    """Seed 0: a positive-sum input; seed 1: negative, so both sides of a tensor branch run."""
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed)).abs() + 0.1
    return (x if seed == 0 else -x,)


def brk(graphs, breaks, inputs=T):
    def register(fn):
        PROGRAMS.append(Program("break_" + fn.__name__, fn, inputs, graphs, breaks))
        return fn
    return register


@brk(graphs=2, breaks=1)
def print_between(x):
    y = x * 2
    print("kiln corpus: a print between two graphs")
    return y + 1


@brk(graphs=3, breaks=1, inputs=signed)
def branch_on_tensor(x):
    y = x * 2
    if y.sum() > 0:
        return y * 2
    return y - 2


@brk(graphs=3, breaks=1, inputs=signed)
def while_on_tensor(x):
    y = x * 1
    if (y > 0).all():
        y = y * 3
    return y.sum(0)


# the value .item() returns is a constant of the resume function: a new value recompiles it
@brk(graphs=3, breaks=1)
def item_call(x):
    s = x.sum().item()
    return x * s


@brk(graphs=3, breaks=1)
def tolist_call(x):
    values = x[0].tolist()
    return x + len(values)


def _helper_with_branch(y):
    if y.mean() > 0:
        return y * 3
    return y / 3


@brk(graphs=5, breaks=2, inputs=signed)
def nested_function_break(x):
    y = x.sin()
    z = _helper_with_branch(y)
    return z.exp()


class _Scaler:
    def scaled(self, y, *, scale):
        return _helper_with_branch(y) * scale


_SCALER = _Scaler()


# the callee's frame is captured too when the call passes keywords (3.13: CALL_KW) or *args
@brk(graphs=6, breaks=3, inputs=signed)
def nested_break_through_keyword_call(x):
    y = x.sin()
    z = _SCALER.scaled(y, scale=2.0)
    return z.exp()


@brk(graphs=5, breaks=2, inputs=signed)
def nested_break_through_star_call(x):
    y = x.sin()
    z = _helper_with_branch(*[y])
    return z.exp()


@brk(graphs=2, breaks=1)
def break_keeps_locals(x):
    a = x + 1
    b = [a, a * 2]
    d = {"k": a - 1}
    print("kiln corpus: locals survive the break")
    return a + b[1] + d["k"]


# a break in a loop: the frame runs as Python, as under torch.compile (no graph: its callees are torch's)
@brk(graphs=0, breaks=1)
def break_in_loop(x):
    out = []
    for i in range(3):
        x = x + i
        print("kiln corpus: iteration", i)
        out.append(x)
    return torch.stack(out)


@brk(graphs=2, breaks=1)
def break_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("kiln corpus: inside no_grad")
        z = y + 1
    return z, torch.is_grad_enabled()


_LOG: list = []


# the resume function has no tensor ops: no second graph
@brk(graphs=1, breaks=1)
def list_side_effect_order(x):
    _LOG.clear()
    _LOG.append(x * 2)
    print("kiln corpus: side effects before a break are visible")
    _LOG.append(len(_LOG))
    return list(_LOG)


class _State:
    count = 0


_STATE = _State()


@brk(graphs=2, breaks=1)
def attribute_side_effect(x):
    _STATE.value = x * 3
    _STATE.count = 1
    print("kiln corpus: attribute writes happen before the print")
    _STATE.count = _STATE.count + 1
    return _STATE.value + _STATE.count


_GLOBAL_SCALE = 1.0


@brk(graphs=1, breaks=1)
def global_write_then_break(x):
    global _GLOBAL_SCALE
    _GLOBAL_SCALE = 2.0
    print("kiln corpus: global written")
    return x * _GLOBAL_SCALE


@brk(graphs=2, breaks=1)
def unsupported_c_call(x):
    import os
    y = x * 2
    n = len(os.getcwd()) * 0
    return y + n


@brk(graphs=2, breaks=1, inputs=t(3, 4))
def fstring_of_tensor(x):
    y = x + 1
    label = f"{y.shape} {y.sum():.0f}"
    return y * 2, len(label) > 0


# .numpy(), ndarray.copy and torch.from_numpy(ndarray) are traced as torch ops (numpy_calls.py)
@brk(graphs=1, breaks=0)
def numpy_roundtrip(x):
    y = x * 2
    a = y.numpy()
    return torch.from_numpy(a.copy()) + 1


# slices with tensor bounds (Pixtral's block mask from a cumsum): each bound is read with `.item()`,
# an unbacked SymInt, and the slices stay in one graph, as torch.compile keeps them ([Note: indices
# read from data] in kiln/symbolic/data_dependent.py; they once broke the graph at the subscript)
@brk(graphs=1, breaks=0, inputs=t(6, 6))
def slice_with_tensor_bounds(x):
    mask = torch.full((6, 6), -1.0)
    ends = torch.tensor([2, 4]).cumsum(-1)
    starts = torch.tensor([0, 2]).cumsum(-1)
    for s, e in zip(starts, ends):
        mask[s:e, s:e] = 0
    return x + mask, x[ends[0]:]


# 3.12 reads and writes `x[a:b]` by BINARY_SLICE / STORE_SLICE: one graph there too
@brk(graphs=1, breaks=0, inputs=t(6, 6))
def two_part_slice_with_tensor_bounds(x):
    ends = torch.tensor([2, 4]).cumsum(-1)
    y = x.clone()
    y[ends[0]:ends[1]] = 5
    return y, x[ends[0]:]
