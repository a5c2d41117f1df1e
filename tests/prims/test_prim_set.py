"""The prim set itself: size, records, strictness, meta rules against references, generated docs."""
import pytest
import torch

from kiln.prims import DECOMPOSITIONS, PRIMS, Category, PrimArgumentError, decompositions_for, is_extern, is_prim, ops
from kiln.prims.elementwise import BINARY, BINARY_TO_BOOL, FLOAT, INTEGRAL, UNARY, UNARY_TO_BOOL

aten = torch.ops.aten


def test_prim_set_is_closed_and_small():
    # 200 computing prims and externs, and the data-dependent externs of [Note: unbacked sizes]
    # (unique over a dim, repeat_interleave by counts): a closed set well under PrimTorch's ~250
    assert 0 < len(PRIMS) <= 205
    for name, prim in PRIMS.items():
        assert prim.name == name
        assert isinstance(prim.op, torch._ops.OpOverload) and prim.op.namespace == "kiln_prims"
        assert isinstance(prim.category, Category)
        assert prim.doc and "\n" not in prim.doc
        assert is_prim(prim.op)
    assert {p.category for p in PRIMS.values()} == set(Category)


def test_every_decomposition_is_keyed_by_an_aten_overload():
    for op, fn in DECOMPOSITIONS.items():
        assert isinstance(op, torch._ops.OpOverload) and op.namespace == "aten", op
        assert callable(fn)


def test_decompositions_for_leaves_backend_ops_alone():
    table = decompositions_for({aten.gelu.default, aten.mm.default})
    assert aten.gelu.default not in table and aten.mm.default not in table
    assert aten.native_layer_norm.default in table
    assert is_extern(ops.mm) and not is_extern(ops.add)


def test_prims_are_strict_about_dtype_and_shape():
    a = torch.randn(3)
    with pytest.raises(PrimArgumentError, match="dtypes differ"):
        ops.add(a, a.double())
    with pytest.raises(PrimArgumentError, match="shapes differ"):
        ops.mul(a, torch.randn(1))
    with pytest.raises(PrimArgumentError, match="does not accept"):
        ops.sin(torch.arange(3))
    with pytest.raises(PrimArgumentError, match="dims"):
        ops.sum(a, [-1])


def _sample(kind, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == INTEGRAL:
        return torch.randint(-5, 5, (3, 4)), torch.randint(0, 3, (3, 4))
    x = torch.rand(3, 4, dtype=dtype) + 0.5          # positive: log, sqrt, acosh, ... are defined
    return x, torch.rand(3, 4, dtype=dtype) + 0.5


@pytest.mark.parametrize("name", sorted({**UNARY, **UNARY_TO_BOOL, **BINARY, **BINARY_TO_BOOL}))
def test_elementwise_meta_rule_matches_reference(name):
    table = next(t for t in (UNARY, UNARY_TO_BOOL, BINARY, BINARY_TO_BOOL) if name in t)
    doc, reference, kind = table[name]
    arity = 1 if table in (UNARY, UNARY_TO_BOOL) else 2
    a, b = _sample(kind)
    if kind not in (FLOAT, INTEGRAL):
        a, b = a * 4, b * 4
    a = a.t()                                          # a non-contiguous layout the output must follow
    b = b.t()
    args = (a,) if arity == 1 else (a, b)
    op = PRIMS[name].op
    out = op(*args)
    meta = op(*(x.to("meta") for x in args))
    assert (out.shape, out.dtype) == (meta.shape, meta.dtype)
    assert out.stride() == meta.stride()
    expected = reference(*args)
    torch.testing.assert_close(out, expected, equal_nan=True)


def test_view_prims_alias_and_meta():
    x = torch.randn(2, 3, 4)
    assert ops.permute(x, [2, 0, 1]).data_ptr() == x.data_ptr()
    b = ops.broadcast_in_dim(torch.randn(3), [2, 3, 4], [1])
    assert b.shape == (2, 3, 4) and b.stride() == (0, 1, 0)
    s = ops.slice(x, 2, 1, 4, 2)
    m = ops.slice(x.to("meta"), 2, 1, 4, 2)
    assert s.shape == m.shape and s.stride() == m.stride()
    padded = ops.pad(torch.ones(2, 2), 0.0, [1, 0], [0, 1], [1, 0])
    assert padded.tolist() == [[0, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 0]]


def test_externs_run_aten_kernels_and_meta():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(ops.mm(a, b), a @ b)
    assert ops.mm(a.to("meta"), b.to("meta")).shape == (3, 5)


def test_docs_page_is_generated_from_the_definitions():
    from kiln.prims.docgen import DOC_PATH, render
    with open(DOC_PATH) as f:
        assert f.read() == render(), "docs/prims.md is stale: run `python -m kiln.prims.docgen`"


def test_coverage_report_covers_the_model_ops():
    from kiln.prims.coverage import report
    r = report()
    assert r["model_ops_missing"] == []
    assert r["prims"] == len(PRIMS)


def test_undecomposed_ops_reports_what_a_backend_would_see():
    from kiln.prims import DECOMPOSITIONS, PrimEvaluator, UndecomposedOp, undecomposed_ops
    x = torch.randn(4, 4, requires_grad=True)
    assert not undecomposed_ops(lambda t: torch.nn.functional.gelu(t @ t).sum(), x)
    table = dict(DECOMPOSITIONS)
    del table[aten.gelu.default]
    with pytest.raises(UndecomposedOp, match="aten.gelu.default"):
        with PrimEvaluator(decompositions=table):
            torch.nn.functional.gelu(x)


def test_a_decomposition_may_decline_its_arguments():
    from kiln.prims import PrimEvaluator
    x = torch.randn(1, 1, 4, 4)
    grid = torch.rand(1, 2, 2, 2) * 2 - 1
    evaluator = PrimEvaluator(strict=False)
    with evaluator:   # bicubic is declined (NotImplemented): it stays an ATen op, and is reported
        out = torch.nn.functional.grid_sample(x, grid, mode="bicubic", align_corners=False)
    assert "aten.grid_sampler_2d.default" in evaluator.log.undecomposed
    torch.testing.assert_close(out, torch.nn.functional.grid_sample(x, grid, mode="bicubic", align_corners=False))


def test_view_strides_follows_atens_view_rule():
    # reshape decides view-or-copy by this rule; a meta tensor's `view` is no arbiter (torch.compile's
    # meta kernels, once registered, accepted BERT's batch-expanded position ids flattened)
    import random
    from kiln.prims.decompositions.refs import view_strides
    rng = random.Random(0)
    checked = viewable = 0
    for _ in range(2000):
        nd = rng.randint(1, 4)
        t = torch.empty_strided([rng.choice([1, 2, 3, 4, 6]) for _ in range(nd)],
                                [rng.choice([0, 1, 2, 3, 4, 6, 12, 24]) for _ in range(nd)])
        shape, rest = [], t.numel()
        for f in (2, 3, 2, 1, 4, 6):
            if rest % f == 0 and rng.random() < 0.5:
                shape.append(f)
                rest //= f
        shape.append(rest)
        rng.shuffle(shape)
        try:
            want = list(t.view(shape).stride())
        except RuntimeError:
            want = None
        got = view_strides(list(t.shape), list(t.stride()), shape)
        assert (got is None) == (want is None), (t.shape, t.stride(), shape)
        if want is not None:   # a size-1 dim's stride is arbitrary
            assert [s for s, n in zip(got, shape) if n != 1] == [s for s, n in zip(want, shape) if n != 1]
            viewable += 1
        checked += 1
    assert 0 < viewable < checked
