"""The Triton interpreter switch ([Note: the Triton interpreter switch]): `kiln.compile` with
options={"triton_interpret": True} (or KILN_TRITON_INTERPRET=1) runs CPU tensors through the
Triton printer under Triton's interpreter, forward and backward, compared with eager here.

Each test also checks that Triton kernels were built for it, so a switch that silently fell back
to C++ (or to eager) fails."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen.triton import launcher
from kiln.errors import InvalidOption

ON = {"triton_interpret": True}


def _triton_kernels() -> set:
    return {id(k) for k in launcher.BUILT}


def compare(fn, *inputs, grad=True, rtol=1.3e-6, atol=1e-5, dynamic=None, calls=None):
    """fn through the switch vs eager, forward and (for float inputs) gradients; returns the
    number of Triton kernels built."""
    kiln.reset()
    before = _triton_kernels()
    compiled = kiln.compile(fn, options=ON, dynamic=dynamic)
    for args in calls or [inputs]:
        ours = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in args]
        theirs = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in args]
        got, want = compiled(*ours), fn(*theirs)
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        if grad and want.requires_grad:
            tangent = torch.randn(want.shape, generator=torch.Generator().manual_seed(0)).to(want.dtype)
            got.backward(tangent)
            want.backward(tangent)
            for a, b in zip(ours, theirs):
                if b.grad is not None:
                    torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol)
    built = len(_triton_kernels() - before)
    assert built, "no Triton kernel was built: the switch compared eager (or C++) with eager"
    return built


def test_pointwise_chain_forward_and_backward():
    compare(lambda x, y: F.gelu(torch.tanh(x) * y + 1) / (y.abs() + 1), torch.randn(7, 33), torch.randn(33))


def test_reductions_of_odd_sizes():
    compare(lambda x: torch.softmax(x, -1) * x.amax(0, keepdim=True) + x.var(1, keepdim=True), torch.randn(13, 1027))


def test_split_reduction_matches_eager():
    """2048 x 130 summed over its first dim: few outputs of long rows, split in two passes
    ([Note: split reductions]), which C++ never does."""
    compare(lambda x: (x * x).sum(0) + x.amax(0), torch.randn(2048, 130), rtol=1e-5, atol=1e-4)


def test_views_and_non_contiguous_inputs():
    x = torch.randn(6, 10, 5).transpose(0, 2)[::2]
    compare(lambda x: torch.cat([x.flip(1), x.permute(0, 2, 1).reshape(3, 6, 10).transpose(1, 2)], 0).sin(), x)


def test_channels_last_convolution_training():
    x = torch.randn(2, 3, 9, 7).to(memory_format=torch.channels_last)
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    compare(lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1)).mean((2, 3)), x, w, b, rtol=1e-5, atol=1e-5)


def test_module_training_steps_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(11, 19), torch.nn.LayerNorm(19), torch.nn.GELU(), torch.nn.Linear(19, 3))
    twin = torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(model)])
    kiln.reset()
    before = _triton_kernels()
    compiled = kiln.compile(model, options=ON)
    opt, twin_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(5, 11, generator=torch.Generator().manual_seed(step))
        for m, o in ((compiled, opt), (twin, twin_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert _triton_kernels() - before


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_kernels_compute_in_float32_and_round_on_store(dtype):
    x, y = torch.randn(9, 70).to(dtype), torch.randn(70).to(dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    compare(lambda x, y: (torch.sigmoid(x) * y).sum(-1) + x.float().mean(-1).to(dtype), x, y, **tol)


def test_autocast_region():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.relu(x @ w) + 1
        return h.float().softmax(-1)
    compare(f, torch.randn(6, 17), torch.randn(17, 9), rtol=2e-2, atol=2e-2)


def test_dynamic_sizes_change_between_calls():
    calls = [(torch.randn(5, 7),), (torch.randn(9, 7),), (torch.randn(130, 7),)]
    compare(lambda x: torch.log_softmax(x * 2, 0), *calls[0], dynamic=True, calls=calls)


def test_environment_variable_turns_it_on_and_bad_values_are_refused():
    code = ("import torch, kiln\nfrom kiln.codegen.triton import launcher\n"
            "f = kiln.compile(lambda x: x.sin() + 1)\nx = torch.randn(5)\n"
            "assert torch.allclose(f(x), x.sin() + 1)\nprint(len(launcher.BUILT))\n")
    import os
    env = {**os.environ, "KILN_TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and int(out.stdout.split()[-1]) > 0, out.stderr[-2000:]
    env["KILN_TRITON_INTERPRET"] = "yes"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "KILN_TRITON_INTERPRET='yes'" in out.stderr


def test_option_must_be_a_bool():
    with pytest.raises(InvalidOption, match="triton_interpret"):
        kiln.compile(lambda x: x, options={"triton_interpret": "yes"})


def test_atan2_and_copysign_at_signed_zeros_infinities_and_nan():
    """The interpreter's own atan2 and copysign (no libdevice) at their edges, constants included."""
    inf, nan = float("inf"), float("nan")
    v = torch.tensor([0., -0., 1., -1., 2.5, -3., inf, -inf, nan, 1e-30])
    a, b = v[:, None].expand(10, 10).contiguous(), v[None, :].expand(10, 10).contiguous()
    for fn in (torch.atan2, torch.copysign):
        kiln.reset()
        torch.testing.assert_close(kiln.compile(fn, options=ON)(a, b), fn(a, b), equal_nan=True, rtol=1e-5, atol=1e-6)
    zeros = lambda x: torch.atan2(x.new_zeros(2, 3), x.new_zeros(2, 3)) + torch.copysign(x.new_ones(2, 3), x.new_zeros(2, 3))
    compare(zeros, torch.randn(5, 6), grad=False)
