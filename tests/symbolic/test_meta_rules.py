"""kiln's own meta rules ([Note: meta rules without torch's refs] in kiln/symbolic/meta_rules.py):
each covered call gives the sizes, strides and dtypes torch's meta kernel gives, and a call a rule
does not cover falls through to torch's kernel (its errors included)."""
import pytest
import torch

from kiln.symbolic import FakeTensorMode
from kiln.symbolic.meta_rules import META_RULES, run_rule

aten = torch.ops.aten


def meta(*shape, dtype=torch.float32, layout="contiguous"):
    t = torch.empty(shape, dtype=dtype, device="meta")
    if layout == "channels_last":
        return t.to(memory_format=torch.channels_last)
    if layout == "reversed":          # dense, dims in the opposite order
        return torch.empty(tuple(reversed(shape)), dtype=dtype, device="meta").permute(*reversed(range(len(shape))))
    if layout == "transposed":        # last two dims swapped
        return torch.empty(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device="meta").transpose(-1, -2)
    if layout == "expanded":          # a broadcast view: dim 0 of stride 0
        return torch.empty(1, *shape[1:], dtype=dtype, device="meta").expand(*shape)
    return t


LAYOUTS = ("contiguous", "channels_last", "reversed", "transposed", "expanded")
SHAPE = (2, 3, 4, 5)


def _cases():
    for lay in LAYOUTS:
        x = meta(*SHAPE, layout=lay)
        for lay2 in ("contiguous", "channels_last", "transposed"):
            y = meta(*SHAPE, layout=lay2)
            for op in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.le.Tensor,
                       aten.eq.Tensor):
                yield op, (x, y), {}
        for other in (meta(5), meta(3, 1, 1), meta(1, 3, 1, 5), meta(dtype=torch.float64), meta(4, 1, dtype=torch.int64)):
            yield aten.add.Tensor, (x, other), {}
            yield aten.add.Tensor, (other, x), {}
            yield aten.div.Tensor, (other, x), {}
            yield aten.gt.Tensor, (other, x), {}
        for scalar in (2, 0.5, True):
            yield aten.mul.Tensor, (x, scalar), {}
            yield aten.lt.Scalar, (x, scalar), {}
        xi = meta(*SHAPE, dtype=torch.int32, layout=lay)
        yield aten.div.Tensor, (xi, meta(5, dtype=torch.int64)), {}
        yield aten.add.Tensor, (xi, 0.5), {}
        yield aten.mul.Tensor, (xi, meta(dtype=torch.float16)), {}
        yield aten.bitwise_not.default, (xi,), {}
        yield aten.bitwise_not.default, (meta(*SHAPE, dtype=torch.bool, layout=lay),), {}
        xh = meta(*SHAPE, dtype=torch.bfloat16, layout=lay)
        for a in (x, xh):
            yield aten.relu.default, (a,), {}
            yield aten.gelu.default, (a,), {}
            yield aten.gelu.default, (a,), {"approximate": "tanh"}
            yield aten.masked_fill.Scalar, (a, meta(1, 1, 4, 5, dtype=torch.bool), 0.0), {}
            yield aten.masked_fill.Scalar, (a, meta(*SHAPE, dtype=torch.bool, layout="channels_last"), -1e4), {}
            yield aten.masked_fill.Scalar, (a, meta(*SHAPE, dtype=torch.bool, layout=lay), 3), {}
            for dims, keep in (([2, 3], True), ([2, 3], False), ([1], False), ([-1], True), ([0, 1, 2, 3], False)):
                yield aten.mean.dim, (a, dims, keep), {}
            yield aten.native_layer_norm.default, (a, [5], meta(5, dtype=a.dtype), meta(5, dtype=a.dtype), 1e-5), {}
            yield aten.native_layer_norm.default, (a, [4, 5], None, None, 1e-5), {}
            for training in (True, False) if lay != "expanded" else ():     # a dense input only
                c = meta(3)
                yield aten.native_batch_norm.default, (a, c, c, c, c, training, 0.1, 1e-5), {}
                yield aten.native_batch_norm.default, (a, None, None, c, c, training, 0.1, 1e-5), {}
            if lay != "expanded":
                yield aten.native_batch_norm.default, (a, None, None, None, None, True, 0.1, 1e-5), {}
        yield aten.native_batch_norm.default, (meta(6, 3, dtype=torch.float64), None, None, None, None, True, 0.1, 1e-5), {}
        for a in (x, xh, xi, meta(*SHAPE, dtype=torch.bool, layout=lay), meta(*SHAPE, dtype=torch.float64, layout=lay)):
            for name in ("sin", "cos", "rsqrt", "sqrt", "exp", "log", "tanh", "sigmoid"):
                yield getattr(aten, name).default, (a,), {}
        for a in (x, xh, xi):
            yield aten.neg.default, (a,), {}
            for exponent in (2, 0.5, 3.0, 0):
                yield aten.pow.Tensor_Scalar, (a, exponent), {}
        yield aten.pow.Tensor_Scalar, (x, -1), {}
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for dim in (0, 1, -1):
            parts = [meta(*[n if d != dim % 3 else k for d, n in enumerate((2, 3, 4))], dtype=dtype) for k in (1, 2, 5)]
            yield aten.cat.default, (parts, dim), {}
        yield aten.cat.default, ([meta(2, 3, dtype=dtype)],), {}
        a = meta(2, 4, 6, dtype=dtype)
        for parts, dim in (([a[..., :3], a[..., 3:]], -1),                    # rotate_half's slices
                           ([meta(2, 1, 6, dtype=dtype).expand(2, 1, 6), meta(2, 6, 5, dtype=dtype).transpose(1, 2)], 1),
                           ([meta(6, 4, dtype=dtype).t(), meta(4, 2, dtype=dtype)], 1),
                           ([meta(2, 3, 4, layout="transposed", dtype=dtype), meta(2, 3, 4, layout="reversed", dtype=dtype)], 0),
                           ([meta(2, 3, 4, 5, dtype=dtype), meta(2, 3, 4, 5, dtype=dtype)], 1),
                           ([meta(2, 4, 6, 8, dtype=dtype).transpose(1, 2)[..., :4],           # llama's rotate_half
                             meta(2, 4, 6, 8, dtype=dtype).transpose(1, 2)[..., 4:]], -1),
                           ([meta(2, 3, 4, 5, layout="channels_last", dtype=dtype)] * 2, 1),
                           ([meta(2, 3, 4, 5, layout="channels_last", dtype=dtype)] * 2, 0),
                           ([meta(2, 3, 4, 5, layout="channels_last", dtype=dtype), meta(2, 3, 4, 5, dtype=dtype)], 1),
                           ([meta(2, 3, 4, 5, dtype=dtype), meta(2, 3, 4, 5, layout="channels_last", dtype=dtype)], 3),
                           ([meta(2, 1, 4, 5, layout="channels_last", dtype=dtype), meta(2, 3, 4, 5, layout="channels_last", dtype=dtype)], 1),
                           ([meta(2, 3, 4, 5, layout="reversed", dtype=dtype)] * 2, 2),
                           ([meta(2, 3, 4, 5, layout="expanded", dtype=dtype)] * 2, 1),
                           ([meta(1, 3, 2, 4, 5, dtype=dtype).to(memory_format=torch.channels_last_3d)] * 2, 2)):
            yield aten.cat.default, (parts, dim), {}
    for args, kwargs in (((5,), {}), ((0,), {}), ((2, 9), {}), ((4, 4), {}), ((0, 10, 3), {}), ((10, 0, -3), {}),
                         ((1, 2, 5), {}), ((3,), {"dtype": torch.float32}), ((7,), {"dtype": torch.int32}),
                         ((-4, 4, 2), {"dtype": torch.float64})):
        op = {1: aten.arange.default, 2: aten.arange.start, 3: aten.arange.start_step}[len(args)]
        yield op, args, {"device": torch.device("meta"), **kwargs}
    for bias in (meta(4), meta(3, 4), meta(1, 4), meta(3, 1)):
        for m1 in (meta(3, 5), meta(5, 3).t()):
            for m2 in (meta(5, 4), meta(4, 5).t()):
                yield aten.addmm.default, (bias, m1, m2), {}
                yield aten.addmm.default, (bias, m1, m2), {"beta": 0.5, "alpha": 2}


CASES = list(_cases())


def _describe(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.stride(), x.dtype)
    if isinstance(x, (tuple, list)):
        return tuple(_describe(y) for y in x)
    return x


@pytest.mark.parametrize("i", range(len(CASES)))
def test_rule_equals_torch_meta(i):
    op, args, kwargs = CASES[i]
    got = run_rule(op, args, kwargs)
    assert got is not NotImplemented, f"{op} not covered for {_describe(args)}"
    want = op(*args, **kwargs)              # torch's own meta kernel
    assert _describe(got) == _describe(want), f"{op} {_describe(args)} {kwargs}"


def test_every_rule_is_checked():
    assert set(META_RULES) - {op for op, _, _ in CASES} <= {
        aten.ne.Tensor, aten.lt.Tensor, aten.ge.Tensor, aten.eq.Scalar, aten.ne.Scalar, aten.le.Scalar,
        aten.gt.Scalar, aten.ge.Scalar}      # the same rule as their checked siblings


@pytest.mark.parametrize("op,args,kwargs", [
    (aten.add.Tensor, (meta(3), meta(3)), {"alpha": 2}),                 # alpha: eager checks it against dtypes
    (aten.sub.Tensor, (meta(3, dtype=torch.bool), meta(3, dtype=torch.bool)), {}),   # eager refuses
    (aten.add.Tensor, (meta(3), meta(4)), {}),                           # shapes that do not broadcast
    (aten.add.Tensor, (meta(3, dtype=torch.complex64), meta(3)), {}),    # complex: not covered
    (aten.relu.default, (meta(3, dtype=torch.bool),), {}),
    (aten.gelu.default, (meta(3, dtype=torch.int64),), {}),
    (aten.mean.dim, (meta(3, 4, dtype=torch.int64), [1]), {}),
    (aten.mean.dim, (meta(3, 4), [1]), {"dtype": torch.float64}),
    (aten.masked_fill.Scalar, (meta(3), meta(2, 3, dtype=torch.bool), 0.0), {}),   # mask larger than self
    (aten.addmm.default, (meta(4), meta(3, 5), meta(6, 4)), {}),
    (aten.native_layer_norm.default, (meta(3, 4), [5], None, None, 1e-5), {}),
    (aten.native_batch_norm.default, (meta(2, 3, 4), None, None, None, None, False, 0.1, 1e-5), {}),
    (aten.native_batch_norm.default, (meta(2, 3, 4, layout="expanded"), None, None, None, None, True, 0.1, 1e-5), {}),
    (aten.neg.default, (meta(3, dtype=torch.bool),), {}),
    (aten.pow.Tensor_Scalar, (meta(3, dtype=torch.int64), -1), {}),
    (aten.cat.default, ([meta(2, 3), meta(2, 3, dtype=torch.float64)],), {}),            # promotion
    (aten.cat.default, ([meta(2, 3), meta(0)],), {}),                                   # legacy empty
    (aten.arange.default, (2.5,), {}),                                                   # float bounds
    (aten.arange.start_step, (0, 4, 0), {}),
    (aten.arange.start, (9, 2), {}),                                                     # eager refuses
])
def test_uncovered_calls_fall_through(op, args, kwargs):
    assert run_rule(op, args, kwargs) is NotImplemented


def test_torch_errors_stay_under_the_fake_mode():
    mode = FakeTensorMode()
    with mode:
        a, b = torch.empty(3), torch.empty(4)
        with pytest.raises(RuntimeError):
            a + b
        with pytest.raises(RuntimeError):
            torch.ones(3, dtype=torch.bool) - torch.ones(3, dtype=torch.bool)
        with pytest.raises(RuntimeError):
            torch.arange(9, 2)
        assert torch.arange(2, 9, 3).shape == (3,) and torch.arange(2, 9, 3).dtype == torch.int64
        c = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        out = torch.nn.functional.batch_norm(c, torch.zeros(3), torch.ones(3), training=False)
    want = torch.nn.functional.batch_norm(torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
                                          torch.zeros(3), torch.ones(3), training=False)
    assert (out.shape, out.stride(), out.dtype, out.device) == (want.shape, want.stride(), want.dtype, want.device)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 3), (0, 3), (2, 0, 3), (3, 1, 2, 2)])
def test_a_rule_for_an_op_without_a_meta_kernel_equals_eager(shape):
    """[Note: ops torch gives no meta kernel]: geqrf's and histogram's sizes, strides and dtypes as
    their CPU kernels'."""
    from kiln.symbolic.meta_rules import NO_TORCH_META
    assert set(NO_TORCH_META) == {aten.geqrf.default, aten.histogram.bin_ct, aten.histogram.bins_tensor}
    a = torch.randn(shape)
    got = run_rule(aten.geqrf.default, (a.to("meta"),), {})
    assert _describe(got) == _describe(tuple(t.to("meta") for t in torch.geqrf(a)))
    for bins in (1, 7):
        got = run_rule(aten.histogram.bin_ct, (a.to("meta"), bins), {"weight": None})
        assert _describe(got) == _describe(tuple(t.to("meta") for t in aten.histogram.bin_ct(a, bins)))
    edges = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    got = run_rule(aten.histogram.bins_tensor, (a.to("meta"), edges.to("meta")), {})
    assert _describe(got) == _describe(tuple(t.to("meta") for t in aten.histogram.bins_tensor(a, edges)))
