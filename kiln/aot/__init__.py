"""Ahead-of-time autograd (AOTAutograd's role): torch-level FX graph -> ATen forward and backward graphs.

Public API:

    aot_compile(gm: torch.fx.GraphModule, example_inputs: list, *, fw_compiler, bw_compiler,
                decompositions: Mapping[OpOverload, Callable] | None = None,
                partition=min_cut_partition) -> callable
        Trace, functionalize, partition, then fw_compiler(fw_gm, example_inputs) -> callable and
        bw_compiler(bw_gm, example_inputs) -> callable. The graphs hold ATen ops, or only the ops
        missing from `decompositions` when a table is given (the backward is traced by autograd on
        ATen ops first, then decomposed below autograd). Returns a callable with gm's signature;
        parameters and buffers of gm are read from gm at each call and receive their gradients.

The named passes, each testable alone:

    trace_joint(gm, example_inputs, *, decompositions=None, with_backward=None) -> JointGraph
        one ATen graph: (*user inputs, *params, *buffers, [rng_seed], *tangents) ->
        (*user outputs, *new values of mutated inputs, *grads of inputs requiring grad)
    functionalize(joint: JointGraph) -> JointGraph       no in-place ops or writes through views
    min_cut_partition(joint) -> (fw_gm, bw_gm, SavedInfo)
        fw_gm(*primals) -> (*forward outputs, *saved); bw_gm(*saved, *tangents) -> (*grads)
    save_all_partition(joint) -> (fw_gm, bw_gm, SavedInfo)   the baseline: save, never recompute

`JointGraph.inputs` / `.outputs` (`InputSpec`, `OutputSpec`) say what each placeholder and output
is. Random ops become `kiln::philox_uniform` / `kiln::philox_normal` of (seed, offset); see
`kiln.aot.rng`. Hands on ATen-level graphs to prims (decompositions) and codegen (the compilers).
"""
from kiln.aot.functionalize import functionalize
from kiln.aot.partition import SavedInfo, min_cut_partition, save_all_partition
from kiln.aot.runtime import AotRuntime, aot_compile
from kiln.aot.trace import InputSpec, JointGraph, OutputSpec, trace_joint

__all__ = ["aot_compile", "trace_joint", "functionalize", "min_cut_partition", "save_all_partition",
           "SavedInfo", "JointGraph", "InputSpec", "OutputSpec", "AotRuntime"]
