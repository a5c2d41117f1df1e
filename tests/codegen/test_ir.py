"""The loop IR: values print, compare by value, and refuse ops outside the closed set."""
import pytest
import sympy
import torch

from kiln.codegen import ir


def test_buffer_index_and_print():
    b = ir.Buffer("buf0", (4, 8), ir.contiguous_strides((4, 8)), torch.float32)
    x0, x1 = ir.loop_var(0), ir.loop_var(1)
    assert sympy.expand(b.index((x0, x1)) - (8 * x0 + x1)) == 0
    assert str(b) == "buf0: float32[4, 8] strides=(8, 1) on cpu"


def test_exprs_compare_by_value_and_print():
    x0 = ir.loop_var(0)
    a = ir.Op("exp", (ir.Load("arg0", x0, torch.float32),), torch.float32)
    b = ir.Op("exp", (ir.Load("arg0", x0, torch.float32),), torch.float32)
    assert a == b and hash(a) == hash(b)
    assert str(ir.ComputedBuffer("buf1", ir.Pointwise((4,), a))) == "buf1 = pointwise[4]: exp(load(arg0, x0))"


def test_closed_op_set():
    with pytest.raises(ValueError, match="unknown scalar op"):
        ir.Op("frobnicate", (ir.Constant(1.0, torch.float32),), torch.float32)
    with pytest.raises(ValueError, match="takes 2 arguments"):
        ir.Op("add", (ir.Constant(1.0, torch.float32),), torch.float32)
    with pytest.raises(ValueError, match="unknown reduction"):
        ir.Reduction((4,), (8,), "median", ir.Constant(1.0, torch.float32))


def test_kernel_prints_stages():
    x0, r0 = ir.loop_var(0), ir.reduction_var(0)
    k = ir.Kernel("k", (4,), (ir.Stage((8,), (ir.Accumulate("acc", "max", ir.Load("a", 8 * x0 + r0, torch.float32)),)),
                              ir.Stage((), (ir.Store("out", x0, ir.Var("acc", torch.float32)),))), ("a", "out"))
    text = str(k)
    assert "for r in [8]:" in text and "acc <- max(load(a, r0 + 8*x0))" in text and "store(out, x0, acc)" in text
