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
        c = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        out = torch.nn.functional.batch_norm(c, torch.zeros(3), torch.ones(3), training=False)
    want = torch.nn.functional.batch_norm(torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
                                          torch.zeros(3), torch.ones(3), training=False)
    assert (out.shape, out.stride(), out.dtype, out.device) == (want.shape, want.stride(), want.dtype, want.device)
