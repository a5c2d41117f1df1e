"""Every zoo model under `torch.autocast("cpu", dtype=torch.bfloat16)`, inference and a training
step, through kiln's C++ kernels: results pass the benchmark's bf16 rule against eager under the
same autocast (allclose at the bf16 tolerance, else RMSE against a float64 run at most 3x eager's),
the casts, norms, activations and reductions between the library calls are C++ kernels over bf16
buffers, and only matmul, convolution and attention stay ATen's.
"""
import contextlib
import copy

import pytest
import torch

import kiln
from kiln.bench.accuracy import same, tolerance
from kiln.bench.suites import disable_dropout
from kiln.bench.zoo import ZOO, loss_of

# Ops left to ATen under autocast: the library kernels (mm, addmm, bmm, convolution and its
# backward, attention) and the accumulating scatters of embedding's and max pooling's backward,
# which C++ kernels leave to ATen in float32 too.
LIBRARY_EXTERNS = ("mm", "convolution", "scaled_dot_product", "index_put", "scatter_reduce")


@contextlib.contextmanager
def cpp_programs():
    """kiln's backend compiling every prim graph with the C++ printer; yields (programs, sources)."""
    import kiln.pipeline as backend
    from kiln.codegen import cpp

    programs, sources = [], []
    saved, print_module = backend.compile_prim_graph, cpp.print_module

    def compile_one(gm, example_inputs, **options):
        programs.append(saved(gm, example_inputs, use_cache=False, **options))
        return programs[-1]

    def recording(kernels, buffers):
        sources.append(print_module(kernels, buffers))
        return sources[-1]
    backend.compile_prim_graph, cpp.print_module = compile_one, recording
    try:
        yield programs, sources
    finally:
        backend.compile_prim_graph, cpp.print_module = saved, print_module


def _step(model, inputs, mode, autocast=True):
    """An inference call (no_grad) or a training step; what accuracy compares."""
    params = [p for p in model.parameters() if p.requires_grad]
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    if mode == "infer":
        with torch.no_grad(), cast:
            return [model(*inputs)]
    with cast:
        loss = loss_of(model(*inputs))
    loss.backward()
    return [loss.detach()] + [p.grad for p in params]


@pytest.mark.parametrize("mode", ["infer", "train"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_under_bf16_autocast_through_cpp_kernels(name, mode):
    model, inputs = ZOO[name].make("cpu")
    if mode == "train":
        model.train()
        disable_dropout(model)
    fp64 = copy.deepcopy(model).double()
    compiled_model = copy.deepcopy(model)
    kiln.reset()
    expected = _step(model, inputs, mode)
    with cpp_programs() as (programs, sources):
        got = _step(kiln.compile(compiled_model, backend="kiln"), inputs, mode)
    arbiter = _step(fp64, [x.double() if x.is_floating_point() else x for x in inputs], mode, autocast=False)

    verdict = same(expected, got, arbiter, tol=tolerance("zoo", mode, "bf16"))
    assert verdict.ok, f"{name} {mode}: {verdict.detail}"
    assert len(programs) == (1 if mode == "infer" else 2), f"{len(programs)} programs (graph breaks?)"
    assert any("uint16_t* __restrict__" in src for src in sources), "no C++ kernel touched a bf16 buffer"
    linked = [call.finish() if hasattr(call, "finish") else call for call in programs]   # [Note: parallel builds]
    externs = [str(v) for call in linked for k, v in call.__globals__.items() if k.startswith("_extern")]
    others = [op for op in externs if not any(lib in op for lib in LIBRARY_EXTERNS)]
    assert not others, f"{name} {mode}: ops left to ATen: {others}"
