"""The kiln backend end to end (capture -> aot -> prims -> C++), against eager, forward and backward;
the warm start across processes; the generated host program and kernel source are printable."""
import os
import subprocess
import sys
import textwrap

import torch

import kiln


def _compare(fn, *inputs, backward=True, rtol=1e-4, atol=1e-5):
    kiln.reset()
    compiled = kiln.compile(fn, backend="kiln")
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    got = compiled(*leaves)
    ref_leaves = [(x.detach().double() if x.is_floating_point() else x).requires_grad_(x.requires_grad)
                  for x in inputs]
    ref = fn(*ref_leaves)
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol)
    if backward:
        got.sum().backward()
        ref.sum().backward()
        for a, b in zip(leaves, ref_leaves):
            if a.requires_grad:
                torch.testing.assert_close(a.grad.double(), b.grad, rtol=rtol, atol=atol)


def test_mlp_block_forward_backward():
    torch.manual_seed(0)
    w1, w2 = torch.randn(32, 16, requires_grad=True), torch.randn(8, 32, requires_grad=True)
    g = torch.randn(32, requires_grad=True)

    def block(x, w1, w2, g):
        h = torch.nn.functional.linear(x, w1)
        h = torch.nn.functional.layer_norm(h, (32,), g)
        h = torch.nn.functional.gelu(h)
        return torch.softmax(torch.nn.functional.linear(h, w2), -1)
    _compare(block, torch.randn(4, 16, requires_grad=True), w1, w2, g)


def test_reductions_scans_indexing():
    torch.manual_seed(0)

    def f(x, idx):
        a = x.cumsum(1) + x.amax(0, keepdim=True) - x.mean(1, keepdim=True)
        b = torch.nn.functional.embedding(idx, x)
        return a.sum() + b.var(0).sum() + x.argmax(1).float().sum() + torch.cat([x, x.flip(0)], 1).prod(1).sum()
    x = torch.randn(6, 5)
    idx = torch.tensor([[0, 5, 2], [1, 1, 3]])
    _compare(f, x, idx, backward=False)


def test_integer_and_bool_math():
    def f(a, b):
        return (a // 3 + a % 3 - (a > b).long() * 2 + torch.where(a < 0, a, b)) * 2
    a = torch.randint(-20, 20, (7, 3))
    b = torch.randint(-20, 20, (7, 3))
    kiln.reset()
    torch.testing.assert_close(kiln.compile(f, backend="kiln")(a, b), f(a, b))


def test_warm_start_in_a_second_process(tmp_path):
    script = textwrap.dedent("""
        import torch, kiln
        from kiln.codegen import compile as c
        calls = []
        orig = c.lower_graph
        c.lower_graph = lambda *a: (calls.append(1), orig(*a))[1]
        f = kiln.compile(lambda x: (x.sin() * 2).softmax(-1), backend="kiln")
        x = torch.arange(12.).reshape(3, 4)
        torch.testing.assert_close(f(x), (x.sin() * 2).softmax(-1))
        print("lowered", len(calls))
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "lowered 1" in runs[0].stdout
    assert "lowered 0" in runs[1].stdout   # the second process skipped lowering, codegen and g++


def test_warm_start_of_triton_kernels_in_a_second_process(tmp_path):
    # Triton kernels (here under the interpreter, on CPU tensors) come back from the cache as their
    # loop IR: the second process skips lowering and scheduling and gives the same results
    script = textwrap.dedent("""
        import torch
        from kiln.codegen import compile as c, triton as triton_printer
        calls = []
        orig = c.lower_graph
        c.lower_graph = lambda *a: (calls.append(1), orig(*a))[1]
        def f(x, w):
            a = torch.ops.aten.softmax.int(torch.ops.aten.mul.Tensor(x, 2.0), -1)
            return (torch.ops.aten.sum.dim_IntList(torch.ops.aten.mm.default(a, w), [0]),)
        gm = torch.fx.symbolic_trace(f)
        x, w = torch.arange(12.).reshape(3, 4) / 7, torch.ones(4, 2)
        call = c.compile_prim_graph(gm, [x, w], printer=triton_printer, use_cache=True)
        torch.testing.assert_close(call(x, w)[0], f(x, w)[0])
        print("lowered", len(calls))
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1", TRITON_INTERPRET="1")
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "lowered 1" in runs[0].stdout
    assert "lowered 0" in runs[1].stdout


def test_kernel_log_prints_source(capfd, monkeypatch):
    monkeypatch.setenv("KILN_LOG", "kernels")
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")   # a warm hit would skip codegen and print nothing
    kiln.reset()
    f = kiln.compile(lambda x: x.relu() + 1, backend="kiln")
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x.relu() + 1)
    err = capfd.readouterr().err
    assert 'extern "C" void kernel0' in err and "def call(" in err


def test_backward_with_retain_graph_runs_twice_and_frees_after():
    # the backward program frees saved values after their last use; with retain_graph=True autograd
    # must still hold them for the second backward, and refuse a third as eager does
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    model(x).sum().backward()
    want = model[0].weight.grad.clone()
    model.zero_grad()
    out = kiln.compile(model, backend="kiln")(x).sum()
    out.backward(retain_graph=True)
    torch.testing.assert_close(model[0].weight.grad, want)
    out.backward()
    torch.testing.assert_close(model[0].weight.grad, 2 * want)
    try:
        out.backward()
    except RuntimeError as e:
        assert "second time" in str(e)
    else:
        raise AssertionError("a third backward through freed saved values must fail as eager's does")
