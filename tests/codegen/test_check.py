"""KILN_CHECK=kernels (kiln/codegen/check.py): every buffer a kernel writes is compared with the
graph run eagerly, and a wrong kernel is named."""
import torch

from kiln.codegen.compile import compile_prim_graph


def _graph():
    def f(x, w):
        a = torch.ops.aten.exp.default(x)
        b = torch.ops.aten.mm.default(a, w)           # an extern between two kernels
        c = torch.ops.aten.sum.dim_IntList(torch.ops.aten.mul.Tensor(b, b), [1])
        return (torch.ops.aten.add.Tensor(c, 1.0),)
    return torch.fx.symbolic_trace(f)


def test_a_correct_program_reports_nothing_and_equals_eager(monkeypatch):
    monkeypatch.setenv("KILN_CHECK", "kernels")
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    gm = _graph()
    call = compile_prim_graph(gm, [x, w])
    out = call(x, w)
    torch.testing.assert_close(out[0], gm(x, w)[0])
    assert call.mismatches == []


def test_a_wrong_kernel_is_named_first(monkeypatch, capsys):
    monkeypatch.setenv("KILN_CHECK", "kernels")
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    gm = _graph()
    call = compile_prim_graph(gm, [x, w])
    env = call.program.__globals__
    kernels = [name for name in env if name.startswith("kernel")]
    first = sorted(kernels, key=lambda k: call.program.host_source.index(f"    {k}("))[0]
    def probe_wrapper(kernel, buffer, value, probe=env["_probe"]):
        if kernel == first:          # as if the first kernel (exp) had written its output off by one
            value.add_(1.0)
        probe(kernel, buffer, value)
    env["_probe"] = probe_wrapper
    call(x, w)
    assert call.mismatches, "the planted error was not found"
    assert call.mismatches[0].kernel == first
    assert "differ from eager" in capsys.readouterr().err
