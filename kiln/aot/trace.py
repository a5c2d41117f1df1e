"""Joint tracing: a torch-level FX graph to one ATen-level graph holding forward and backward.

[Note: joint tracing] The torch-level graph runs as ordinary Python on stand-in inputs while a
`TorchDispatchMode` (`_Recorder`) sees every ATen op below autograd. Each op runs on whatever
tensors it was given (real copies of the inputs, or kiln's fake tensors: the recorder does not
care) and is appended to an FX graph, its inputs found by the identity of the tensors. Then
`torch.autograd.grad` runs, still under the mode, with tangent placeholders: autograd's own
derivative formulas dispatch ATen ops, which land in the same graph. no_grad/enable_grad regions,
detach and autocast need no special handling: the program runs for real, so autograd and autocast
do what they do in eager, and only the ops they dispatch are recorded.

The recorded graph is *not* functional: in-place ops, views and writes through views appear as
they ran. `functionalize.functionalize` removes them. Modules' parameters and buffers are lifted
into inputs by swapping them for stand-ins while the graph runs.

Hands on `JointGraph`: the graph, what each placeholder is (`InputSpec`) and what each output is
(`OutputSpec`: user output, new value of a mutated input, or gradient of an input).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import sys
from typing import Any, Callable, Mapping

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils._python_dispatch import TorchDispatchMode

from kiln import log
from kiln.aot import schema
from kiln.aot.rng import RANDOM_REPLACEMENTS, RngStream
from kiln.aot.symbols import SymbolTable
from kiln.errors import NotYetImplemented
from kiln.symbolic import arguments
from kiln.symbolic.fake import METADATA_MUTATING, FakeTensor
from kiln.symbolic.shape_env import fx_node_location

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One placeholder of a joint graph. kind: user | param | buffer | rng_seed | tangent.
    `name` is the parameter's or buffer's qualified name in the module, or the argument index.
    `relaid`: the program saw a copy of it in other strides (`_program_copy` of symbolic ones), so
    its traced views address that copy, not the real input."""

    kind: str
    name: str
    requires_grad: bool = False
    relaid: bool = False


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output of a joint graph. kind: user | mutation | grad. `index`: the user output's
    position, or the input (position in `JointGraph.inputs`) that is mutated / differentiated.
    `alias`: for user outputs that alias an input or another output, how to rebuild them
    (filled in by functionalization)."""

    kind: str
    index: int
    requires_grad: bool = False
    alias: Any = None


@dataclasses.dataclass(frozen=True)
class JointGraph:
    gm: fx.GraphModule
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    out_spec: Any                     # pytree spec of the user outputs
    functional: bool = False
    traced_on: str = "fake"           # "fake" or "real" tensors; see [Note: fake tracing falls back to real]

    def input_indices(self, *kinds: str) -> list[int]:
        return [i for i, s in enumerate(self.inputs) if s.kind in kinds]

    def output_indices(self, *kinds: str) -> list[int]:
        return [i for i, s in enumerate(self.outputs) if s.kind in kinds]


def meta_of(t: torch.Tensor) -> torch.Tensor:
    """The metadata kept on a node (`node.meta['val']`): a data-free tensor with t's sizes, strides,
    offset and dtype, as they are now. Never `t` itself: a later in-place metadata op on t
    (at::matmul's `squeeze_` of its mm result, `t_`, `unsqueeze_`) would change the record. A fake
    or meta t gives a new alias of its storage (aliasing between records is kept); a real t a meta
    tensor of its extent."""
    if type(t) is torch.Tensor and t.device.type != "meta":
        extent = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        storage = torch.empty(max(extent, 0) if t.numel() else t.storage_offset(), dtype=t.dtype, device="meta")
        return storage.as_strided(t.shape, t.stride(), t.storage_offset())
    with torch._C._DisableTorchDispatch():
        if isinstance(t, FakeTensor):
            return FakeTensor(aten.alias.default(t._meta), t.device, t.fake_mode, constant=t.constant)
        if type(t) is torch.Tensor:
            return aten.alias.default(t)
    return t  # another tensor subclass: kept as is


class _Recorder(TorchDispatchMode):
    """Appends each ATen op that reaches it to `graph`; see [Note: joint tracing]."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False        # [Note: dispatch modes without dynamo] in kiln/symbolic/fake.py

    def __init__(self, graph: fx.Graph, decompositions: Mapping, rng: RngStream):
        super().__init__()
        self.graph = graph
        self.decompositions = decompositions
        self.rng = rng
        self.constants: dict[str, torch.Tensor] = {}
        self._nodes: dict[int, tuple[torch.Tensor, fx.Node]] = {}  # id -> (tensor kept alive, node)
        self._root: dict[int, fx.Node] = {}                          # id -> node of the storage's root
        self.mutated_roots: set[fx.Node] = set()
        self.symbols = SymbolTable(graph)
        # id -> (node, position in a tuple record or None): nodes whose record is that fake itself
        self._records: dict[int, list[tuple[fx.Node, int | None]]] = {}
        self._decomposing: list = []    # the ATen ops whose decompositions are running, outermost first
        self._where: dict[tuple[int, int], str] = {}   # (graph code, line) -> the user's "file:line in fn"

    def bind(self, t: torch.Tensor, node: fx.Node, root: fx.Node | None = None) -> None:
        self._nodes[id(t)] = (t, node)
        self._root[id(t)] = root if root is not None else node
        node.meta["val"] = self.record(t, node)
        node.meta["device"] = t.device

    def record(self, t: torch.Tensor, node: fx.Node, index: int | None = None) -> torch.Tensor:
        """[Note: traced fakes as their own records] `node.meta['val']` must keep t's metadata as it
        is now (`meta_of`), and a fake's only way to change it later is an op of
        `METADATA_MUTATING` (t_, squeeze_, ...), which reaches this recorder before it runs. So a fake
        that does not require grad is its own record, and `snapshot` gives the nodes holding it a
        copy just before such an op. Making that copy for every node was a fake tensor per op: with
        symbolic sizes torch computes each one's numel and contiguity through SymNodes, about a
        quarter of decomposing a 32-layer decoder's prefill. (One that requires grad is copied at
        once: a record must not carry the trace's autograd graph.)"""
        if isinstance(t, FakeTensor) and not t.requires_grad:
            self._records.setdefault(id(t), []).append((node, index))
            return t
        return meta_of(t)

    def snapshot(self, t: torch.Tensor) -> None:
        """The nodes recording `t` itself get a copy of its metadata as it is now."""
        for node, index in self._records.pop(id(t), ()):
            val = node.meta.get("val")
            if index is None and val is t:
                node.meta["val"] = meta_of(t)
            elif index is not None and val[index] is t:
                node.meta["val"] = tuple(meta_of(t) if i == index else v for i, v in enumerate(val))

    def node_of(self, t: torch.Tensor) -> fx.Node:
        entry = self._nodes.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        # A tensor the program holds that is no input: a constant of the graph.
        if type(t) is not torch.Tensor or t.device.type == "meta":
            raise NotYetImplemented(f"kiln.aot: a {type(t).__name__} of shape {tuple(t.shape)} reached the "
                                    "tracer without being an input or a traced value")
        name = f"_constant_{len(self.constants)}"
        with torch._C._DisableTorchDispatch():  # a fake mode below us must not turn it into a fake
            self.constants[name] = t.detach()
        node = self.graph.get_attr(name)
        self.bind(t, node)
        return node

    def assert_scalar(self, cond, message: str) -> None:
        """`aten._assert_scalar(cond, message)` of the torch-level graph ([Note: run-time checks] in
        kiln/capture/run_time_checks.py): recorded here, as an op with no tensor argument never
        reaches a dispatch mode."""
        if isinstance(cond, torch.SymBool) and cond.node.shape_env.has_unbacked(cond.node.expr):
            cond.node.shape_env.expect_true(cond.node)     # assumed here too: later ops read it
            node = self.graph.call_function(aten._assert_scalar.default, (self.symbols.node_of(cond), message))
            node.meta["val"] = None
        elif not cond:
            raise RuntimeError(message)

    def _arg(self, a):
        if isinstance(a, torch.Tensor):
            return self.node_of(a)
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.symbols.node_of(a)
        return a

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in METADATA_MUTATING:      # [Note: traced fakes as their own records]
            self.snapshot(args[0] if args else kwargs["self"])
        if func in self.decompositions:
            self._decomposing.append(func)
            try:
                with self, log.stage("decompose"):
                    result = self.decompositions[func](*args, **kwargs)
                    if result is not NotImplemented:
                        result = _eager_layout(func, args, kwargs, result)
            finally:
                self._decomposing.pop()
            if result is not NotImplemented:
                return result
        if func in RANDOM_REPLACEMENTS:
            with self:
                return RANDOM_REPLACEMENTS[func](self.rng, *args, **kwargs)
        out = func(*args, **kwargs)
        node_args, node_kwargs = arguments.map_args(self._arg, args, kwargs)
        node = self.graph.call_function(func, node_args, node_kwargs)
        node.meta["kiln_origin"] = self._origin(func)
        self._bind_outputs(func, node, args, kwargs, out)
        return out

    def _origin(self, func) -> tuple[str, str]:
        """[Note: an op's origin] (the user's op, where in their code): the ATen op this node's is,
        or whose decomposition made it (`embedding` for the gather a decomposition records), and
        "file:line in function" of the torch-level graph's node being run (its `stack_trace`, which
        capture records), or "" (the backward, a graph without one). Passes that rebuild a node copy
        its meta; codegen names both in an index error raised at run time ([Note: index bounds
        checks] in kiln/codegen/lowering_reduce.py)."""
        outer = self._decomposing[0] if self._decomposing else func
        name = getattr(getattr(outer, "overloadpacket", None), "__name__", None) or getattr(outer, "__name__", str(outer))
        try:
            frame = sys._getframe(2)
        except ValueError:     # no Python frames that deep: autograd's device thread (a CUDA backward)
            frame = None
        while frame is not None and not frame.f_code.co_filename.startswith("<eval_with_key>"):
            frame = frame.f_back
        if frame is None:
            return name, ""
        key = (id(frame.f_code), frame.f_lineno)     # a node's location lists the graph's nodes: once a line
        if key not in self._where:
            self._where[key] = fx_node_location(frame) or ""
        return name, self._where[key]

    def _bind_outputs(self, func, node: fx.Node, args, kwargs, out) -> None:
        effects = schema.effects(func)
        root = None
        if effects.view or effects.mutated:
            first = args[0] if args else next(iter(kwargs.values()))
            root = self._root.get(id(first))
        if effects.mutated:
            for i in effects.mutated:
                arg = args[i] if i < len(args) else kwargs.get(func._schema.arguments[i].name)
                if isinstance(arg, torch.Tensor):
                    self.mutated_roots.add(self._root.get(id(arg), None))
        if isinstance(out, torch.Tensor):    # (bind records its metadata)
            self.bind(out, node, root if (effects.view or out is (args[0] if args else None)) else None)
            self.symbols.add_output(node, out)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = tuple(self.record(o, node, i) if isinstance(o, torch.Tensor) else o
                                     for i, o in enumerate(out))
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    self.bind(o, item, root if effects.view else None)
                    self.symbols.add_output(item, o)
        else:
            node.meta["val"] = out
            self.symbols.add_output(node, out)     # a number read from a tensor (`.item()`)


def _eager_layout(func, args, kwargs, result):
    """`result` of a decomposition, copied to the strides eager's kernel gives when they differ.

    [Note: decompositions keep eager's strides] A decomposition computes the right values, but its
    prims may lay them out otherwise (index_select through `index` came out dim-permuted where
    eager's is contiguous). Values alone would do, were it not for what reads strides afterwards:
    `out.view(-1)` of such a result is no view in the traced graph (a copy), so a write through it
    was lost. So the result of a functional op is checked against the op's own meta kernel (run
    on the fake arguments' metadata, cached by the fake mode) and, where their strides differ,
    copied to eager's (the copy usually fuses into its producer). Ops on symbolic sizes are not
    checked: comparing their strides would add guards."""
    if not isinstance(result, FakeTensor) or result._symbolic or func in _LAYOUT_FREE:
        return result     # (a symbolic numel below would be a guard)
    effects = schema.effects(func)
    if result.numel() <= 1 or effects.view or effects.mutated or effects.inplace_view:
        return result
    flat = [a for a in arguments.flatten(args, kwargs)[0] if isinstance(a, torch.Tensor)]
    if not flat or not all(isinstance(a, FakeTensor) and not a._symbolic for a in flat):
        return result
    try:
        with torch._C._DisableTorchDispatch():
            expected = flat[0].fake_mode.run(func, args, kwargs)
    except Exception:
        return result
    if not isinstance(expected, torch.Tensor) or expected.shape != result.shape or expected.dtype != result.dtype:
        return result
    want = [st for n, st in zip(expected.shape, expected.stride()) if n != 1]
    have = [st for n, st in zip(result.shape, result.stride()) if n != 1]
    if want == have or not _dense(expected):
        return result
    from kiln.prims.ops import ops as p
    return p.copy_strided(result, list(expected.stride()))


# Ops whose output strides nothing downstream may rely on differently from what the decomposition
# gives (fresh tensors eager lays out as its inputs, which decompositions already follow).
_LAYOUT_FREE: frozenset = frozenset()


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: a layout a copy can be given."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


@contextlib.contextmanager
def swapped_state(root: torch.nn.Module, stand_ins: dict[int, torch.Tensor]):
    """Replace parameters and buffers (by identity, so tied weights stay tied) for the duration."""
    saved = []
    for module in root.modules():
        for store in (module._parameters, module._buffers):
            for name, value in store.items():
                if value is not None and id(value) in stand_ins:
                    saved.append((store, name, value))
                    store[name] = stand_ins[id(value)]
    try:
        yield
    finally:
        for store, name, value in saved:
            store[name] = value


def lifted_state(gm: torch.nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(kind, qualified name, tensor) of every distinct parameter and buffer of `gm`."""
    state = [("param", n, p) for n, p in gm.named_parameters()]
    state += [("buffer", n, b) for n, b in gm.named_buffers()]
    return state


def real_stand_in(x: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A real copy of x (same strides): tracing then computes for real."""
    if type(x) is not torch.Tensor or x.device.type == "meta":  # already data-free (fake)
        return x.detach().requires_grad_(requires_grad)
    with torch.no_grad():
        if _overlaps(x):   # copy_ refuses to write a layout whose elements share memory: copy its storage span
            extent = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))
            span = x.as_strided((extent,), (1,), x.storage_offset()).clone()
            out = span.as_strided(x.shape, x.stride(), 0)
        else:
            out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)
    return out.requires_grad_(requires_grad)


def fake_stand_in(mode, x: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A fake of x in `mode` (kiln.symbolic): tracing then computes nothing."""
    return mode.from_real(x).detach().requires_grad_(requires_grad)


def _fake_mode_for(example_inputs: list, fake: bool):
    """The fake mode of fake example inputs, else a new one when `fake`, else None."""
    for x in example_inputs:
        mode = getattr(x, "fake_mode", None)
        if mode is not None:
            return mode
    if not fake:
        return None
    from kiln.symbolic import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


class _Faking:
    """`mode` entered for the trace (reusably: forward, then backward), taking the real tensors the
    program makes as constants: a capture's symbolic fakes come with a mode that refuses real
    inputs, and `torch.tensor([])` in traced code (Hugging Face's DynamicCache starts each layer
    with one) reaches the prims' decompositions as a real tensor before any lift to a fake."""

    def __init__(self, mode):
        self.mode, self.allowed = mode, mode.allow_non_fake_inputs

    def __enter__(self):
        self.allowed, self.mode.allow_non_fake_inputs = self.mode.allow_non_fake_inputs, True
        return self.mode.__enter__()

    def __exit__(self, *exc):
        try:
            return self.mode.__exit__(*exc)
        finally:
            self.mode.allow_non_fake_inputs = self.allowed


def _differentiable(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def trace_joint(gm: torch.fx.GraphModule, example_inputs: list, *,
                decompositions: Mapping[Any, Callable] | None = None,
                with_backward: bool | None = None, fake: bool = True, numerics: str = "fast") -> JointGraph:
    """Trace `gm(*example_inputs)` and, when grads are needed, its backward, into one ATen graph.

    with_backward: None traces the backward when grad mode is on and some input or parameter
    requires grad. fake: run on kiln's fake tensors (no compute; symbolic sizes when the example
    inputs are fakes with symbols), else on real copies of the inputs. Fake example inputs are
    always traced in their own fake mode.

    [Note: fake tracing falls back to real] When an op cannot run on fakes (no meta kernel, or a
    gap in kiln's fakes) and the example inputs are real, the trace is redone on real copies: the
    graph is the same for static sizes, only the trace computes for real (`JointGraph.traced_on`
    says which). Not for ops whose output size depends on values (masked_select, nonzero): a real
    trace would bake one input's size into the graph, so those raise, as do `.item()`-like reads:
    a fake trace that made an unbacked symbol ([Note: unbacked sizes]) never falls back.
    """
    real_inputs = not any(hasattr(x, "fake_mode") for x in example_inputs)
    if not fake or not real_inputs:
        return _trace_joint(gm, example_inputs, decompositions, with_backward, fake, numerics)
    from kiln.symbolic import DataDependentOp, MissingMetaKernel
    try:
        return _trace_joint(gm, example_inputs, decompositions, with_backward, True, numerics)
    except DataDependentOp:
        raise
    except MissingMetaKernel as e:
        if torch.Tag.dynamic_output_shape in getattr(e.op, "tags", ()):
            raise NotYetImplemented(f"kiln.aot: {e.op} has an output size that depends on the values of "
                                    "its input, which tracing cannot know; run it eagerly (a graph break)") from e
    except NotYetImplemented:
        raise
    except Exception as e:
        if getattr(e, "kiln_unbacked", False):
            raise
    return dataclasses.replace(_trace_joint(gm, example_inputs, decompositions, with_backward, False, numerics),
                               traced_on="real")


def _traced_rules(numerics: str) -> dict:
    """Torch functions the trace runs through a rule of kiln's instead of their ATen composite;
    under numerics="eager" only those that keep eager's arithmetic ([Note: numerics])."""
    from kiln.aot.rules import linear, lstsq
    from kiln.symbolic.rules import SYMBOLIC_RULES
    rules = dict(SYMBOLIC_RULES)    # attention, matmul: the same branches as ATen's, sizes kept symbolic
    rules[torch.linalg.lstsq] = lstsq   # torch's arithmetic; residuals of a symbolic size need it
    rules[aten._assert_scalar.default] = _assert_scalar
    if numerics != "eager":
        rules[torch.nn.functional.linear] = linear      # one rounding where ATen's bmm + add rounds twice
    return rules


def _assert_scalar(cond, message: str) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    _get_current_dispatch_mode().assert_scalar(cond, message)


@contextlib.contextmanager
def _with_rules(gm: fx.GraphModule, numerics: str):
    """While tracing, gm's calls of `_traced_rules` functions (and matmul methods) go through kiln's
    rules ([Note: attention kernels chosen at the hints], [Note: matmul on symbolic sizes], [Note:
    linear over rows]); gm is restored afterwards."""
    from kiln.symbolic.rules import METHOD_RULES
    rules = _traced_rules(numerics)
    graph = gm.graph if isinstance(gm, fx.GraphModule) else None
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.target in rules
             or n.op == "call_method" and n.target in METHOD_RULES] if graph is not None else []
    if not nodes:
        yield
        return
    originals = [(n.op, n.target) for n in nodes]
    for n in nodes:     # a method call `x.matmul(y)` becomes the rule's call on (x, y)
        n.op, n.target = "call_function", (METHOD_RULES[n.target] if n.op == "call_method" else rules[n.target])
    gm.recompile()
    try:
        yield
    finally:
        for n, (op, target) in zip(nodes, originals):
            n.op, n.target = op, target
        gm.recompile()


def _trace_joint(gm, example_inputs, decompositions, with_backward, fake, numerics) -> JointGraph:
    fake_mode = _fake_mode_for(example_inputs, fake)
    try:
        return _trace_joint_in(fake_mode, gm, example_inputs, decompositions, with_backward, numerics)
    except Exception as e:
        if fake_mode is not None and fake_mode.shape_env.unbacked:
            e.kiln_unbacked = True      # a real trace would bake this call's counts in
        raise


def _trace_joint_in(fake_mode, gm, example_inputs, decompositions, with_backward, numerics) -> JointGraph:
    make_stand_in = real_stand_in if fake_mode is None else functools.partial(fake_stand_in, fake_mode)
    faking = contextlib.nullcontext() if fake_mode is None else _Faking(fake_mode)
    state = lifted_state(gm)
    grad_on = torch.is_grad_enabled()
    if with_backward is None:
        with_backward = grad_on and (any(_differentiable(x) for x in example_inputs)
                                     or any(t.requires_grad for _, _, t in state))
    graph = fx.Graph()
    specs: list[InputSpec] = []
    primals: list[Any] = []    # what autograd differentiates with respect to (leaves)
    visible: list[Any] = []    # what the program sees
    recorder = _Recorder(graph, decompositions or {},
                         RngStream(lambda: _seed_input(recorder, graph, specs, make_stand_in)))

    def add_input(kind: str, name: str, x):
        node = graph.placeholder(f"{kind}_{len(specs)}")
        recorder.symbols.add_input(node, x)
        if not isinstance(x, torch.Tensor):
            node.meta["val"] = x
            specs.append(InputSpec(kind, name))
            primals.append(x)
            visible.append(x)
            return
        if x.layout != torch.strided:
            raise NotYetImplemented(f"kiln.aot traces dense tensors only; input {name} has layout {x.layout}")
        wants_grad = with_backward and grad_on and x.requires_grad and (x.is_floating_point() or x.is_complex())
        leaf = make_stand_in(x, wants_grad)
        # The program sees a non-leaf copy, so in-place writes to it are legal as in eager (where
        # inputs are often non-leaves) and autograd still differentiates w.r.t. the leaf.
        seen = _program_copy(leaf) if wants_grad else leaf
        recorder.bind(leaf, node)
        recorder.bind(seen, node)
        recorder.symbols.add_input(node, leaf)
        specs.append(InputSpec(kind, name, wants_grad, relaid=not _same_layout(seen, leaf)))
        primals.append(leaf)
        visible.append(seen)

    for i, x in enumerate(example_inputs):
        add_input("user", str(i), x)
    for kind, name, t in state:
        add_input(kind, name, t)
    user_args = visible[:len(example_inputs)]
    stand_ins = {id(t): v for (_, _, t), v in zip(state, visible[len(example_inputs):])}

    with swapped_state(gm, stand_ins), _with_rules(gm, numerics), faking, recorder:
        out = gm(*user_args)
    flat_out, out_spec = pytree.tree_flatten(out)
    placeholders = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    mutated = sorted(placeholders[r] for r in recorder.mutated_roots if r in placeholders)
    for root in recorder.mutated_roots:
        if root is not None and root.op == "get_attr":
            raise NotYetImplemented("kiln.aot: the program writes in place into a tensor that is neither an "
                                    "input nor a parameter or buffer (a plain tensor attribute or global); "
                                    "register it with module.register_buffer so the write can be applied")
    # the rng seed placeholder is no program input: it is never mutated
    outputs = [OutputSpec("user", i, _differentiable(o)) for i, o in enumerate(flat_out)]
    outputs += [OutputSpec("mutation", i, _differentiable(visible[i])) for i in mutated]
    values = list(flat_out) + [visible[i] for i in mutated]

    grads: list = []
    if with_backward:
        diff_out = [v for v, s in zip(values, outputs) if s.requires_grad]
        wrt = [(i, p) for i, p in enumerate(primals) if specs[i].requires_grad]
        tangents = []
        for o in diff_out:
            t = make_stand_in(_tangent_like(o), False)
            node = graph.placeholder(f"tangent_{len(specs)}")
            recorder.bind(t, node)
            specs.append(InputSpec("tangent", str(len(tangents))))
            tangents.append(t)
        if diff_out and wrt:
            with faking, recorder, autocast_off():
                got = torch.autograd.grad(diff_out, [p for _, p in wrt], tangents, allow_unused=True)
            for (i, _), g in zip(wrt, got):
                outputs.append(OutputSpec("grad", i))
                grads.append(g)

    with recorder:  # constants met only at the output (a module attribute returned as is)
        out_args = [recorder._arg(v) for v in values + grads]
    graph.output(tuple(out_args))
    root = torch.nn.Module()
    for name, value in recorder.constants.items():
        setattr(root, name, value)
    return JointGraph(graph_module(root, graph), tuple(specs), tuple(outputs), out_spec,
                      traced_on="real" if fake_mode is None else "fake")


def graph_module(root: torch.nn.Module, graph: fx.Graph) -> fx.GraphModule:
    """[Note: graph modules written when read] A GraphModule generates and compiles its Python
    code as it is built: 0.2-0.3 s for a 32-layer decoder, and aot builds several (the joint graph,
    the functional one, forward and backward) that are only walked, or read for their code (cache
    keys) but never run. These are torch.fx's lazy GraphModules, which write the code the first
    time it is read or the module is called (a dolly-shaped decode step's capture-to-program on
    the CPU: 3.6 s of 18.5 in `recompile` before)."""
    return _LazyGraphModule(root, graph)


def _program_copy(leaf: torch.Tensor) -> torch.Tensor:
    """A non-leaf with the leaf's values *and strides*: an output that is a view of the input is
    rebuilt at run time by replaying its traced view steps (prim-level `as_strided` among them)
    on the real input, so the traced input must be laid out as the real one. `clone()` keeps a
    dense layout only: `x[::2].diagonal()` was rebuilt from a contiguous copy's strides (wrong
    elements). A layout whose elements share memory (an expanded input) cannot be copied into, so
    the program sees a view of the leaf there: its gradient is the identity (a view with the same
    shape), and writes into it are refused as eager refuses writes into a leaf or an overlapping
    tensor. Its view outputs take their gradient from the compiled backward, not from replaying
    `as_strided` on the real input, whose backward differs from the view op's on overlapping
    memory (see `aliases_in_function` in runtime.py; fuzz seeds 851, 985, 9067). A symbolic layout
    is cloned: a dense one keeps its strides, another is `InputSpec.relaid`."""
    static = not any(isinstance(x, torch.SymInt) for x in (*leaf.shape, *leaf.stride(), leaf.storage_offset()))
    if not static or leaf.numel() == 0 or (_dense(leaf) and leaf.storage_offset() == 0):
        return leaf.clone()
    if _overlaps(leaf):
        return leaf.view(leaf.shape)
    # the same strides and storage offset (a traced `as_strided` names the offset too)
    span = leaf.storage_offset() + sum((n - 1) * st for n, st in zip(leaf.shape, leaf.stride())) + 1
    return leaf.new_empty(span).as_strided(leaf.shape, leaf.stride(), leaf.storage_offset()).copy_(leaf)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same strides and storage offset, symbolic ones as the same expressions (never a guard)."""
    def layout(t):
        return [x.node.expr if isinstance(x, torch.SymInt) else x for x in (*t.stride(), t.storage_offset())]
    return layout(a) == layout(b)


def _tangent_like(o: torch.Tensor) -> torch.Tensor:
    """A stand-in for the gradient of output `o`. An output whose elements share memory (unfold,
    expand) gets a contiguous tangent: the program copies the incoming gradient into the layout it
    was traced with, and a copy into a self-overlapping layout would keep one value per location
    (eager's autograd never hands such a gradient anyway). A symbolic layout is kept only where
    its strides are those of a dense tensor as expressions: whether (1, 1) over sizes (s0 - 1, 2)
    overlaps is no question a guard should be asked (fuzz seed 1001145's unfold of `x * 2`)."""
    static = all(isinstance(x, int) for x in (*o.shape, *o.stride()))
    if _overlaps(o) if static else not _dense_by_expressions(o):
        return o.new_zeros(o.shape)   # a fake `o` gives a fake
    return torch.zeros_like(o) if type(o) is torch.Tensor else o


def _dense_by_expressions(t: torch.Tensor) -> bool:
    """Strides that are, as expressions, contiguous strides of some order of the dims (size-1 dims
    aside): non-overlapping and dense without asking a guard."""
    def expr(x):
        return x.node.expr if isinstance(x, torch.SymInt) else sympy.Integer(x)
    left = [(expr(st), expr(n)) for n, st in zip(t.shape, t.stride()) if not (isinstance(n, int) and n == 1)]
    expect = sympy.Integer(1)
    while left:
        dim = next((d for d in left if sympy.expand(d[0] - expect) == 0), None)
        if dim is None:
            return False
        left.remove(dim)
        expect = sympy.expand(expect * dim[1])
    return True


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of `t` share a memory location (static layouts only; a symbolic one is
    taken not to)."""
    dims = [(st, n) for n, st in zip(t.shape, t.stride()) if not (isinstance(n, int) and n == 1)]
    if not all(isinstance(x, int) for d in dims for x in d):
        return False
    if any(n == 0 for _, n in dims):
        return False
    reach = 0   # the furthest element the smaller strides reach
    for st, n in sorted(dims):
        if st <= reach:
            return True
        reach += st * (n - 1)
    return False


def _seed_input(recorder: _Recorder, graph: fx.Graph, specs: list[InputSpec], make_stand_in) -> torch.Tensor:
    """Add the rng seed placeholder after the last program input (random ops asked for one)."""
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    if specs and specs[-1].kind == "tangent":
        raise NotYetImplemented("kiln.aot: a random op in the backward graph is not supported")
    with graph.inserting_after(last):
        node = graph.placeholder("rng_seed")
    with torch._C._DisableTorchDispatch():
        seed = make_stand_in(torch.zeros((), dtype=torch.int64), False)
    recorder.bind(seed, node)
    specs.append(InputSpec("rng_seed", "seed"))
    return seed


@contextlib.contextmanager
def autocast_off():
    """Turn off autocast on every device where it is on. Backward runs outside autocast in eager
    (it is called after the autocast block), and a traced graph runs without it (see
    [Note: compiled graphs run with autocast off] in runtime.py)."""
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield
