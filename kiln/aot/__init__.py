"""Ahead-of-time autograd (AOTAutograd's role): torch-level FX graph -> ATen forward and backward graphs.

Public API:

    aot_compile(gm: torch.fx.GraphModule, example_inputs: list, *, fw_compiler, bw_compiler,
                decompositions: Mapping[OpOverload, Callable] | None = None,
                partition=min_cut_partition, numerics="fast") -> callable
        Trace, functionalize, partition, then fw_compiler(fw_gm, example_inputs) -> callable and
        bw_compiler(bw_gm, example_inputs) -> callable. The graphs hold ATen ops, or only the ops
        missing from `decompositions` when a table is given (the backward is traced by autograd on
        ATen ops first, then decomposed below autograd). Returns a callable with gm's signature;
        parameters and buffers of gm are read from gm at each call and receive their gradients.
        A few torch functions trace through kiln's own rules (`F.linear` over rows, attention's
        kernel choice on symbolic CUDA sizes: kiln/aot/rules.py); `numerics="eager"` keeps only
        the rules that compute as eager does.

The named passes, each testable alone:

    trace_joint(gm, example_inputs, *, decompositions=None, with_backward=None, numerics="fast") -> JointGraph
        one ATen graph: (*user inputs, *params, *buffers, [rng_seed], *tangents) ->
        (*user outputs, *new values of mutated inputs, *grads of inputs requiring grad)
    functionalize(joint: JointGraph) -> JointGraph       no in-place ops or writes through views
    min_cut_partition(joint) -> (fw_gm, bw_gm, SavedInfo)
        fw_gm(*primals) -> (*forward outputs, *saved); bw_gm(*saved, *tangents) -> (*grads)
    save_all_partition(joint) -> (fw_gm, bw_gm, SavedInfo)   the baseline: save, never recompute

`JointGraph.inputs` / `.outputs` (`InputSpec`, `OutputSpec`) say what each placeholder and output
is. Random ops become `kiln::philox_uniform` / `kiln::philox_normal` of (seed, offset); see
`kiln.aot.rng` (a code generator lowers these two ops). Tracing runs on kiln's fake tensors
(`kiln.symbolic`), falling back to real copies when an op cannot run on fakes; fake example inputs
with symbolic sizes give graphs with `aten.sym_size.int` and `operator` nodes for those sizes.
`KILN_LOG=graphs` prints the forward and backward graphs and the bytes saved; `KILN_LOG=perf` the
time of each pass (`kiln.log.stage`). Hands on ATen-level graphs to prims (decompositions) and codegen (the compilers).

Modules: trace.py (the recording dispatch mode, trace_joint), functionalize.py and views.py
(in-place ops and view writes), schema.py (what an op does to storage), partition.py (min cut),
rng.py (functional random ops), symbols.py (symbolic sizes as nodes), runtime.py (aot_compile,
the autograd.Function and the epilogue).

Not supported, each with a plain `NotYetImplemented`: double backward; in-place metadata changes
(t_, squeeze_) of an input; writes into an input that shares memory with another input, or into a
tensor attribute that is not a registered buffer; writes through an expanded view; sparse inputs;
ops whose output size depends on values (masked_select, nonzero); random ops in the backward.
"""
from kiln.aot.functionalize import functionalize
from kiln.aot.partition import SavedInfo, min_cut_partition, save_all_partition
from kiln.aot.runtime import AotRuntime, aot_compile
from kiln.aot.trace import InputSpec, JointGraph, OutputSpec, trace_joint

__all__ = ["aot_compile", "trace_joint", "functionalize", "min_cut_partition", "save_all_partition",
           "SavedInfo", "JointGraph", "InputSpec", "OutputSpec", "AotRuntime"]
