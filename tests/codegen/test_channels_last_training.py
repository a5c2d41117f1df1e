"""Channels-last through a training step ([Note: saved values in the layout of their producer]).

The activations a convolution reads are what the forward saves for the backward; laid out NHWC by
the forward program, the backward is compiled for those strides, so its convolution gradients read
NHWC and write NHWC. Compared with eager on the CPU and, where there is one, on a GPU."""
import re

import pytest
import torch

import kiln
from kiln.aot import runtime as aot_runtime
from kiln.codegen import host


class Net(torch.nn.Module):
    """conv-bn-relu, a depthwise conv, a pointwise conv, pooling and a head: a small mobile CNN."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16),
                                      torch.nn.ReLU())
        self.pw = torch.nn.Conv2d(16, 32, 1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = self.pw(self.dw(self.stem(x)))
        return self.head(torch.relu(y).mean((2, 3)))


def _step(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _is_nhwc(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_saved_activations_are_channels_last_and_training_equals_eager(device, monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")   # compile afresh: the backward's examples are the point
    kiln.reset()
    torch.manual_seed(0)
    model = Net().to(device)
    reference = Net().to(device)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 16, 16, device=device)
    backward_examples, restrided = [], []
    in_saved_layouts = aot_runtime._in_saved_layouts
    monkeypatch.setattr(aot_runtime, "_in_saved_layouts",
                        lambda *a: backward_examples.append(in_saved_layouts(*a)) or backward_examples[-1])
    restride = host._restride
    monkeypatch.setattr(host, "_restride", lambda t, s: restrided.append((tuple(t.shape), s)) or restride(t, s))
    compiled = kiln.compile(model)
    for _ in range(2):
        got_loss, got_grads = _step(compiled, x)
        want_loss, want_grads = _step(reference, x)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-5)
        for got, want in zip(got_grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    (examples,) = backward_examples
    assert sum(_is_nhwc(t) for t in examples if isinstance(t, torch.Tensor)) >= 3, \
        [(tuple(t.shape), tuple(t.stride())) for t in examples if isinstance(t, torch.Tensor)]
    # what the plan expected of every convolution and its gradient is what the kernels returned
    activations = [r for r in restrided if len(r[0]) == 4 and r[0][0] == x.shape[0]]
    assert not activations, activations


def test_a_convolution_bias_added_by_a_fused_kernel_trains_equal_to_eager(monkeypatch):
    """[Note: convolution bias on CUDA], run on the CPU: the split the CUDA path makes, end to end."""
    from kiln.prims.decompositions import externs
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    monkeypatch.setattr(externs, "adds_bias_apart", lambda x: True)
    calls = []
    conv = externs.EXTERN_OF_ATEN[externs._CONVOLUTION]
    monkeypatch.setitem(externs.EXTERN_OF_ATEN, externs._CONVOLUTION,
                        lambda *a: calls.append(a[2]) or conv(*a))
    kiln.reset()
    torch.manual_seed(0)
    model, reference = Net(), Net()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 16, 16)
    got_loss, got_grads = _step(kiln.compile(model), x)
    want_loss, want_grads = _step(reference, x)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-5)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    assert calls and all(bias is None for bias in calls), calls    # every convolution ran without its bias


class Stem(torch.nn.Module):
    """resnet's stem and first block: conv-bn-relu, a 3x3 max pool (its window masks saved for the
    backward), a 1x1 conv-bn and the residual add."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.conv2, self.bn2 = torch.nn.Conv2d(16, 16, 1, bias=False), torch.nn.BatchNorm2d(16)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn1(self.conv1(x))))
        return torch.relu(self.bn2(self.conv2(y)) + y)


def test_the_backward_of_a_pooled_stem_stays_channels_last(monkeypatch):
    """Max pooling's gradient (a gather over its saved window masks) and batch norm's gradient write
    NHWC like the convolutions around them: masks saved NCHW made the pool's gradient follow them,
    and batch norm's reduction then read one operand NCHW and one NHWC (on the H200, resnet50's
    stem: one uncoalesced 4 ms kernel of a 41 ms step)."""
    from kiln import backends
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    kiln.reset()
    torch.manual_seed(0)
    model, reference = Stem(), Stem()
    reference.load_state_dict(model.state_dict())
    programs = []
    compiled = kiln.compile(model, backend=lambda gm, ex: programs.append(backends.kiln(gm, ex)) or programs[-1])
    x = torch.randn(2, 3, 32, 32)
    got_loss, got_grads = _step(compiled, x)
    want_loss, want_grads = _step(reference, x)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-5)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    (runtime,) = programs[0].programs.values()
    allocated = re.findall(r"_(?:keep|empty)\((?:\d+, )?\((2, 16, \d+, \d+), \), \(([\d, ]+), \)", runtime.bw.host_source)
    assert allocated, runtime.bw.host_source
    nchw = [(sizes, strides) for sizes, strides in allocated if strides.split(", ")[1] != "1"]
    assert not nchw, nchw
