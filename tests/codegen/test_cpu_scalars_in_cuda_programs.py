"""[Note: a CUDA program holds everything on its device] (kiln/codegen/lowering.py): eager lets a
CUDA op read a 0-dim CPU tensor; kiln's CUDA program moves it to the device at entry, computes CPU
factories there, and returns on the CPU what eager returns there. The lowering is checked here on
fake CUDA tensors (no GPU needed); the GPU tests run the programs and compare with eager."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.codegen.host import plan_host
from kiln.codegen.lowering import lower_graph, program_device
from kiln.codegen.scheduler import schedule

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def scaled(x, length):
    # a CPU scalar read by CUDA ops (a cache's length), a CPU factory (DeBERTa's sqrt(d)), and
    # a CPU result (the length advanced) that eager returns on the CPU
    scale = torch.sqrt(torch.full((), float(x.shape[-1])))
    return x * length / scale, length + 1


def test_a_cuda_program_moves_cpu_scalars_in_and_cpu_results_out():
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda")
    length = torch.tensor(3)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [x, mode.from_tensor(length)]
        gm = make_fx(scaled)(*fakes)
        assert program_device(fakes) == "cuda"
        graph, constants = lower_graph(gm, fakes)
    assert {b.device for b in graph.buffers} == {"cuda"}, [str(b) for b in graph.buffers]
    assert graph.moved_inputs == (graph.inputs[1],)
    assert graph.cpu_outputs == (1,)
    assert all(c.device.type == "cuda" for c in constants.values())
    source = plan_host(graph, schedule(graph))[0].source
    assert f"{graph.inputs[1]} = {graph.inputs[1]}.to('cuda')" in source, source
    assert ".cpu()" in source.splitlines()[-1], source


def test_a_cpu_program_moves_nothing():
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(torch.randn(4, 8)), mode.from_tensor(torch.tensor(3))]
        gm = make_fx(scaled)(*fakes)
        graph, _ = lower_graph(gm, fakes)
    assert {b.device for b in graph.buffers} == {"cpu"}
    assert graph.moved_inputs == () and graph.cpu_outputs == ()


@cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_cpu_scalars_in_a_cuda_program_equal_eager(mode):
    kiln.reset()
    compiled = kiln.compile(scaled, mode=mode)
    for step in range(3):
        x, length = torch.randn(4, 8, device="cuda"), torch.tensor(step + 2)
        got, expected = compiled(x, length), scaled(x, length)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1].device.type == "cpu" and torch.equal(got[1], expected[1])


@cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_length_moved_to_the_device_inside_the_graph_equals_eager(mode):
    # transformers' StaticLayer: the length is a CPU scalar until the first (compiled) call moves
    # it onto the cache's device and advances it there in place
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.length = torch.tensor(0)
            self.cache = torch.zeros(1, 16, 4, device="cuda")

        def forward(self, new):
            self.length = self.length.to(new.device)
            position = torch.arange(new.shape[1], device=new.device) + self.length
            self.length.add_(new.shape[1])
            self.cache.index_copy_(1, position, new)
            return self.cache.sum(1)

    eager, layer = Layer(), Layer()
    kiln.reset()
    compiled = kiln.compile(layer, mode=mode)
    for width in (3, 1, 1, 1):
        new = torch.randn(1, width, 4, device="cuda")
        torch.testing.assert_close(compiled(new), eager(new))
    torch.testing.assert_close(layer.cache, eager.cache)
    assert layer.length.device.type == "cuda" and torch.equal(layer.length.cpu(), eager.length.cpu())
