"""The printer's CUDA text, compiled for an H100/H200 (sm_90) without a GPU (`offline`).

The interpreter runs the interpreter flavour of the few libdevice helpers; this compiles the GPU
flavour of every scalar op, reduction and scan, and checks what copy bandwidth depends on: the
bandwidth programs (a gelu chain, softmax, layer_norm over 8192 columns) are one kernel each, use
128-bit loads and stores, and keep the persistent row in registers without spilling.
"""

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

from kiln.codegen import ir
from kiln.codegen.triton import ops
from kiln.codegen.triton.heuristics import LaunchConfig
from kiln.codegen.triton.offline import compile_for_gpu

F32, I64 = torch.float32, torch.int64
s0, s1 = ir.size_var("s0"), ir.size_var("s1")
x0, r0 = ir.loop_var(0), ir.reduction_var(0)


def cuda(name, sizes, dtype=F32):
    return ir.Buffer(name, tuple(sizes), ir.contiguous_strides(sizes), dtype, device="cuda")


def test_division_and_root_round_as_eagers_cuda_kernels():
    # [Note: eager's CUDA math]: Triton's own `/` and `tl.sqrt` are approximations
    bufs = {"a": cuda("a", (s0,)), "b": cuda("b", (s0,)), "o": cuda("o", (s0,))}
    a, b = ir.Load("a", x0, F32), ir.Load("b", x0, F32)
    expr = ir.Op("add", (ir.Op("truediv", (a, b), F32), ir.Op("sqrt", (a,), F32)), F32)
    kernel = ir.Kernel("div_sqrt", (s0,), (ir.Stage((), (ir.Store("o", x0, expr),)),), tuple(bufs), (s0,))
    ptx = compile_for_gpu(kernel, bufs, [4096]).ptx
    assert "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx
    assert "div.full.f32" not in ptx and "sqrt.approx" not in ptx


@pytest.mark.parametrize("F", [F32, torch.float64])   # float32 and float64 print differently (div_rn, sqrt_rn)
def test_every_scalar_op_compiles_for_sm90(F):
    bufs = {"a": cuda("a", (s0,), F), "b": cuda("b", (s0,), F), "i": cuda("i", (s0,), I64), "j": cuda("j", (s0,), I64)}
    a, b = ir.Load("a", x0, F), ir.Load("b", x0, F)
    i, j = ir.Load("i", x0, I64), ir.Load("j", x0, I64)
    stores = []
    for name, info in sorted(ir.SCALAR_OPS.items()):
        if name not in ops.OPS:
            continue
        if name in ("rand", "randn") and F == F32:
            expr = ir.Op(name, (i, j), F32)
        elif name in ("bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"):
            expr = ir.Op(name, (i, j)[:info.arity], I64)
        elif name == "where":
            expr = ir.Op(name, (ir.Op("lt", (a, b), torch.bool), a, b), F32)
        elif name in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                      "isnan", "isinf", "isfinite", "signbit", "logical_not"):
            expr = ir.Op("to_dtype", (ir.Op(name, (a, b)[:info.arity], torch.bool),), F)
        elif name == "bitcast":
            expr = ir.Op(name, (a,), torch.int32 if F == F32 else I64)
            expr = ir.Op("to_dtype", (expr,), F)
        elif name in ("rand", "randn"):
            continue
        else:
            expr = ir.Op(name, (a, b)[:info.arity], F)
        out = f"o_{name}"
        bufs[out] = cuda(out, (s0,), F)
        stores.append(ir.Store(out, x0, expr))
    for name in ("floordiv", "remainder", "fmod"):        # integer flavours
        bufs[f"oi_{name}"] = cuda(f"oi_{name}", (s0,), I64)
        stores.append(ir.Store(f"oi_{name}", x0, ir.Op(name, (i, j), I64)))
    kernel = ir.Kernel("every_op", (s0,), (ir.Stage((), tuple(stores)),), tuple(bufs), (s0,))
    build = compile_for_gpu(kernel, bufs, [4096])
    assert build.registers is not None
    if F == F32:   # ~80 float64 results in one kernel spill some; float32 ones must not
        assert build.spill_bytes == 0


@pytest.mark.parametrize("config", [None, LaunchConfig(XBLOCK=1, RBLOCK=1024, num_warps=8, persistent=False)],
                         ids=["persistent", "looped"])
def test_reductions_and_scans_compile_for_sm90(config):
    reductions = ["sum", "max", "min", "prod", "any", "all", "argmax", "argmin", "welford_mean", "welford_m2"]
    out_dtype = {"any": torch.bool, "all": torch.bool, "argmax": I64, "argmin": I64}
    bufs = {"a": cuda("a", (s0, s1)), "scan": cuda("scan", (s0, s1))}
    load = ir.Load("a", x0 * s1 + r0, F32)
    accs, stores = [], []
    for op in reductions:
        bufs[f"o_{op}"] = cuda(f"o_{op}", (s0,), out_dtype.get(op, F32))
        expr = ir.Op("gt", (load, ir.Constant(0.0, F32)), torch.bool) if op in ("any", "all") else load
        accs.append(ir.Accumulate(f"v_{op}", op, expr))
        stores.append(ir.Store(f"o_{op}", x0, ir.Var(f"v_{op}", out_dtype.get(op, F32))))
    scan = ir.Stage((s1,), (ir.ScanAccumulate("c", "logcumsumexp", load), ir.ScanAccumulate("d", "cummax", load),
                            ir.Store("scan", x0 * s1 + r0, ir.Op("add", (ir.Var("c", F32), ir.Var("d", F32)), F32))))
    kernel = ir.Kernel("reduce_scan", (s0,), (ir.Stage((s1,), tuple(accs)), ir.Stage((), tuple(stores)), scan),
                       tuple(bufs), (s0, s1))
    build = compile_for_gpu(kernel, bufs, [64, 4096], config=config)
    assert build.function.endswith("_looped") == (config is not None)


def test_bandwidth_programs_are_one_vectorized_kernel_each_without_spills():
    from kiln.bench.bandwidth_offline import bandwidth_kernels
    for name, (kernels, buffers) in bandwidth_kernels(8192).items():
        assert len(kernels) == 1, f"{name}: {len(kernels)} kernels"
        build = compile_for_gpu(kernels[0], buffers, [8192] * len(kernels[0].size_args))
        assert build.vector_loads and build.vector_stores and not build.scalar_loads, \
            f"{name}: {sorted(build.memory_ops())}"
        assert build.spill_bytes == 0, f"{name}: spills {build.spill_bytes} bytes at {build.config.describe()}"
        if name != "gelu chain":
            assert build.config.persistent and build.config.RBLOCK == 8192


def test_bf16_rounding_of_a_product_survives_into_the_next_add():
    # eager rounds a * b to bfloat16 before adding; written as `.to()`, LLVM contracted the pair into
    # a bfloat16 fma (GPT-NeoX's rotary kernel then differed from eager in 3.3% of elements)
    BF16 = torch.bfloat16
    bufs = {n: cuda(n, (s0,), BF16) for n in ("a", "b", "c", "d", "o")}
    a, b, c, d = (ir.Op("to_dtype", (ir.Load(n, x0, BF16),), F32) for n in "abcd")

    def rounded(e):
        return ir.Op("to_dtype", (ir.Op("to_dtype", (e,), BF16),), F32)
    expr = ir.Op("add", (rounded(ir.Op("mul", (a, b), F32)), rounded(ir.Op("mul", (c, d), F32))), F32)
    store = ir.Store("o", x0, ir.Op("to_dtype", (expr,), BF16))
    kernel = ir.Kernel("rot", (s0,), (ir.Stage((), (store,)),), tuple(bufs), (s0,))
    ptx = compile_for_gpu(kernel, bufs, [4096]).ptx
    assert "fma.rn.bf16" not in ptx and "mul.bf16" not in ptx and "mul.rn.bf16" not in ptx
    assert ptx.count("cvt.rn.bf16.f32") >= 3


def test_symbolic_sizes_are_unspecialized_but_a_multiple_of_16_keeps_vector_loads():
    # [Note: symbolic sizes are not specialized]: one binary serves every s0, and xnumel = 768 * s0,
    # a multiple of 16 for every s0, stays specialized so the masked loads stay 128-bit wide
    from kiln.codegen.triton.printer import print_kernel
    from kiln.codegen.triton.source_cache import load_module
    n = 768 * s0
    bufs = {"a": cuda("a", (n,)), "o": cuda("o", (n,)), "b": cuda("b", (s0,)), "p": cuda("p", (s0,))}
    wide = ir.Kernel("wide", (n,), (ir.Stage((), (ir.Store("o", x0, ir.Op("exp", (ir.Load("a", x0, F32),), F32)),)),),
                     ("a", "o"), (s0,))
    narrow = ir.Kernel("narrow", (s0,), (ir.Stage((), (ir.Store("p", x0, ir.Op("exp", (ir.Load("b", x0, F32),), F32)),)),),
                       ("b", "p"), (s0,))
    for kernel, loose in ((wide, {"s0"}), (narrow, {"s0", "xnumel"})):
        module = load_module(print_kernel(kernel, bufs), interpret=False)
        fn = next(getattr(module, name) for name in dir(module) if name.startswith("kiln_"))
        assert {p.name for p in fn.params if p.do_not_specialize} == loose
    build = compile_for_gpu(wide, bufs, [4096])
    assert build.vector_loads and build.vector_stores and not build.scalar_loads, sorted(build.memory_ops())
