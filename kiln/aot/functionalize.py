"""Functionalization: a traced graph with in-place ops and views to a graph of pure ops.

[Note: functionalization] The pass interprets the recorded graph in order, building a new one.
Every tensor node belongs to a *base* (the node owning its storage: an input, a constant, or the
output of a non-view op) and is reached from it by a chain of `ViewStep`s. Each base has a current
value (a node of the new graph) and a generation that counts the writes into it:

- a view op appends a step to its input's chain and emits the view of the current value;
- a write (`add_`, `copy_`, `out=`, batch norm's running statistics) emits the op's functional
  variant, scatters the result back through the chain into a new value of the base (select_scatter,
  slice_scatter, ... see `views.SCATTERS`), and bumps the base's generation;
- reading a node whose base moved on since its value was made replays its chain on the new base.

Inputs whose base was written get their final value as graph outputs (`OutputSpec('mutation')`,
which the tracer placed); the runtime copies them into the real inputs. User outputs that alias an
input or another output get `OutputSpec.alias = (kind, index, chain)` so the runtime returns
views as eager does, instead of fresh tensors (under symbolic sizes too, where the chain's sizes
are nodes computing them from the inputs' sizes).

Hands on a `JointGraph` with `functional=True`: no op in it writes or aliases (views remain, but
no view is written through).
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln.aot import schema
from kiln.aot.symbols import computed_from_inputs
from kiln.aot.trace import JointGraph, _dense, graph_module, meta_of
from kiln.aot.views import ViewStep, emit_step, scatter_step
from kiln.errors import NotYetImplemented

aten = torch.ops.aten


def _meta_eval(target, args, kwargs):
    """Metadata of a new node: run `target` on its arguments' metadata (meta or fake tensors)."""
    def val(a):
        return a.meta.get("val") if isinstance(a, fx.Node) else a
    try:
        out = target(*pytree.tree_map(val, args), **pytree.tree_map(val, kwargs))
    except Exception:
        return None
    return pytree.tree_map(lambda o: meta_of(o) if isinstance(o, torch.Tensor) else o, out)


def _same_layout(a, b) -> bool:
    """Same shape, dtype and strides: `b` can stand for `a` whole (a later view of `a` replays on it;
    an expanded `b` standing for a dense `a` made `a.view(-1)` impossible)."""
    va, vb = (x.meta.get("val") if isinstance(x, fx.Node) else None for x in (a, b))
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape
            and va.dtype == vb.dtype and va.stride() == vb.stride())


def _contiguous_overwrite(a, b) -> bool:
    """`a.copy_(b)` overwrites all of a contiguous `a` on `b`'s device (same shape)."""
    va, vb = (x.meta.get("val") if isinstance(x, fx.Node) else None for x in (a, b))
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape
            and va.device == vb.device and va.is_contiguous())


def _device_of(args) -> torch.device | None:
    for a in pytree.tree_leaves(args):
        if isinstance(a, fx.Node) and "device" in a.meta:
            return a.meta["device"]
    return None


class _Functionalizer:
    def __init__(self, joint: JointGraph):
        self.joint = joint
        self.graph = fx.Graph()
        self.value: dict[fx.Node, object] = {}
        self.base: dict[fx.Node, fx.Node] = {}
        self.chain: dict[fx.Node, tuple[ViewStep, ...]] = {}
        self.seen: dict[fx.Node, int] = {}
        self.base_value: dict[fx.Node, fx.Node] = {}
        self.gen: dict[fx.Node, int] = {}
        self.items: dict[fx.Node, tuple] = {}

    # -- building the new graph ------------------------------------------------------------
    def emit(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = _meta_eval(target, args, kwargs)
        device = _device_of((args, kwargs))
        if device is not None:
            node.meta["device"] = device
        return node

    def copy(self, old: fx.Node) -> fx.Node:
        """`old`'s op on the current values of its arguments: its metadata is old's (no re-run)."""
        node = self.graph.call_function(old.target, self.read_args(old.args), self.read_args(old.kwargs))
        node.meta.update(old.meta)
        return node

    def new_base(self, old: fx.Node, new: fx.Node) -> None:
        self.base[old], self.chain[old] = old, ()
        self.base_value[old], self.gen[old], self.seen[old], self.value[old] = new, 0, 0, new

    def alias(self, old: fx.Node, of: fx.Node, steps: tuple[ViewStep, ...], value: fx.Node) -> None:
        b = self.base[of]
        self.base[old], self.chain[old] = b, self.chain[of] + steps
        self.value[old], self.seen[old] = value, self.gen[b]

    def read(self, old: fx.Node):
        if old not in self.base:
            return self.value[old]
        b = self.base[old]
        if self.seen[old] != self.gen[b]:
            v = self.base_value[b]
            for step in self.chain[old]:
                v = emit_step(self.emit, v, step)
            self.value[old], self.seen[old] = v, self.gen[b]
        return self.value[old]

    def read_args(self, args):
        return fx.node.map_arg(args, self.read)

    def write(self, old: fx.Node, value: fx.Node) -> None:
        b = self.base[old]
        self.base_value[b] = self._in_layout_of(b, self._scatter(self.base_value[b], self.chain[old], value))
        self.gen[b] += 1
        self.value[old], self.seen[old] = value, self.gen[b]

    def _in_layout_of(self, b: fx.Node, new: fx.Node) -> fx.Node:
        """[Note: a written base keeps its layout] A base's later views replay their traced steps on
        its new value, and a view that was legal on the traced layout (eager's) need not be on
        another: a write through `x.mT.select(1, 0)` of a column-major `x` scattered into a
        contiguous copy, and the traced `x.mT.view(-1)` then had no view (fuzz seed 1339). So a
        new value laid out otherwise than the base is copied into the base's strides, where those
        are a dense layout a copy can take (the copy usually fuses into the scatter)."""
        want, have = b.meta.get("val"), new.meta.get("val")
        if not (isinstance(want, torch.Tensor) and isinstance(have, torch.Tensor)) or want.shape != have.shape:
            return new
        if any(isinstance(x, torch.SymInt) for x in (*want.shape, *want.stride(), *have.stride())):
            return new
        strides = [(n, st) for n, st in zip(want.shape, want.stride()) if n != 1]
        if strides == [(n, st) for n, st in zip(have.shape, have.stride()) if n != 1] or not _dense(want):
            return new
        from kiln.prims.ops import ops as p
        return self.emit(p.copy_strided, new, list(want.stride()))

    def _scatter(self, current: fx.Node, chain: tuple[ViewStep, ...], value: fx.Node) -> fx.Node:
        if not chain:
            return value
        inner = emit_step(self.emit, current, chain[0])
        new_inner = self._scatter(inner, chain[1:], value)
        return scatter_step(self.emit, current, current.meta["val"], new_inner, chain[0], inner.meta["val"])

    # -- one handler per kind of node --------------------------------------------------------
    def run(self) -> JointGraph:
        for node in self.joint.gm.graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                new = self.graph.placeholder(node.target) if node.op == "placeholder" else self.graph.get_attr(node.target)
                new.meta.update(node.meta)
                self.new_base(node, new)
            elif node.op == "output":
                return self.finish(node)
            elif node.target is operator.getitem:
                self.getitem(node)
            else:
                self.call(node)
        raise AssertionError("graph without output")

    def call(self, node: fx.Node) -> None:
        # a view of a Python number (`aten._conj(2j)`, mul's backward of a complex scalar: torch
        # hands a wrapped number to Python as the number) is a new tensor, aliasing nothing
        op, eff = node.target, schema.effects(node.target)
        if eff.view and isinstance(node.args[0], fx.Node):
            self.view(node)
        elif eff.mutated and not (op is aten.native_batch_norm.default and not node.args[5]):
            self.mutation(node, eff)
        else:
            self.fresh(node, self.copy(node))

    def fresh(self, node: fx.Node, new: fx.Node) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            self.new_base(node, new)
        elif isinstance(val, (tuple, list)):
            self.items[node] = ("fresh", new)
        else:
            self.value[node] = new

    def view(self, node: fx.Node) -> None:
        src = node.args[0]
        if schema.effects(node.target).inplace_view and self.base[src].op == "placeholder":
            raise NotYetImplemented(f"kiln.aot: {node.target} changes the sizes or strides of an input in place; "
                                    "eager would change the caller's tensor, which kiln does not replay. Use the "
                                    "out-of-place form (e.g. x = x.t() instead of x.t_())")
        step = ViewStep(node.target, tuple(self.read_args(node.args[1:])),
                        tuple(self.read_args(dict(node.kwargs)).items()))
        value = self.read(src)
        if isinstance(node.meta.get("val"), (tuple, list)):  # split, unbind: a list of views
            new = self.emit(node.target, value, *step.args, **dict(step.kwargs))
            self.items[node] = ("views", src, step, new)
        else:
            self.alias(node, src, (step,), emit_step(self._replay_of(node, src, value), value, step))

    def _replay_of(self, old: fx.Node, src: fx.Node, value: fx.Node):
        """[Note: views keep their traced metadata] Where the current value of a view's source still
        carries the source's traced metadata record itself (no write into its base since: the record
        is handed on by `copy`, by placeholders and by this), the view replays on the very layout it
        was traced on, so its traced metadata holds and is copied rather than computed again on fakes
        (`_meta_eval`: a symbolic view's meta kernel is torch's Python reference, about 1 ms an op,
        most of this pass on a 32-layer decoder). Otherwise the view is emitted afresh."""
        traced = src.meta.get("val")
        if traced is None or value.meta.get("val") is not traced:
            return self.emit

        def emit(target, *args, **kwargs) -> fx.Node:
            node = self.graph.call_function(target, args, kwargs)
            node.meta.update(old.meta)
            return node
        return emit

    def mutation(self, node: fx.Node, eff: schema.OpEffects) -> None:
        op = node.target
        fop = schema.functional_variant(op)
        if fop is None:
            raise NotYetImplemented(f"kiln.aot cannot functionalize {op}: it writes into its arguments and "
                                    "has no out-of-place variant; run this code eagerly (a graph break)")
        names = [a.name for a in op._schema.arguments]
        targets = [node.args[i] if i < len(node.args) else node.kwargs.get(names[i]) for i in eff.mutated]
        args = self.read_args(node.args)
        kwargs = self.read_args(dict(node.kwargs))
        if schema.is_out_overload(op):
            kwargs = {k: v for k, v in kwargs.items() if k not in {names[i] for i in eff.mutated}}
        if op is aten.copy_.default and _same_layout(node.args[0], node.args[1]):
            # A full overwrite does not read the old value: keep no dependency on it (the old
            # value is often an `empty_like`, which would pin its own input for the backward).
            new = args[1]
        elif op is aten.copy_.default and _contiguous_overwrite(node.args[0], node.args[1]):
            # the same, into a contiguous target of another dtype or from another layout: the source
            # converted into the target's dtype and layout stands for it (dropout's mask stays
            # recomputable in the backward, as no dependency on the overwritten value is kept)
            target = node.args[0].meta["val"]
            new = self.emit(aten._to_copy.default, args[1], dtype=target.dtype,
                            memory_format=torch.contiguous_format)
        else:
            new = self.emit(fop, *args, **kwargs)
        if fop._schema.name.endswith("_functional"):   # returns: op's own outputs, then new args
            first = len(fop._schema.returns) - len(eff.mutated)
            for j, target in enumerate(targets):
                if isinstance(target, fx.Node):
                    self.write(target, self.emit(operator.getitem, new, first + j))
            if len(op._schema.returns) == 1:   # rrelu_with_noise: one output, one written argument
                self.fresh(node, self.emit(operator.getitem, new, 0))
            else:
                self.items[node] = ("fresh", new)
            return
        values = [new] if len(fop._schema.returns) == 1 else [
            self.emit(operator.getitem, new, k) for k in range(len(targets))]
        for target, value in zip(targets, values):
            want = target.meta["val"].dtype
            if value.meta.get("val") is not None and value.meta["val"].dtype != want:
                value = self.emit(aten._to_copy.default, value, dtype=want)
            self.write(target, value)
        if len(targets) == 1:
            self.alias(node, targets[0], (), self.value[targets[0]])
        else:
            self.items[node] = ("same", targets)

    def getitem(self, node: fx.Node) -> None:
        parent, index = node.args
        kind, *rest = self.items[parent]
        if kind == "fresh" and rest[0].target is node.args[0].target:   # a copied op: keep metadata
            item = self.graph.call_function(operator.getitem, (rest[0], index))
            item.meta.update(node.meta)
            self.fresh(node, item)
        elif kind == "fresh":
            self.fresh(node, self.emit(operator.getitem, rest[0], index))
        elif kind == "views":
            src, step, new = rest
            self.alias(node, src, (dataclasses.replace(step, index=index),), self.emit(operator.getitem, new, index))
        else:
            target = rest[0][index]
            self.alias(node, target, (), self.read(target))

    def finish(self, output: fx.Node) -> JointGraph:
        olds = list(output.args[0])
        new_out = [self.read(o) if isinstance(o, fx.Node) else o for o in olds]
        self.graph.output(tuple(new_out))
        self.graph.eliminate_dead_code()
        specs = list(self.joint.outputs)
        placeholders = {n: i for i, n in enumerate(n for n in self.joint.gm.graph.nodes if n.op == "placeholder")}
        program_inputs = set(self.joint.input_indices("user", "param", "buffer"))
        for k, (spec, old) in enumerate(zip(specs, olds)):
            if spec.kind == "user" and isinstance(old, fx.Node) and old in self.base:
                specs[k] = dataclasses.replace(spec, alias=self._output_alias(k, old, olds, placeholders, program_inputs))
        gm = graph_module(self.joint.gm, self.graph)
        return dataclasses.replace(self.joint, gm=gm, outputs=tuple(specs), functional=True)

    def _output_alias(self, k, old, olds, placeholders, program_inputs):
        b, chain = self.base[old], self.chain[old]
        # a size among a chain's arguments (unfold's `s0 - 1` windows) is computed again from the
        # real inputs where the runtime replays it; one read from any other value is not rebuilt
        inputs = {self.value[p] for p, i in placeholders.items() if i in program_inputs}
        if not all(computed_from_inputs(n, inputs) for step in chain for n in step.size_nodes):
            return None
        if b in placeholders and placeholders[b] in program_inputs:
            return None if self.joint.inputs[placeholders[b]].relaid else ("input", placeholders[b], chain)
        for j in range(k):
            other = olds[j]
            if isinstance(other, fx.Node) and self.base.get(other) is b:
                prefix = self.chain[other]
                if chain[:len(prefix)] == prefix:
                    return ("output", j, chain[len(prefix):])
        # a view of an intermediate that a later output is (`return t.view(-1), t`): rebuilt from
        # that output, which is the intermediate itself and so stays as the Function returns it (a
        # view among a custom Function's outputs may not be written in place)
        for j in range(k + 1, len(olds)):
            other = olds[j]
            if isinstance(other, fx.Node) and self.base.get(other) is b and not self.chain[other] and \
                    not any(isinstance(o, fx.Node) and self.base.get(o) is b and not self.chain[o] for o in olds[:j]):
                return ("output", j, chain)
        return None


def functionalize(joint: JointGraph) -> JointGraph:
    """Rewrite a traced joint graph without in-place ops; see [Note: functionalization]."""
    if joint.functional:
        return joint
    return _Functionalizer(joint).run()
