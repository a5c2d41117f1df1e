"""Kernels printed by kiln's Triton printer, run by Triton's interpreter on CPU tensors, vs eager.

Kernels here are hand-built loop IR (what the scheduler hands the printer), so every printer path
is exercised on its own: pointwise ops, masks, index expressions, symbolic sizes, reductions and
scans in both bodies (persistent and looped), half-precision dtypes. No TRITON_INTERPRET is needed:
kiln loads kernels for CPU buffers in interpreter mode itself (`source_cache`).
"""
import pytest
import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.triton import build, print_kernel
from kiln.codegen.triton.heuristics import LaunchConfig

F32, F64, I64 = torch.float32, torch.float64, torch.int64
s0, s1 = ir.size_var("s0"), ir.size_var("s1")
x0, x1 = ir.loop_var(0), ir.loop_var(1)
r0 = ir.reduction_var(0)
LOOPED = LaunchConfig(XBLOCK=4, RBLOCK=16, num_warps=1, persistent=False)


def contiguous(name, sizes, dtype=F32):
    return ir.Buffer(name, tuple(sizes), ir.contiguous_strides(sizes), dtype)


def run(kernel, buffers, tensors, sizes, config=None):
    fn = build([kernel], buffers)[kernel.name]
    if config is not None:
        fn.configs[tuple(fn.numels(*sizes))] = config
    fn(*tensors, *sizes)
    return fn


def pointwise_kernel(name, stores, buffer_args, ranges=(s0, s1), sizes=(s0, s1)):
    return ir.Kernel(name, tuple(ranges), (ir.Stage((), tuple(stores)),), tuple(buffer_args), tuple(sizes))


# ---------------------------------------------------------------------------- pointwise

def test_one_kernel_serves_every_size_of_symbolic_dims():
    bufs = {"a": contiguous("a", (s0, s1)), "b": contiguous("b", (s1,)), "out": contiguous("out", (s0, s1))}
    a = ir.Load("a", x0 * s1 + x1, F32)
    b = ir.Load("b", x1, F32)
    expr = ir.Op("mul", (ir.Op("sigmoid", (a,), F32), ir.Op("add", (a, b), F32)), F32)
    kernel = pointwise_kernel("silu_bias", [ir.Store("out", x0 * s1 + x1, expr)], ["a", "b", "out"])
    fn = build([kernel], bufs)["silu_bias"]
    for shape in [(3, 5), (16, 64), (7, 129), (1, 3)]:
        ta, tb, out = torch.randn(shape), torch.randn(shape[1]), torch.full(shape, float("nan"))
        fn(ta, tb, out, *shape)
        torch.testing.assert_close(out, torch.sigmoid(ta) * (ta + tb))
    # The source is printed with the sizes as arguments: nothing size-specific in it, and buffers
    # are named by position, not by the graph.
    assert "129" not in fn.source and f"def {fn.function}(p_in0, p_in1, p_in2, s0, s1, xnumel" in fn.source
    assert fn.function.startswith("kiln_poi_") and "sigmoid" in fn.function   # a profile tells kernels apart


def test_equal_kernels_of_other_buffers_share_one_source_and_function():
    # a model's repeated layers give kernels equal up to buffer names: one source, one compile
    def layer(i):
        bufs = {f"x{i}": contiguous(f"x{i}", (s0, s1)), f"y{i}": contiguous(f"y{i}", (s0, s1))}
        load = ir.Load(f"x{i}", x0 * s1 + x1, F32)
        stage = ir.Stage((), (ir.Assign(f"t{i}", ir.Op("exp", (load,), F32)),
                              ir.Store(f"y{i}", x0 * s1 + x1, ir.Op("mul", (ir.Var(f"t{i}", F32), load), F32))))
        return ir.Kernel(f"k{i}", (s0, s1), (stage,), (f"x{i}", f"y{i}"), (s0, s1)), bufs

    (k1, b1), (k2, b2) = layer(1), layer(2)
    fns = build([k1, k2], {**b1, **b2})
    assert print_kernel(k1, b1) == print_kernel(k2, b2)
    assert fns["k1"].persistent_fn is fns["k2"].persistent_fn
    for name in ("k1", "k2"):
        x, y = torch.randn(4, 6), torch.full((4, 6), float("nan"))
        fns[name](x, y, 4, 6)
        torch.testing.assert_close(y, torch.exp(x) * x)


UNARY_DOMAIN = {  # op -> (input transform into the op's domain, torch reference)
    "neg": (None, torch.neg), "abs": (None, torch.abs), "exp": (None, torch.exp), "exp2": (None, torch.exp2),
    "expm1": (None, torch.expm1), "log": (torch.abs, torch.log), "log2": (torch.abs, torch.log2),
    "log10": (torch.abs, torch.log10), "log1p": (torch.abs, torch.log1p), "sqrt": (torch.abs, torch.sqrt),
    "rsqrt": (torch.abs, torch.rsqrt), "sin": (None, torch.sin), "cos": (None, torch.cos),
    "tan": (None, torch.tan), "asin": (torch.tanh, torch.asin), "acos": (torch.tanh, torch.acos),
    "atan": (None, torch.atan), "sinh": (None, torch.sinh), "cosh": (None, torch.cosh),
    "tanh": (None, torch.tanh), "asinh": (None, torch.asinh), "acosh": (lambda t: t.abs() + 1, torch.acosh),
    "atanh": (lambda t: torch.tanh(t) * 0.9, torch.atanh), "erf": (None, torch.erf), "erfc": (None, torch.erfc),
    "sigmoid": (None, torch.sigmoid), "reciprocal": (None, torch.reciprocal), "floor": (None, torch.floor),
    "ceil": (None, torch.ceil), "round": (lambda t: t * 4, torch.round), "trunc": (None, torch.trunc),
    "sign": (None, torch.sign), "relu": (None, torch.relu), "frac": (None, torch.frac),
}


def test_unary_ops_match_eager():
    # One kernel, one launch: each op reads its own input, moved into the op's domain.
    n = 300
    names = sorted(UNARY_DOMAIN)
    source = torch.randn(n) * 3
    source[:4] = torch.tensor([0.5, -0.5, 2.5, -1.5]) / 4     # round-half-even ties after `t * 4`
    source[4] = float("nan")                                   # NaN through every op
    bufs, stores, tensors, outs = {}, [], [], {}
    for name in names:
        transform, _ = UNARY_DOMAIN[name]
        bufs[f"i_{name}"], bufs[f"o_{name}"] = contiguous(f"i_{name}", (n,)), contiguous(f"o_{name}", (n,))
        stores.append(ir.Store(f"o_{name}", x0, ir.Op(name, (ir.Load(f"i_{name}", x0, F32),), F32)))
        outs[name] = torch.empty(n)
        tensors += [transform(source) if transform else source, outs[name]]
    run(pointwise_kernel("unary", stores, list(bufs), ranges=(n,), sizes=()), bufs, tensors, ())
    bad = {}
    for k, name in enumerate(names):
        want = UNARY_DOMAIN[name][1](tensors[2 * k].double()).float()
        if not torch.allclose(outs[name], want, rtol=2e-5, atol=2e-5, equal_nan=True):
            bad[name] = (outs[name] - want).abs().max().item()
    assert not bad, f"ops differing from eager (max abs error): {bad}"


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2, "hypot": torch.hypot,
    "copysign": torch.copysign, "pow": None, "floordiv": torch.floor_divide, "remainder": torch.remainder,
    "fmod": torch.fmod,
}


@pytest.mark.parametrize("dtype", [F32, I64])
def test_binary_ops_match_eager_including_negative_operands(dtype):
    n = 64
    g = torch.Generator().manual_seed(0)
    if dtype == I64:
        a = torch.randint(-20, 20, (n,), generator=g)
        b = torch.randint(1, 7, (n,), generator=g) * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
        names = ["add", "sub", "mul", "truediv", "maximum", "minimum", "floordiv", "remainder", "fmod"]
    else:
        a, b = torch.randn(n, generator=g) * 3, torch.randn(n, generator=g) * 2
        a[0], b[1] = float("nan"), float("nan")                     # maximum/minimum propagate NaN
        names = [k for k in BINARY]
    for name in names:
        bufs = {"a": contiguous("a", (n,), dtype), "b": contiguous("b", (n,), dtype), "o": contiguous("o", (n,), dtype)}
        lhs = ir.Load("a", x0, dtype)
        if name == "pow":
            lhs, ref = ir.Op("abs", (lhs,), dtype), lambda p, q: torch.pow(p.abs(), q)
        elif name == "truediv" and dtype == I64:
            ref = lambda p, q: torch.div(p, q, rounding_mode="trunc")  # noqa: E731 (C division on ints)
        else:
            ref = BINARY[name]
        expr = ir.Op(name, (lhs, ir.Load("b", x0, dtype)), dtype)
        out = torch.empty(n, dtype=dtype)
        run(pointwise_kernel(f"b_{name}", [ir.Store("o", x0, expr)], ["a", "b", "o"], ranges=(n,), sizes=()),
            bufs, [a, b, out], ())
        want = ref(a.double(), b.double()).to(dtype) if dtype == F32 else ref(a, b)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, equal_nan=True, msg=f"op {name}")


def test_strided_broadcast_and_offset_indexing():
    # out[i, j] = a.T[i, j] + b[j] + c[2 + i] where a is (s1, s0) contiguous and c has an offset.
    bufs = {"a": ir.Buffer("a", (s0, s1), (1, s0), F32), "b": contiguous("b", (s1,)),
            "c": ir.Buffer("c", (s0,), (1,), F32, offset=sympy.Integer(2)), "out": contiguous("out", (s0, s1))}
    expr = ir.Op("add", (ir.Op("add", (ir.Load("a", x0 + x1 * s0, F32), ir.Load("b", x1, F32)), F32),
                         ir.Load("c", x0 + 2, F32)), F32)
    kernel = pointwise_kernel("strided", [ir.Store("out", x0 * s1 + x1, expr)], ["a", "b", "c", "out"])
    for shape in [(5, 7), (33, 4)]:
        a, b, c, out = torch.randn(shape[1], shape[0]), torch.randn(shape[1]), torch.randn(shape[0] + 2), torch.empty(shape)
        run(kernel, bufs, [a, b, c, out], shape)
        torch.testing.assert_close(out, a.T + b + c[2:, None])


def test_half_precision_loads_compute_in_float32_and_store_rounded():
    for dtype in (torch.bfloat16, torch.float16):
        bufs = {"a": contiguous("a", (s0, s1), dtype), "out": contiguous("out", (s0, s1), dtype)}
        a = ir.Load("a", x0 * s1 + x1, dtype)
        # gelu(a) * 3 computed in float32 from the half-precision load, stored back as half.
        inner = ir.Op("mul", (a, ir.Constant(0.7071067811865476, dtype)), dtype)
        gelu = ir.Op("mul", (ir.Op("mul", (a, ir.Constant(0.5, dtype)), dtype),
                             ir.Op("add", (ir.Op("erf", (inner,), dtype), ir.Constant(1.0, dtype)), dtype)), dtype)
        expr = ir.Op("mul", (gelu, ir.Constant(3.0, dtype)), dtype)
        kernel = pointwise_kernel(f"gelu_{str(dtype)[6:]}", [ir.Store("out", x0 * s1 + x1, expr)], ["a", "out"])
        ta, out = torch.randn(9, 31).to(dtype), torch.empty(9, 31, dtype=dtype)
        run(kernel, bufs, [ta, out], (9, 31))
        want = (torch.nn.functional.gelu(ta.double()) * 3).to(dtype)
        torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)
        assert ".to(tl.float32)" in print_kernel(kernel, bufs)


# ---------------------------------------------------------------------------- reductions

def reduction_kernel(ops_and_outs, buffers, expr_for):
    """One kernel: per op, Accumulate over r of expr_for(op), then store the result per row."""
    accs, stores = [], []
    for op, out in ops_and_outs:
        accs.append(ir.Accumulate(f"v_{op}", op, expr_for(op)))
        dtype = buffers[out].dtype
        stores.append(ir.Store(out, x0, ir.Var(f"v_{op}", dtype)))
    return ir.Kernel("reduce_all", (s0,), (ir.Stage((s1,), tuple(accs)), ir.Stage((), tuple(stores))),
                     tuple(b for b in buffers), (s0, s1))


@pytest.mark.parametrize("config", [None, LOOPED], ids=["persistent", "looped"])
def test_reductions_match_eager(config):
    ops = ["sum", "max", "min", "prod", "any", "all", "argmax", "argmin", "welford_mean", "welford_m2"]
    out_dtype = {"any": torch.bool, "all": torch.bool, "argmax": I64, "argmin": I64}
    bufs = {"a": contiguous("a", (s0, s1))}
    for op in ops:
        bufs[f"o_{op}"] = contiguous(f"o_{op}", (s0,), out_dtype.get(op, F32))
    load = ir.Load("a", x0 * s1 + r0, F32)

    def expr_for(op):
        if op in ("any", "all"):
            return ir.Op("gt", (load, ir.Constant(0.0, F32)), torch.bool)
        if op == "prod":
            return ir.Op("add", (ir.Op("mul", (load, ir.Constant(0.1, F32)), F32), ir.Constant(1.0, F32)), F32)
        return load

    kernel = reduction_kernel([(op, f"o_{op}") for op in ops], bufs, expr_for)
    rows, cols = 7, 37
    a = torch.randn(rows, cols)
    a[1, 5] = float("nan")                      # max/min propagate NaN; argmax/argmin point at it
    a[2, :] = 1.0                               # ties: the first index wins
    a[3, 10], a[3, 30] = 9.0, 9.0
    a[4, :] = -1.0                              # any() false, all() false
    a[5, :] = 2.0                               # all() true
    a[6, :] = float("-inf")                     # argmax of a row of -inf is 0, as eager
    outs = {op: torch.empty(rows, dtype=out_dtype.get(op, F32)) for op in ops}
    run(kernel, bufs, [a] + [outs[op] for op in ops], (rows, cols), config)
    want = {"sum": a.sum(1), "max": a.amax(1), "min": a.amin(1), "prod": (a * 0.1 + 1).double().prod(1).float(),
            "any": (a > 0).any(1), "all": (a > 0).all(1), "argmax": a.argmax(1), "argmin": a.argmin(1),
            "welford_mean": a.double().mean(1).float(),
            "welford_m2": (a.double().var(1, correction=0) * cols).float()}
    for op in ops:
        # A looped Welford pass over a row of infinities gives NaN for the mean (inf - inf), where
        # eager's two passes give inf: a documented limit, so that row is left out for Welford.
        rows_checked = slice(0, 6) if op.startswith("welford") else slice(None)
        torch.testing.assert_close(outs[op][rows_checked], want[op][rows_checked], rtol=1e-4, atol=1e-4,
                                   equal_nan=True, msg=f"reduction {op}")


@pytest.mark.parametrize("config", [None, LOOPED], ids=["persistent", "looped"])
def test_softmax_one_kernel_reads_input_once_when_persistent(config):
    bufs = {"a": contiguous("a", (s0, s1)), "out": contiguous("out", (s0, s1))}
    load = ir.Load("a", x0 * s1 + r0, F32)
    m, s = ir.Var("m", F32), ir.Var("s", F32)
    e = ir.Op("exp", (ir.Op("sub", (load, m), F32),), F32)
    kernel = ir.Kernel("softmax", (s0,), (
        ir.Stage((s1,), (ir.Accumulate("m", "max", load),)),
        ir.Stage((s1,), (ir.Accumulate("s", "sum", e),)),
        ir.Stage((s1,), (ir.Store("out", x0 * s1 + r0, ir.Op("truediv", (e, s), F32)),)),
    ), ("a", "out"), (s0, s1))
    for shape in [(6, 50), (3, 7)]:
        a, out = torch.randn(shape) * 4, torch.empty(shape)
        fn = run(kernel, bufs, [a, out], shape, config)
        torch.testing.assert_close(out, torch.softmax(a.double(), 1).float())
    persistent = fn.source.split(f"def {fn.function}_looped")[0]
    assert persistent.count("tl.load(") == 1, "the persistent body must load the row once"


@pytest.mark.parametrize("config", [None, LOOPED], ids=["persistent", "looped"])
def test_a_value_stored_then_read_back_is_forwarded_when_persistent(config):
    # softmax as T5's decoder got it: exp stored, then read back to divide by the sum (bf16 buffer)
    bufs = {"a": contiguous("a", (s0, s1)), "e": contiguous("e", (s0, s1), torch.bfloat16),
            "out": contiguous("out", (s0, s1))}
    load = ir.Load("a", x0 * s1 + r0, F32)
    m, s = ir.Var("m", F32), ir.Var("s", F32)
    kernel = ir.Kernel("softmax_stored", (s0,), (
        ir.Stage((s1,), (ir.Accumulate("m", "max", load),)),
        ir.Stage((s1,), (ir.Assign("e", ir.Op("exp", (ir.Op("sub", (load, m), F32),), F32)),
                         ir.Store("e", x0 * s1 + r0, ir.Var("e", F32)), ir.Accumulate("s", "sum", ir.Var("e", F32)))),
        ir.Stage((s1,), (ir.Store("out", x0 * s1 + r0,
                                  ir.Op("truediv", (ir.Load("e", x0 * s1 + r0, F32), s), F32)),)),
    ), ("a", "e", "out"), (s0, s1))
    for shape in [(6, 50), (3, 7)]:
        a, e, out = torch.randn(shape) * 4, torch.empty(shape, dtype=torch.bfloat16), torch.empty(shape)
        fn = run(kernel, bufs, [a, e, out], shape, config)
        exp = torch.exp(a.double() - a.double().amax(1, keepdim=True))
        torch.testing.assert_close(e, exp.bfloat16())
        # the divisor sums unrounded values, the dividend is what the bf16 buffer holds
        torch.testing.assert_close(out, (exp.bfloat16().double() / exp.sum(1, keepdim=True)).float())
    persistent = fn.source.split(f"def {fn.function}_looped")[0]
    assert persistent.count("tl.load(") == 1, "the stored exp must be forwarded, not read back"


@pytest.mark.parametrize("config", [None, LOOPED], ids=["persistent", "looped"])
def test_scans_match_eager(config):
    ops = {"cumsum": torch.cumsum, "cumprod": torch.cumprod, "cummax": lambda t, d: torch.cummax(t, d).values,
           "cummin": lambda t, d: torch.cummin(t, d).values, "logcumsumexp": torch.logcumsumexp}
    rows, cols = 5, 35
    a = torch.randn(rows, cols) * 0.5 + 1
    for op, ref in ops.items():
        bufs = {"a": contiguous("a", (s0, s1)), "out": contiguous("out", (s0, s1))}
        load = ir.Load("a", x0 * s1 + r0, F32)
        kernel = ir.Kernel(f"scan_{op}", (s0,), (ir.Stage((s1,), (
            ir.ScanAccumulate("c", op, load), ir.Store("out", x0 * s1 + r0, ir.Var("c", F32)))),),
            ("a", "out"), (s0, s1))
        out = torch.empty(rows, cols)
        run(kernel, bufs, [a, out], (rows, cols), config)
        torch.testing.assert_close(out, ref(a.double(), 1).float(), rtol=1e-4, atol=1e-4, msg=f"scan {op}")


def test_reduction_over_outer_dim_and_full_reduction():
    # column sums of a (s0, s1) tensor: the reduced dim is strided, the output dim contiguous
    bufs = {"a": contiguous("a", (s0, s1)), "cols": contiguous("cols", (s1,)), "total": contiguous("total", ())}
    load = ir.Load("a", r0 * s1 + x0, F32)
    cols = ir.Kernel("colsum", (s1,), (ir.Stage((s0,), (ir.Accumulate("t", "sum", load),)),
                                        ir.Stage((), (ir.Store("cols", x0, ir.Var("t", F32)),))), ("a", "cols"), (s0, s1))
    full = ir.Kernel("total", (), (ir.Stage((s0, s1), (ir.Accumulate("t", "max", ir.Load("a", r0 * s1 + ir.reduction_var(1), F32)),)),
                                   ir.Stage((), (ir.Store("total", sympy.Integer(0), ir.Var("t", F32)),))), ("a", "total"), (s0, s1))
    for shape in [(40, 9), (3, 70)]:
        a, out, total = torch.randn(shape), torch.empty(shape[1]), torch.empty(())
        fns = build([cols, full], bufs)
        assert fns["colsum"].layout.rows_contiguous
        fns["colsum"](a, out, *shape)
        fns["total"](a, total, *shape)
        torch.testing.assert_close(out, a.double().sum(0).float())
        torch.testing.assert_close(total, a.max())


def test_gather_iota_fill_and_random():
    # out[i, j] = table[idx[i], j] + j (iota), fill[i] = 3, rnd[i] = rand(seed, i)
    bufs = {"table": contiguous("table", (s1, s0)), "idx": contiguous("idx", (s0,), I64),
            "out": contiguous("out", (s0, s0)), "fill": contiguous("fill", (s0,)), "rnd": contiguous("rnd", (s0,)),
            "seed": contiguous("seed", (), I64)}
    t0 = ir.indirect_var(0)
    gather = ir.Load("table", t0 * s0 + x1, F32, indirect=((t0, ir.Load("idx", x0, I64)),))
    iota = ir.IndexValue(x1, F32)
    pointwise = pointwise_kernel("gather", [ir.Store("out", x0 * s0 + x1, ir.Op("add", (gather, iota), F32))],
                                 ["table", "idx", "out"], ranges=(s0, s0), sizes=(s0,))
    offsets = ir.Op("add", (ir.IndexValue(x0, I64), ir.Constant(7, I64)), I64)
    other = ir.Kernel("fill_rand", (s0,), (ir.Stage((), (
        ir.Store("fill", x0, ir.Constant(3.0, F32)),
        ir.Store("rnd", x0, ir.Op("rand", (ir.Load("seed", sympy.Integer(0), I64), offsets), F32)))),),
        ("fill", "rnd", "seed"), (s0,))
    n, vocab = 6, 11
    table, idx = torch.randn(vocab, n), torch.randint(0, vocab, (n,))
    out, fill, rnd, rnd2 = torch.empty(n, n), torch.empty(n), torch.empty(n), torch.empty(n)
    fns = build([pointwise, other], bufs)
    fns["gather"](table, idx, out, n)
    torch.testing.assert_close(out, table[idx] + torch.arange(n, dtype=F32))
    seed = torch.tensor(1234)
    fns["fill_rand"](fill, rnd, seed, n)
    fns["fill_rand"](fill, rnd2, seed, n)
    assert torch.equal(fill, torch.full((n,), 3.0))
    assert torch.equal(rnd, rnd2) and ((rnd >= 0) & (rnd < 1)).all() and rnd.unique().numel() == n


def test_index_values_and_stores_over_size_one_dims():
    # out[i, 0, j] = i * 10 + j over ranges (s0, 1, s1): the size-1 dim's variable is always 0.
    bufs = {"out": contiguous("out", (s0, 1, s1), I64)}
    x2 = ir.loop_var(2)
    value = ir.IndexValue(x0 * 10 + x1 * 100 + x2, I64)
    kernel = pointwise_kernel("iota3", [ir.Store("out", x0 * s1 + x1 * s1 + x2, value)], ["out"],
                              ranges=(s0, 1, s1), sizes=(s0, s1))
    out = torch.empty(4, 1, 5, dtype=I64)
    run(kernel, bufs, [out], (4, 5))
    assert torch.equal(out, (torch.arange(4)[:, None, None] * 10 + torch.arange(5)).to(I64))


def test_pow_by_constant_exponents():
    n = 50
    bufs = {"a": contiguous("a", (n,))}
    exponents = [2.0, 3.0, 0.5, -1.0, -0.5, -2.0, 1.7, 1.0, 6.0, 5.0]
    stores = []
    for k, c in enumerate(exponents):
        bufs[f"o{k}"] = contiguous(f"o{k}", (n,))
        stores.append(ir.Store(f"o{k}", x0, ir.Op("pow", (ir.Load("a", x0, F32), ir.Constant(c, F32)), F32)))
    kernel = pointwise_kernel("pow_const", stores, list(bufs), ranges=(n,), sizes=())
    a = torch.rand(n) * 3 + 0.1
    a[::3] *= -1                      # negative bases: real for integer exponents, NaN otherwise
    outs = [torch.empty(n) for _ in exponents]
    run(kernel, bufs, [a, *outs], ())
    for c, out in zip(exponents, outs):
        torch.testing.assert_close(out, torch.pow(a.double(), c).float(), rtol=2e-5, atol=1e-5, equal_nan=True,
                                   msg=f"pow {c}")


def test_logic_between_a_scalar_load_and_a_block():
    # where((i != j[0]) & (a[0] > 0), a[0], 0) mixes one-element loads with a block of indices.
    bufs = {"a": contiguous("a", (1,)), "j": contiguous("j", (1,), I64), "o": contiguous("o", (s0,))}
    a0 = ir.Load("a", sympy.Integer(0), F32)
    cond = ir.Op("bitwise_and", (ir.Op("ne", (ir.IndexValue(x0, I64), ir.Load("j", sympy.Integer(0), I64)), torch.bool),
                                 ir.Op("gt", (a0, ir.Constant(0.0, F32)), torch.bool)), torch.bool)
    either = ir.Op("logical_or", (cond, ir.Op("lt", (a0, ir.Constant(-1.0, F32)), torch.bool)), torch.bool)
    kernel = pointwise_kernel("logic", [ir.Store("o", x0, ir.Op("where", (either, a0, ir.Constant(0.0, F32)), F32))],
                              ["a", "j", "o"], ranges=(s0,), sizes=(s0,))
    out = torch.empty(5)
    run(kernel, bufs, [torch.tensor([2.0]), torch.tensor([3]), out], (5,))
    torch.testing.assert_close(out, torch.tensor([2.0, 2.0, 2.0, 0.0, 2.0]))


def test_an_outer_reduction_with_a_small_operand_along_r_is_still_wide_in_x():
    """RMSNorm's weight gradient: every large load steps along x; only the per-row statistic runs
    along r. The launch must still be wide in x (the vote in `_rows_contiguous`)."""
    from kiln.codegen.triton.printer import layout_of
    big = ir.Load("a", r0 * s1 + x0, F32)
    stat = ir.Load("b", r0, F32)
    body = ir.Op("mul", (ir.Op("mul", (big, ir.Load("c", r0 * s1 + x0, F32)), F32), stat), F32)
    kernel = ir.Kernel("wgrad", (s1,), (ir.Stage((s0,), (ir.Accumulate("t", "sum", body),)),
                                         ir.Stage((), (ir.Store("out", x0, ir.Var("t", F32)),))), ("a", "b", "c", "out"), (s0, s1))
    assert layout_of(kernel).rows_contiguous
    bufs = {"a": contiguous("a", (s0, s1)), "b": contiguous("b", (s0,)), "c": contiguous("c", (s0, s1)),
            "out": contiguous("out", (s1,))}
    a, b, c, out = torch.randn(37, 50), torch.randn(37), torch.randn(37, 50), torch.empty(50)
    build([kernel], bufs)["wgrad"](a, b, c, out, 37, 50)
    torch.testing.assert_close(out, (a.double() * c.double() * b.double()[:, None]).sum(0).float(), rtol=1e-5, atol=1e-5)


def test_an_outer_reduction_whose_row_statistics_appear_in_every_term_is_still_wide_in_x():
    """convnext's layer-norm weight gradient over (image, channel) outputs: the activations step along
    the channels (x); the per-row mean and rstd run along r in every term, more loads than the
    activations, but are the same for every channel of a tile, so they have no vote in
    `_rows_contiguous` (they outvoted the activations: one program per output, reading at a stride
    of the channel count)."""
    from kiln.codegen.triton.printer import layout_of
    n, c, hw = 3, 5, 7
    act = ir.Load("a", x0 * hw * c + r0 * c + x1, F32)
    mean, rstd = ir.Load("m", x0 * hw + r0, F32), ir.Load("s", x0 * hw + r0, F32)
    xhat = ir.Op("mul", (ir.Op("sub", (ir.Load("x", x0 * hw * c + r0 * c + x1, F32), mean), F32), rstd), F32)
    body = ir.Op("mul", (ir.Op("mul", (act, xhat), F32), ir.Op("add", (mean, rstd), F32)), F32)
    kernel = ir.Kernel("lnw", (n, c), (ir.Stage((hw,), (ir.Accumulate("t", "sum", body),)),
                                       ir.Stage((), (ir.Store("out", x0 * c + x1, ir.Var("t", F32)),))),
                       ("a", "m", "s", "x", "out"), ())
    assert layout_of(kernel).rows_contiguous
    bufs = {"a": contiguous("a", (n, hw, c)), "m": contiguous("m", (n, hw)), "s": contiguous("s", (n, hw)),
            "x": contiguous("x", (n, hw, c)), "out": contiguous("out", (n, c))}
    a, m, s, x, out = torch.randn(n, hw, c), torch.randn(n, hw), torch.rand(n, hw), torch.randn(n, hw, c), torch.empty(n, c)
    build([kernel], bufs)["lnw"](a, m, s, x, out)
    d = [t.double() for t in (a, m, s, x)]
    want = (d[0] * (d[3] - d[1][..., None]) * d[2][..., None] * (d[1] + d[2])[..., None]).sum(1)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=1e-5)
