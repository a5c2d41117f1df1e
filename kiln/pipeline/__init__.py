"""The pipeline composed: a captured torch-level graph through aot, prims, codegen and the cache.

    capture (kiln.capture) -> aot (kiln.aot) -> prims (kiln.prims) -> codegen (kiln.codegen) -> runtime (kiln.runtime)

This package sits above the stages and is the one place that knows their order; each stage imports
only the stages below it (`tests/test_import_layers.py` holds the table). `compile_graph_module(gm,
example_inputs, options)` is what `kiln.backends` calls for every captured graph. It traces forward
and backward with `kiln.aot.aot_compile`, decomposing every ATen op into prims
(`kiln.prims.decompositions_for(BACKEND_OPS)`), and compiles each resulting prim graph with
`kiln.codegen.compile.compile_prim_graph`: C++ kernels for CPU tensors, Triton kernels for CUDA
tensors. `warm_start.py` keeps aot's result for a captured graph in the runtime's cache, so a second
process skips aot too ([Note: warm start of a captured graph]).
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import torch

from kiln import log
from kiln.codegen import program_cache
from kiln.codegen.compile import PendingProgram, compile_prim_graph
from kiln.config import Options
from kiln.pipeline import warm_start

def _register_kiln_ops() -> None:
    """kiln's own ops, defined where the stages need them: aot's random ops, the prims."""
    import kiln.aot.rng
    import kiln.prims  # noqa: F401


program_cache.KILN_OP_LIBRARIES.append(_register_kiln_ops)

# ATen ops this backend lowers itself rather than through their decomposition: none yet; every
# ATen op reaches codegen as prims (or as an extern prim: mm, convolution, attention, sort, ...).
BACKEND_OPS: frozenset = frozenset()


def _compiler(options: Options):
    def compile_one(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        on_cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
        graphed = options.cudagraphs and on_cuda     # mode="reduce-overhead": [Note: CUDA graphs]
        chosen = {}
        if options.triton_interpret and not on_cuda:   # [Note: the Triton interpreter switch]
            from kiln.codegen.triton.interpret import printer_for
            chosen["printer"] = printer_for(options, on_cuda)
        if options.max_autotune:           # [Note: matmul templates]
            chosen["max_autotune"] = True
        program = compile_prim_graph(gm, example_inputs, boxed=gm.meta.get("kiln_boxed", False) and not graphed,
                                     wait=False, **chosen)
        if isinstance(program, PendingProgram):     # finished by `_compile` ([Note: parallel builds])
            return _Unwrapped(program, lambda call: _wrap(options, call, gm.meta, on_cuda))
        return _wrap(options, program, gm.meta, on_cuda)
    return compile_one


class _Unwrapped:
    """A pending program and the wrapping it gets once finished."""

    def __init__(self, pending: PendingProgram, wrap):
        self.pending, self.wrap = pending, wrap
        self.output_strides = pending.output_strides

    def finish(self):
        return self.wrap(self.pending.finish())

    def __call__(self, *args):
        return self.finish()(*args)


def _finished(program):
    return program.finish() if isinstance(program, _Unwrapped) else program


def _wrap(options: Options, program, meta: dict, on_cuda: bool):
    """A compiled program as the runtime calls it: in CUDA graphs under mode="reduce-overhead"."""
    if options.cudagraphs and on_cuda:                 # [Note: CUDA graphs]
        from kiln.runtime.cudagraphs import graphed
        return graphed(program, meta)
    return program


def compile_graph_module(gm: torch.fx.GraphModule, example_inputs: list, options: Options = Options()):
    """Compile a captured torch-level graph; returns a callable with the graph's signature.

    [Note: one program per symbolic graph] When capture made some dims symbolic (dynamic=True, or
    a dim that changed between compilations), the placeholders' `example_value`s are its fake
    tensors with SymInt sizes. The graph is traced by aot on those fakes, so every size stays an
    expression over the symbols down to the loop IR; kernels take the symbols as int arguments and
    the host program reads them from the inputs' shapes at each call: one program serves every size
    the capture guards accept. The guards the trace adds (a size the backend had to specialize on)
    join capture's ShapeEnv, whose guard function is built after this returns.

    A graph without symbols is compiled for its inputs' sizes and strides; capture reuses it only
    for those, but a program per input layout keeps a call from ever running kernels built for
    other sizes.
    """
    symbolic = symbolic_examples(gm)
    if symbolic is not None:
        program = _compile(gm, symbolic, options)
        program.programs = {"symbolic": program}
        return program
    programs = {}
    if not any(_is_foreign_symbolic(x) for x in example_inputs):
        programs[_layout_of(example_inputs)] = _compile(gm, example_inputs, options)
    # else torch.compile with dynamic=True handed its own SymInts: compile at the first call, per
    # layout of the real arguments (kiln's tracer runs on kiln's symbols only)

    def run(*args):
        key = _layout_of(args)
        program = programs.get(key)
        if program is None:
            program = programs[key] = _compile(gm, list(args), options)
        return program(*args)

    run.programs = programs
    return run


def symbolic_examples(gm: torch.fx.GraphModule) -> list | None:
    """The placeholders' example values (capture's fakes and SymInts) when some size is a symbol."""
    examples = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if any(_has_symbols(x) for x in examples):
        return examples
    return None


def _has_symbols(x) -> bool:
    """Whether x has a size that is a symbol of kiln's capture (torch.compile's dynamo hands its own
    fakes, which kiln's tracer does not run on: those graphs take the per-layout path)."""
    from kiln.symbolic import SymNode
    if isinstance(x, torch.SymInt):
        return isinstance(x.node, SymNode) and not x.node.expr.is_number
    if isinstance(x, torch.Tensor):
        return any(_has_symbols(d) for d in (*x.shape, *x.stride()))
    return False


def _is_foreign_symbolic(x) -> bool:
    """A SymInt, or a tensor with a symbolic size, that is not kiln's (torch.compile's dynamo)."""
    if isinstance(x, torch.SymInt):
        return True
    return isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride()))


def _layout_of(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args)


def aot_to_prims(gm: torch.fx.GraphModule, example_inputs: list, options: Options, compiler):
    """aot as this backend runs it: every ATen op decomposed into prims, the joint graph cut by the
    min-cut partition; `compiler(prim_gm, example_inputs)` compiles each half (codegen's, or FX
    Python for the aot_eager_decomp_partition backend)."""
    with log.stage("import"):          # not needed by a warm start: the decomposition tables are built here
        from kiln.aot import aot_compile, min_cut_partition
        from kiln.prims import EXTERN_OPS, RECOMPUTABLE_MOVEMENT, decompositions_for
        decompositions = decompositions_for(set(BACKEND_OPS), options.numerics)
    return aot_compile(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler,
                       decompositions=decompositions,
                       partition=functools.partial(min_cut_partition, recomputable_ops=RECOMPUTABLE_MOVEMENT,
                                                   materializing_ops=EXTERN_OPS),
                       numerics=options.numerics)


def _compile(gm: torch.fx.GraphModule, example_inputs: list, options: Options):
    """aot and the code generator on one graph, or their result from the disk cache
    ([Note: warm start of a captured graph])."""
    with log.stage("cache key"):
        compiled_for = (options.cudagraphs, options.numerics, options.triton_interpret, sorted(map(str, BACKEND_OPS)))
        if options.max_autotune:           # a program with matmul templates is another program
            compiled_for += ("max-autotune",)
        key = warm_start.key(gm, example_inputs, repr(compiled_for))
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)] + list(gm.parameters()) + list(gm.buffers())
    on_cuda = any(t.device.type == "cuda" for t in tensors)
    if key is not None:
        with log.stage("cache load"):
            runtime = warm_start.load_runtime(key, gm, lambda program, meta: _wrap(options, program, meta, on_cuda))
        if runtime is not None:
            return runtime
    if on_cuda:                        # Triton's compile workers start while aot and lowering run
        from kiln.codegen.triton import compile_pool
        compile_pool.prestart()
    runtime = aot_to_prims(gm, example_inputs, options, _compiler(options))
    if hasattr(runtime, "fw"):         # an AotRuntime: link both halves now, errors included
        runtime.fw = _finished(runtime.fw)
        runtime.bw = _finished(runtime.bw)
    else:
        runtime = _finished(runtime)
    if key is not None:
        warm_start.store_runtime(key, runtime)
    return runtime
