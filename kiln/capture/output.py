"""The output of one capture: the FX graph being built, its inputs, guards and side effects.

`OutputGraph` is shared by a root `Tracer` and every frame it inlines. It owns:
- the torch-level `torch.fx.Graph` (placeholders are tensors read from sources, parameters and
  buffers of modules are `get_attr` nodes on the graph's root module, and so is a constant argument
  that FX could only print as an unreadable repr: `torch.nn.attention.SDPBackend.MATH`, a pybind
  enum, would print as `<SDPBackend.MATH: 0>`);
- the guards recorded while specializing;
- side effects on objects that outlive the frame, replayed in program order after the graph runs;
- the globals dicts that generated code reads (`__G` is the captured frame's).
"""
from __future__ import annotations

import dataclasses
import enum
import operator
import re
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from kiln.capture import controls
from kiln.capture.examples import Examples
from kiln.capture import variables as V
from kiln.capture.guards import Guard, GuardKind, TensorSpec
from kiln.capture.sources import Source
from kiln.symbolic.rules import METHOD_RULES


@dataclasses.dataclass(frozen=True)
class AttrWrite:
    target: V.Variable
    name: str
    value: V.Variable
    past_hook: bool = False   # the class's own __setattr__ ran while tracing: replayed as object's store


@dataclasses.dataclass(frozen=True)
class AttrDelete:
    """`del target.name` of the program's own object."""
    target: V.Variable
    name: str


@dataclasses.dataclass(frozen=True)
class CellWrite:
    """A write into a cell of an existing function (`nonlocal x; x = ...`)."""
    cell: V.Cell
    value: V.Variable


@dataclasses.dataclass(frozen=True)
class GlobalWrite:
    globals_name: str
    name: str
    value: V.Variable


@dataclasses.dataclass(frozen=True)
class ContainerMutation:
    """A list/dict/set with a source changed: its final contents are written back."""
    target: V.Variable


@dataclasses.dataclass(frozen=True)
class DeferredCall:
    """A diagnostics call (logging, warnings) met in traced code: replayed after the graph, in order."""
    fn: Any
    args: tuple
    kwargs: tuple  # (name, Variable) pairs


class OutputGraph:
    def __init__(self, frame_globals: dict, dynamic: bool | None = None, dynamic_dims: frozenset = frozenset(),
                 changing_sizes: tuple = (frozenset(), frozenset()), dynamic_ints: frozenset = frozenset(),
                 token_dims: bool = False):
        self.graph = torch.fx.Graph()
        self.attrs: dict[str, torch.Tensor] = {}  # get_attr target -> real tensor
        self._attr_names: dict[int, str] = {}
        self.const_attrs: dict[str, Any] = {}  # get_attr target -> a constant FX cannot print
        self.inputs: list[tuple[Source, V.TensorVar]] = []
        self.input_values: dict[torch.fx.Node, torch.Tensor] = {}  # placeholder -> this call's tensor
        self.mask_verdicts: dict[torch.fx.Node, str | None] = {}  # [Note: mask elision] in masks.py
        self.tensor_by_id: dict[int, V.Variable] = {}  # one tracker per real tensor, list, dict (aliasing)
        self.guards: list[Guard] = []
        self.side_effects: list[Any] = []
        self.globals_dicts: dict[str, dict] = {"__G": frame_globals}
        self._globals_ids = {id(frame_globals): "__G"}
        self.dynamic = dynamic
        self.dynamic_dims = dynamic_dims  # (source, dim) pairs that changed between compilations
        self.changing_sizes = changing_sizes  # [Note: sizes that change together] in frame.py
        self.dynamic_ints = dynamic_ints  # int sources seen to change: [Note: ints that change]
        self.token_dims = token_dims      # [Note: token dims of a model-calling method] in api.py
        self._requires_grad_guards: list[Guard] = []   # [Note: requires_grad under no_grad]
        self.grad_enabled = torch.is_grad_enabled()
        self.getitem_to_index = 0  # open TransformGetItemToIndex regions (`semantics.getitem`)
        self.guard(Guard(GuardKind.GRAD_MODE, None, self.grad_enabled))
        from kiln.capture.guards import autocast_state, global_state
        self.guard(Guard(GuardKind.AUTOCAST, None, autocast_state()))
        self.guard(Guard(GuardKind.GLOBAL_STATE, None, global_state()))
        self.keepalive: list[Any] = []  # real objects whose identity guards rely on
        self.examples = Examples()
        self.instructions = 0  # interpreted so far, all frames together
        self.current = None    # the Tracer at work: guards and shape guards name its line
        self.generators: list[V.GeneratorVar] = []  # made in traced code: [Note: lazy generators]
        self.examples.shape_env.locate = self.where

    def where(self) -> str | None:
        """The user's line being interpreted ("file:line in fn"), or None outside the trace."""
        return self.current.where() if self.current is not None else None

    def globals_name(self, g: dict) -> str:
        name = self._globals_ids.get(id(g))
        if name is None:
            name = self._globals_ids[id(g)] = f"__G{len(self.globals_dicts)}"
            self.globals_dicts[name] = g
        return name

    def guard(self, guard: Guard):
        self.guards.append(guard)

    # -- graph inputs ---------------------------------------------------------------------------
    def _placeholder(self, source: Source) -> torch.fx.Node:
        node = self.graph.placeholder(_identifier(source.expr()))
        # placeholders go first: move it before any non-placeholder node
        first_op = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first_op is not None:
            first_op.prepend(node)
        return node

    def tensor_input(self, value: torch.Tensor, source: Source) -> V.TensorVar:
        node = self._placeholder(source)
        name = node.name  # unique in the graph, so unique in the ShapeEnv
        dims = self.dynamic_dims_of(source, value)
        example = self.examples.from_real(value, name, dims)
        node.meta["example_value"] = example
        node.meta["python_type"] = type(value)
        node.meta["source"] = source
        var = V.TensorVar(node, example, source=source)
        self.inputs.append((source, var))
        self.input_values[node] = value
        # isinstance(x, nn.Parameter) and friends were answered from this type
        self.guard(Guard(GuardKind.TYPE, source, type(value)))
        sizes = tuple(None if d in dims and n > 1 else n for d, n in enumerate(value.size()))
        strides = tuple(s if isinstance(s, int) else None for s in example.stride())
        self.guard(Guard(GuardKind.TENSOR, source, TensorSpec(
            value.dtype, value.device, sizes, strides, value.requires_grad, tuple(value.size())), where=self.where()))
        return var

    def int_input(self, value: int, source: Source) -> V.Variable:
        """[Note: ints that change] An int argument that changed between calls (Funnel's
        `relative_pos(pos, stride, shift=...)`) is a graph input with a symbol, as torch.compile's
        automatic dynamic makes such ints symbolic on their recompile: one more graph, not one per
        value. 0, 1 and negative values stay constants (the ShapeEnv's symbols are >= 2); code that
        needs the number itself (`range(n)`) specializes it, a shape guard (n == 4)."""
        node = self._placeholder(source)
        example = self.examples.shape_env.create_symint(value, node.name)
        if isinstance(example, int):
            self.graph.erase_node(node)
            self.guard(Guard(GuardKind.CONST, source, value))
            return V.Constant(value, source=source)
        node.meta["example_value"] = example
        node.meta["python_type"] = int
        node.meta["source"] = source
        var = V.SymNumber(node, example, source=source)
        self.inputs.append((source, var))
        self.input_values[node] = value
        self.guard(Guard(GuardKind.TYPE, source, int))
        return var

    def dynamic_dims_of(self, source: Source, value: torch.Tensor) -> tuple[int, ...]:
        """The dims of input `value` traced with symbols. Dims the user marked
        (`mark_dynamic` / `maybe_mark_dynamic`, read by controls.py) are symbolic from
        the first compile, `mark_static` ones never, whatever `dynamic` says, as under torch.compile."""
        if value.dim() == 0:
            return ()
        marks = controls.dim_marks(value)
        if self.dynamic is False:
            dims = ()
        elif self.dynamic is True:
            dims = tuple(range(value.dim()))
        else:
            sizes, known = self.changing_sizes
            tokens = self.token_dims and not value.is_floating_point() and not value.is_complex()
            dims = tuple(d for d in range(value.dim()) if (source, d) in self.dynamic_dims
                         or source not in known and value.size(d) in sizes
                         or tokens and (d > 0 or value.dim() == 1))
        configured = controls.configured_dynamic(source, value.dim())
        if configured:
            dims = tuple(d for d in range(value.dim()) if d in dims or d in configured)
        if marks is controls.NO_MARKS:
            return dims
        return tuple(d for d in range(value.dim()) if (d in dims or d in marks.dynamic) and d not in marks.static)

    def release(self) -> None:
        """Drop what the trace held of this call's objects once its entry is built: the compiled
        code must not keep the caller's tensors (or their storages) alive after the call, as eager
        does not (test_release_input_memory of the Dynamo suite). The graph keeps its fake
        example values; the real tensors they were made from are forgotten."""
        self.examples.mode.forget_reals()
        self.examples.shape_env.locate = None
        self.input_values.clear()
        self.tensor_by_id.clear()

    def specialized_marked_dims(self) -> list[str]:
        """Dims `mark_dynamic` marked that the trace specialized to a constant (code compared the
        size with a number, `range(x.size(0))`): each said as `source.size()[d] == n at line`.
        torch.compile refuses such a trace (ConstraintViolationError); `maybe_mark_dynamic` allows it."""
        env, found = self.examples.shape_env, []
        for source, var in self.inputs:
            if not isinstance(var, V.TensorVar) or var.node not in self.input_values:
                continue
            strict = controls.dim_marks(self.input_values[var.node]).strict
            for d in sorted(strict):
                size = var.example.size(d)
                if not isinstance(size, torch.SymInt) or not getattr(size.node.expr, "is_Symbol", False):
                    continue
                symbol = size.node.expr
                if env.simplify(symbol).is_number:
                    where = next((g.user_location for g in env.guards
                                  if symbol in g.expr.free_symbols and g.user_location), None)
                    found.append(f"{source.expr()}.size()[{d}] == {env.simplify(symbol)}"
                                 + (f" at {where}" if where else ""))
        return found

    @property
    def grad_enabled(self) -> bool:
        """The grad mode at this point of the trace."""
        return self._grad_enabled

    @grad_enabled.setter
    def grad_enabled(self, enabled: bool) -> None:
        self._grad_enabled = enabled
        if enabled:       # [Note: requires_grad under no_grad]: from here on the flags decide the graph
            for guard in self._requires_grad_guards:
                self.guard(guard)
            self._requires_grad_guards.clear()

    def parameter(self, value: torch.Tensor, source: Source) -> V.TensorVar:
        """A parameter or buffer of a module: a `get_attr` node sharing the real tensor. Its
        identity is guarded where it is read (attributes.py), and its `requires_grad` here: a
        graph traced with a buffer that did not require grad differentiates nothing through it,
        and a buffer written with a value that requires grad (`buf.add_(param)`) requires grad
        from then on, as a parameter frozen with `requires_grad_(False)` stops."""
        from kiln.capture.sources import AttrSource, ConstSource
        if not isinstance(source, ConstSource):
            # [Note: requires_grad under no_grad] With grad mode off, no op records a backward, so
            # the parameters' flags change nothing the graph computes: a trace that never turns grad
            # mode on guards none of them (a decoding step's 200 conditions of a 22-layer LLaMA, paid
            # on every token); one that does (`torch.enable_grad()` inside) guards them from then on,
            # every parameter read before included. The entry's grad-mode guard keeps the rest
            # honest, and a user's own read of `p.requires_grad` is guarded where it is read.
            guard = Guard(GuardKind.CONST, AttrSource(source, "requires_grad"), value.requires_grad)
            if self.grad_enabled:
                self.guard(guard)
            else:
                self._requires_grad_guards.append(guard)
            # the graph reads it at its traced metadata ([Note: module tensors' metadata])
            self.guard(Guard(GuardKind.STATE_TENSOR, source, TensorSpec(
                value.dtype, value.device, tuple(value.size()), tuple(value.stride()), None)))
        name = self._attr_names.get(id(value))
        if name is None:
            name = _identifier(source.expr().replace("._parameters[", ".").replace("._buffers[", ".")
                               .replace("._modules[", "."))
            while name in self.attrs:
                name += "_"
            self.attrs[name] = value
            self._attr_names[id(value)] = name
        node = self.graph.get_attr(name)
        example = self.examples.from_real(value, "attr_" + name)
        node.meta["example_value"] = example
        node.meta["python_type"] = type(value)
        return V.TensorVar(node, example, source=source)

    # -- ops ------------------------------------------------------------------------------------
    def call(self, kind: str, target: Any, args: tuple, kwargs: dict, example_fn=None) -> Any:
        """Add a node; returns (node, example result). `args` hold nodes and constants."""
        args, kwargs = self._readable_constants(args), self._readable_constants(kwargs)
        node = self.graph.create_node(kind, target, args, kwargs)
        if self.current is not None:  # FX's convention: later stages name the user's line from it
            node.meta["stack_trace"] = self.current.stack_trace()
            for a in node.all_input_nodes:   # where an input is first used: recompile messages say it
                if a.op == "placeholder" and "first_use" not in a.meta:
                    a.meta["first_use"] = self.current.user_where()
        # map_arg, not pytree: it also looks inside slices (`x[s - t:s]` with symbolic bounds)
        ex_args, ex_kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["example_value"])
        try:
            if kind == "call_method" and target in METHOD_RULES:
                result = self.examples.run(METHOD_RULES[target], ex_args, ex_kwargs)
            elif kind == "call_method":
                result = self.examples.run(getattr(ex_args[0], target), ex_args[1:], ex_kwargs)
            else:
                result = self.examples.run(target, ex_args, ex_kwargs)
        except BaseException:
            self.graph.erase_node(node)      # a call that cannot run leaves no node without a value
            raise
        node.meta["example_value"] = result
        return node, result

    def drop_cancelling_grad_switches(self, entry_mode: bool) -> None:
        """Erase a grad-mode switch away from the mode in force followed at once by the switch back
        (`with torch.no_grad(): pass`, a context exited with nothing inside): they do nothing, and
        Dynamo erases them the same way, so graph and op counts agree with its."""
        mode = entry_mode
        nodes = list(self.graph.nodes)
        erased: set = set()
        for first, second in zip(nodes, nodes[1:]):
            if first.target is torch._C._set_grad_enabled and first.args == (not mode,) and first not in erased:
                mode = first.args[0]
                if second.target is torch._C._set_grad_enabled and second.args == (not mode,):
                    mode = second.args[0]
                    erased.update((first, second))
        for node in erased:
            self.graph.erase_node(node)

    def _readable_constants(self, value: Any) -> Any:
        """`value` with each constant FX would print unreadably (its repr starts with `<`) replaced
        by a `get_attr` node of the root holding it: the graph's code must compile and run."""
        if isinstance(value, (torch.fx.Node, enum.Enum, str, int, float, complex, type(None))):
            return value
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            items = [self._readable_constants(v) for v in value]
            return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
        if isinstance(value, dict):
            return {k: self._readable_constants(v) for k, v in value.items()}
        if isinstance(value, (tuple, slice, torch.dtype, torch.device, torch.layout, torch.memory_format,
                              torch.Tensor)) or not repr(value).startswith("<"):
            return value
        name = next((n for n, v in self.const_attrs.items() if v is value), None)
        if name is None:
            name = f"_const_{_identifier(type(value).__name__)}_{len(self.const_attrs)}"
            self.const_attrs[name] = value
        node = self.graph.get_attr(name)
        node.meta["example_value"] = value
        return node

    def getitem(self, node: torch.fx.Node, index: int, example: Any) -> torch.fx.Node:
        item = self.graph.call_function(operator.getitem, (node, index))
        item.meta["example_value"] = example
        return item

    def graph_module(self) -> torch.fx.GraphModule:
        root = torch.nn.Module()
        for name, value in self.attrs.items():
            # get_attr targets must resolve on the root; nest through dotted names
            *path, leaf = name.split(".")
            mod = root
            for p in path:
                if not hasattr(mod, p):
                    mod.add_module(p, torch.nn.Module())
                mod = getattr(mod, p)
            if isinstance(value, torch.nn.Parameter):
                mod.register_parameter(leaf, value)
            else:
                mod.register_buffer(leaf, value)
        for name, value in self.const_attrs.items():
            setattr(root, name, value)
        gm = torch.fx.GraphModule(root, self.graph)
        return gm


def _identifier(text: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_") or "x"
    if name[0].isdigit():
        name = "_" + name
    return name.replace("__", "_")
