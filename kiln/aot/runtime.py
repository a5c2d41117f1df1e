"""The runtime of a compiled forward/backward pair, and `aot_compile`, which builds it.

A call gathers the program inputs (the user's tensors, then the module's parameters and buffers
read from `gm` now, so optimizer updates are seen, then a fresh rng seed), runs the compiled
forward inside a `torch.autograd.Function` whose backward runs the compiled backward, then applies
the epilogue eager needs: new values of mutated inputs are copied into the real inputs, outputs that
alias an input or another output are rebuilt as views of it, and the outputs get the user's
pytree structure back. Gradients of parameters reach their `.grad` because the real parameters are
the Function's inputs.
"""
from __future__ import annotations

import operator
from typing import Callable, Mapping, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import log, trace
from kiln.aot.cse import eliminate_common_subexpressions
from kiln.aot.functionalize import functionalize
from kiln.aot.partition import SavedInfo, min_cut_partition
from kiln.aot.rng import new_seed
from kiln.aot.trace import JointGraph, _overlaps, autocast_off, trace_joint
from kiln.aot.views import replay
from kiln.errors import NotYetImplemented
from kiln.runtime.cudagraphs import picker
from kiln.runtime.module_writes import MODULE_WRITES, count_module_writes


class _CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runtime: "AotRuntime", inside: frozenset, *primals):
        result = runtime.fw(*primals)
        n = runtime.info.num_fw_outputs
        outs, saved = tuple(result[:n]), list(result[n:])
        # The epilogue writes new values into mutated inputs; a saved input must keep the value
        # the backward expects (and autograd would refuse a saved tensor written after saving).
        mutated = {id(primals[i]) for i in runtime.mutated_inputs}
        saved = [s.clone() if id(s) in mutated else s for s in saved]
        ctx.runtime = runtime
        held = set()
        if runtime.writes_with_grad:
            # [Note: a backward reached twice] An input written with a value that requires grad
            # carries this Function in its history: a later backward through the input (the next
            # call reading a buffer this one wrote) reaches it again, as eager's reaches the nodes
            # of the write, which keep what they saved until they run. autograd frees what
            # `save_for_backward` holds after the first backward, so the values are held on ctx
            # (until the graph goes); not a tensor this Function returns (a reference cycle)
            returned = {id(o) for o in outs}
            held = {i for i, s in enumerate(saved) if isinstance(s, torch.Tensor) and id(s) not in returned}
        ctx.tensor_slots = [i for i, s in enumerate(saved) if isinstance(s, torch.Tensor) and i not in held]
        ctx.others = [s if i in held or not isinstance(s, torch.Tensor) else None for i, s in enumerate(saved)]
        ctx.save_for_backward(*[saved[i] for i in ctx.tensor_slots])
        # Outputs the epilogue rebuilds as views leave the Function detached: their gradient flows
        # through the rebuilt view, and one tensor must not leave a Function twice. Views of an
        # input whose elements share memory are rebuilt here instead, their gradient the compiled
        # backward's ([Note: views of overlapping inputs]).
        outs = tuple(_rebuilt(runtime, spec, primals, primals) if k in inside
                     else o.detach() if spec.alias is not None and isinstance(o, torch.Tensor) else o
                     for k, (spec, o) in enumerate(zip(runtime.fw_specs, outs)))
        ctx.mark_non_differentiable(*[  # one call: each call replaces the previous set
            o for k, (spec, o) in enumerate(zip(runtime.fw_specs, outs))
            if isinstance(o, torch.Tensor) and (not spec.requires_grad or spec.alias is not None)
            and k not in inside])
        # [Note: gradients no tangent reached] backward sees which outputs got no gradient
        ctx.set_materialize_grads(False)
        ctx.tangent_shapes = [(o.shape, o.dtype, o.device) if isinstance(o, torch.Tensor) else None for o in outs]
        return outs

    @staticmethod
    def backward(ctx, *grads):
        runtime: AotRuntime = ctx.runtime
        if torch.is_grad_enabled():
            raise NotYetImplemented(
                "kiln.aot: double backward (backward with create_graph=True, or a gradient of a gradient) "
                "through a compiled graph is not supported; compile with backend='eager' for this code")
        if all(g is None for g in grads):
            # reached only through an input this call wrote (a buffer `add_`ed with a parameter
            # on an earlier call): no gradient flows, and the saved values may be freed already
            return (None,) * (2 + runtime.num_primals)
        args = list(ctx.others)
        # [Note: a backward reached twice]: saving no tensor through autograd, the Function may
        # run backward again (fuzz seed 1003200); autograd's saved_tensors raises once freed,
        # even when empty
        for slot, t in zip(ctx.tensor_slots, ctx.saved_tensors if ctx.tensor_slots else ()):
            args[slot] = t
        tangents = [g for g, spec in zip(grads, runtime.fw_specs) if spec.requires_grad]
        missing = {j for j, g in enumerate(tangents) if g is None}
        args += [torch.zeros(ctx.tangent_shapes[i][0], dtype=ctx.tangent_shapes[i][1], device=ctx.tangent_shapes[i][2]) if g is None else g
                 for i, (g, spec) in enumerate(zip(grads, runtime.fw_specs)) if spec.requires_grad]
        with autocast_off():      # [Note: compiled graphs run with autocast off]
            if getattr(runtime.bw, "boxed", False):
                # autograd's own references go too (unless retain_graph): the program frees each
                # saved value after its last use, as eager's backward does
                ctx.maybe_clear_saved_tensors()
                got = runtime.bw(args)
            else:
                got = runtime.bw(*args)
        result = [None] * runtime.num_primals
        for index, g, needs in zip(runtime.grad_inputs, got, runtime.grad_tangents):
            result[index] = None if needs and needs <= missing else g
        return (None, None, *result)


def _rebuilt(runtime: "AotRuntime", spec, sources: list, primals: list):
    """A user output rebuilt as the view it is of an input or another output (`spec.alias`);
    the sizes of a chain traced over symbolic ones are computed from `primals`."""
    _, index, chain = spec.alias
    inputs = None if all(step.static for step in chain) else dict(zip(runtime.placeholders, primals))
    return replay(chain, sources[index], inputs)


def _aliases_in_function(runtime: "AotRuntime", primals: list) -> frozenset:
    """[Note: views of overlapping inputs] An output that is a view of an input is rebuilt by
    replaying its traced view steps on the real input, prim-level `as_strided` among them, and
    autograd then differentiates that `as_strided`. On an input whose elements share memory (an
    expanded one) `as_strided`'s backward spreads the gradient over every element at a location
    (1/9 to each of `x.expand(4, 9)`'s columns), where the view op's (`diagonal`, `unfold`) gives it
    to the one element the view reads. So such views are rebuilt inside the autograd Function, and
    their gradient is the compiled backward's, traced from the view op itself (fuzz seeds 851,
    985, 9067). Only there: a view that leaves a custom Function may not be written in place.
    Decided on the real inputs, which have the traced layout (the entry's guards)."""
    return frozenset(k for k in runtime.input_views_with_grad if _overlaps(primals[runtime.fw_specs[k].alias[1]]))


def tangent_dependencies(bw_gm: fx.GraphModule, num_tangents: int) -> list[frozenset]:
    """For each output of the backward graph (a gradient), the tangents it is computed from, by
    position among the graph's last `num_tangents` inputs.

    [Note: gradients no tangent reached] Eager autograd leaves `x.grad` None when no output that
    got a gradient depends on x: `buffer.add_(x)` where only another output is used. A compiled
    backward runs once for all outputs, so the gradients whose every tangent was missing (None:
    autograd materializes nothing, `set_materialize_grads(False)`) are returned as None, as eager's
    would be; the graph itself runs with zeros for the missing tangents."""
    placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    position = {n: j for j, n in enumerate(placeholders[len(placeholders) - num_tangents:])}
    reach: dict[fx.Node, frozenset] = {}
    for n in bw_gm.graph.nodes:
        if n.op == "placeholder":
            reach[n] = frozenset({position[n]}) if n in position else frozenset()
        elif n.op != "output":
            reach[n] = frozenset().union(*(reach[a] for a in n.all_input_nodes))
    output = next(n for n in bw_gm.graph.nodes if n.op == "output")
    return [reach.get(o, frozenset()) if isinstance(o, fx.Node) else frozenset() for o in output.args[0]]


class AotRuntime:
    """Calls the compiled graphs with gm's signature; see the module docstring."""

    def __init__(self, gm: torch.nn.Module, joint: JointGraph, fw: Callable, bw: Callable | None,
                 info: SavedInfo):
        self.joint, self.fw, self.bw, self.info = joint, fw, bw, info
        self.num_primals = len(joint.input_indices("user", "param", "buffer", "rng_seed"))
        self.num_user = len(joint.input_indices("user"))
        self.state = [_attribute_ref(gm, s.name) for s in joint.inputs if s.kind in ("param", "buffer")]
        # [Note: parameters read once a module write] the state's tensors as last read, and the
        # count of module writes then ([Note: counted module writes]): a decoder's ~400 parameters
        # are read once, not every call
        self.state_values, self.state_read_at = (), None
        if self.state:
            count_module_writes()
        # what the sizes of a view chain read (`_rebuilt`); a runtime from the warm-start cache has
        # no graph, and no output it rebuilds (kiln/pipeline/warm_start.py)
        placeholders = [] if joint.gm is None else joint.gm.graph.find_nodes(op="placeholder")
        self.placeholders = list(placeholders)[:self.num_primals]
        self.seed_at = next(iter(joint.input_indices("rng_seed")), None)
        self.fw_specs = [joint.outputs[i] for i in joint.output_indices("user", "mutation")]
        self.grad_inputs = [joint.outputs[i].index for i in joint.output_indices("grad")]
        self.mutated_inputs = [joint.outputs[i].index for i in joint.output_indices("mutation")]
        self.needs_grad_from = [i for i, s in enumerate(joint.inputs[:self.num_primals]) if s.requires_grad]
        # [Note: a backward reached twice]
        self.writes_with_grad = any(s.kind == "mutation" and s.requires_grad for s in self.fw_specs)
        self.grad_tangents = [frozenset()] * len(self.grad_inputs)   # aot_compile reads the backward's
        self.input_views_with_grad = [k for k, spec in enumerate(self.fw_specs)
                                      if spec.alias is not None and spec.alias[0] == "input" and spec.requires_grad
                                      and joint.inputs[spec.alias[1]].requires_grad]
        # [Note: the epilogue planned once] what `_epilogue` would otherwise work out each call
        self.num_mutations = len(self.mutated_inputs)
        self.num_user_outputs = info.num_fw_outputs - self.num_mutations
        self.pick_mutated = picker([spec.index for spec in self.fw_specs[self.num_user_outputs:]])
        self.rebuilt_outputs = [k for k, spec in enumerate(self.fw_specs[:self.num_user_outputs])
                                if spec.alias is not None]
        self.flat_tuple_out = _is_flat_tuple(joint.out_spec)

    def __call__(self, *args):
        """[Note: compiled graphs run with autocast off] The joint graph was traced below autocast:
        its ops are the ones autocast chose, casts included. Run under the caller's autocast, the
        ATen kernels a compiled graph calls (matmuls, convolutions, attention) would be cast a second
        time: an fp32 matmul the model wrote inside `autocast(enabled=False)` (LLaMA's and
        GPT-NeoX's rotary frequencies) would run in bf16. So the graphs run with autocast off,
        forward and backward, as torch's own AOTAutograd does."""
        if self.state_read_at != MODULE_WRITES[0]:
            # the owning dict's entry, not `getattr` (nn.Module.__getattr__ runs in Python per name)
            self.state_read_at = MODULE_WRITES[0]
            self.state_values = tuple(v if (v := d.get(name)) is not None else getattr(module, name)
                                      for module, d, name in self.state)
        primals = args + self.state_values
        if self.seed_at is not None:
            primals = (*primals[:self.seed_at], new_seed(), *primals[self.seed_at:])
        if not torch.is_grad_enabled() and not torch._C._is_any_autocast_enabled():
            # inference (a decode step): no mode to switch, no gradient to trace
            return self._epilogue(primals, self.fw(*primals)[:self.info.num_fw_outputs], frozenset())
        with autocast_off():
            if self.bw is not None and torch.is_grad_enabled() and any(
                    isinstance(primals[i], torch.Tensor) and primals[i].requires_grad for i in self.needs_grad_from):
                inside = _aliases_in_function(self, primals)
                outs = _CompiledFunction.apply(self, inside, *primals)
            else:
                # no gradient flows through this call (none was traced, or none is needed): an
                # extern writing into a buffer of the program (`mm(out=...)`) refuses inputs that
                # require grad under grad mode
                with torch.no_grad():
                    outs = self.fw(*primals)[:self.info.num_fw_outputs]
                inside = frozenset()
        return self._epilogue(primals, outs, inside)

    def _epilogue(self, primals: tuple, outs: Sequence, inside: frozenset):
        """Mutated inputs get their new values; outputs that alias an input or another output are
        rebuilt as views (but those `inside`, rebuilt by the autograd Function).

        [Note: the epilogue planned once] A decode step writes every layer's cache and its length
        (66 inputs of a 22-layer LLaMA), and most writes were made in place by the program, whose
        output is then the input itself: one C-level pass (`map(operator.is_, ...)`) finds them,
        and only the rest are looked at one by one. What the user gets back is planned at
        construction: the outputs to rebuild as views, and whether the pytree is a flat tuple."""
        num_user = self.num_user_outputs
        if self.num_mutations:
            targets, values = self.pick_mutated(primals), outs[num_user:]
            if not all(map(operator.is_, values, targets)):
                self._write_back(targets, values)
        if not self.rebuilt_outputs:
            user = outs[:num_user]
            return tuple(user) if self.flat_tuple_out else pytree.tree_unflatten(list(user), self.joint.out_spec)
        user = list(outs[:num_user])
        for k in self.rebuilt_outputs:
            if k not in inside:
                spec = self.fw_specs[k]
                user[k] = _rebuilt(self, spec, primals if spec.alias[0] == "input" else user, primals)
        return tuple(user) if self.flat_tuple_out else pytree.tree_unflatten(user, self.joint.out_spec)

    def _write_back(self, targets: Sequence, values: Sequence):
        """The new values of mutated inputs that the program did not write in place, copied in."""
        # writes autograd need not see (BatchNorm's running stats: 159 in a ResNet-50 training step)
        # go as one multi-tensor copy: one launch per dtype instead of one per tensor
        plain = []
        for target, value in zip(targets, values):
            if value is target or value.is_set_to(target):   # written in place by the program: nothing to copy
                continue
            if target.requires_grad and target.is_leaf:
                # autograd refuses an in-place write to a leaf that requires grad: eager wrote it
                # through `.data` (or under no_grad), and `.data` writes without a new version, so
                # that what a backward saved of it is read as it now is, as in eager
                plain.append((target.data, value))
            # as eager's in-place write: an input written with a value that requires grad joins
            # the autograd graph (x.copy_(w) makes x require grad)
            elif target.requires_grad or (value.requires_grad and torch.is_grad_enabled()):
                target.copy_(value)
            else:
                plain.append((target, value))
        if plain:
            with torch.no_grad():
                torch._foreach_copy_([t for t, _ in plain], [v for _, v in plain])


def _is_flat_tuple(spec) -> bool:
    """Whether `tree_unflatten(leaves, spec)` is `tuple(leaves)` (a graph returning a tuple of tensors)."""
    try:
        leaves = [object() for _ in range(spec.num_leaves)]
        got = pytree.tree_unflatten(leaves, spec)
    except Exception:
        return False
    return type(got) is tuple and len(got) == len(leaves) and all(a is b for a, b in zip(got, leaves))


def forward_meta(joint, info, concrete_size: tuple | None = None) -> dict:
    """What the forward program's compiler is told of its inputs and outputs (a traced forward
    carries it in `gm.meta`; a warm start rebuilds it from the kept joint graph's specs)."""
    # inputs the forward writes back into (a KV cache's update): codegen may write them in place
    # ([Note: writes into inputs in place] in kiln/codegen/reinplace.py)
    mutations = [joint.outputs[i] for i in joint.output_indices("mutation")]
    first_mutation = info.num_fw_outputs - len(mutations)
    written = tuple((first_mutation + k, spec.index) for k, spec in enumerate(mutations)
                    if not joint.inputs[spec.index].requires_grad)
    return {
        "kiln_inputs_written": written,
        # the outputs the epilogue copies into inputs at once, before any later call: a CUDA graph
        # need not copy them out of its memory ([Note: CUDA graphs])
        "kiln_written_back": tuple(range(first_mutation, info.num_fw_outputs)),
        # inputs that live as long as the module, and the ones written in place: a CUDA graph
        # uses them in place
        "kiln_static_inputs": tuple(sorted({*joint.input_indices("param", "buffer"), *(i for _, i in written)})),
        "kiln_module_state": tuple(joint.input_indices("param", "buffer")),
        # inputs traced without a symbol in their sizes and strides: the program is compiled for
        # them, so no call of it passes them in another size (a warm start keeps the traced graph's)
        "kiln_concrete_size": concrete_inputs(joint) if concrete_size is None else concrete_size,
    }


def concrete_inputs(joint) -> tuple:
    """The inputs of `joint` traced with no symbol in their sizes and strides (none, untraced)."""
    if joint.gm is None:
        return ()
    placeholders = joint.gm.graph.find_nodes(op="placeholder")
    return tuple(i for i, n in enumerate(placeholders) if i < len(joint.inputs)
                 and isinstance(val := n.meta.get("val"), torch.Tensor)
                 and all(type(d) is int for d in (*val.shape, *val.stride())))


def _attribute_ref(root: torch.nn.Module, qualified: str):
    """(owning module, the dict holding it, attribute name) of a parameter or buffer, resolved once."""
    *path, name = qualified.split(".")
    module = root
    for part in path:
        module = getattr(module, part)
    owner = next((d for d in (getattr(module, "_parameters", None), getattr(module, "_buffers", None))
                  if isinstance(d, dict) and name in d), {})
    return module, owner, name


def _example(node: fx.Node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.device.type != "meta":
        return val
    device = node.meta.get("device", torch.device("cpu"))
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=device).zero_()


def _in_saved_layouts(examples: list, fw_strides: Sequence, info) -> list:
    """The backward's examples with each saved value in the strides the forward program returns it
    ([Note: saved values in the layout of their producer])."""
    saved = fw_strides[info.num_fw_outputs:info.num_fw_outputs + len(info.saved)]
    out = list(examples)
    for i, strides in enumerate(saved):
        x = out[i]
        if strides is not None and isinstance(x, torch.Tensor) and tuple(x.stride()) != tuple(strides) \
                and len(strides) == x.dim() and not any(isinstance(d, torch.SymInt) for d in x.shape):
            out[i] = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).zero_()
    return out


def _refuse_mutated_aliased_inputs(joint: JointGraph, example_inputs: list) -> None:
    """A write into one input that shares memory with another input (or with itself: an expanded
    input) would show in both in eager; the functional graph treats inputs and their elements as
    distinct, so refuse plainly rather than differ."""
    mutated = {joint.outputs[i].index for i in joint.output_indices("mutation")}
    for i in sorted(mutated):
        x = example_inputs[i] if i < len(example_inputs) else None
        if isinstance(x, torch.Tensor) and any(isinstance(st, int) and st == 0 and size != 1
                                               for size, st in zip(x.shape, x.stride())):
            raise NotYetImplemented(f"kiln.aot: input {i} is written in place and several of its elements "
                                    "share memory (an expanded tensor): eager's write shows through every "
                                    "element that shares it, which the compiled graph does not model; "
                                    "write into a .clone() of it")
    storages: dict[int, int] = {}
    for i, x in enumerate(example_inputs):
        if type(x) is torch.Tensor and x.device.type != "meta" and x.numel():
            storages.setdefault(x.untyped_storage().data_ptr(), i)
            first = storages[x.untyped_storage().data_ptr()]
            if first != i and (i in mutated or first in mutated):
                raise NotYetImplemented(f"kiln.aot: inputs {first} and {i} share memory and one of them is "
                                        "written in place; pass separate tensors (e.g. .clone() one of them)")


def aot_compile(gm: torch.fx.GraphModule, example_inputs: list, *, fw_compiler: Callable,
                bw_compiler: Callable, decompositions: Mapping | None = None,
                partition: Callable = min_cut_partition, numerics: str = "fast") -> Callable:
    """Trace `gm` with its backward, functionalize, partition, compile both halves; see
    `kiln.aot` for the contract."""
    with log.stage("aot trace"):          # [Note: compile stages]
        joint = trace_joint(gm, example_inputs, decompositions=decompositions, numerics=numerics)
    with log.stage("functionalize"):
        joint = functionalize(joint)
    _refuse_mutated_aliased_inputs(joint, list(example_inputs))
    with log.stage("partition"):
        if eliminate_common_subexpressions(joint.gm.graph):    # [Note: common subexpressions]
            joint.gm.recompile()
        fw_gm, bw_gm, info = partition(joint)
        for half in (fw_gm, bw_gm):
            if eliminate_common_subexpressions(half.graph):
                half.recompile()
    if log.enabled("graphs"):
        print(f"[kiln.aot] forward graph (traced on {joint.traced_on} tensors):\n{fw_gm.code}\n"
              f"[kiln.aot] backward graph:\n{bw_gm.code}\n[kiln.aot] {info}")
    examples = [_example(n) for n in fw_gm.graph.nodes if n.op == "placeholder"]
    fw_gm.meta.update(forward_meta(joint, info))
    fw_gm.meta["kiln_user_outputs"] = info.num_fw_outputs   # the rest are saved for the backward
    # the backward's caller keeps none of its inputs: a compiler may take them as a list it empties
    # and free each after its last use (returning a callable with `boxed = True`)
    bw_gm.meta["kiln_boxed"] = True
    trace.graph_event("aot forward", None, fw_gm, traced_on=joint.traced_on, saved=info)
    fw = fw_compiler(fw_gm, examples)
    bw = None
    if joint.input_indices("tangent") and joint.output_indices("grad"):
        trace.graph_event("aot backward", None, bw_gm)
        examples = [_example(n) for n in bw_gm.graph.nodes if n.op == "placeholder"]
        bw = bw_compiler(bw_gm, _in_saved_layouts(examples, getattr(fw, "output_strides", ()), info))
    runtime = AotRuntime(gm, joint, fw, bw, info)
    if bw is not None:
        runtime.grad_tangents = tangent_dependencies(bw_gm, len(joint.input_indices("tangent")))
    runtime.graphs = (fw_gm, bw_gm)
    return runtime
