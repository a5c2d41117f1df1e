"""Variable trackers: the symbolic values on the interpreter's stack and in its locals.

Each tracker is plain data: what kind of Python value it stands for, its parts (as trackers), and
its `source` when it was read from the frame's inputs (so specializing on it yields a guard and
generated code can re-read it). Behaviour (attribute reads, calls, operators) lives in tables keyed
by tracker class in `semantics.py`, `builtins.py` and `torch_calls.py`, not in methods here.
Containers are mutable trackers; mutating one that has a source records a side effect to replay.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch

from kiln.capture.sources import Source


@dataclasses.dataclass(eq=False)
class Variable:
    source: Source | None = dataclasses.field(default=None, kw_only=True)

    def python_type(self) -> type:
        raise NotImplementedError(type(self).__name__)

    def is_constant(self) -> bool:
        return False


@dataclasses.dataclass(eq=False)
class Constant(Variable):
    """Numbers, strings, None, dtypes, devices, ranges, slices, Ellipsis: values folded into the graph."""
    value: Any

    def python_type(self):
        return type(self.value)

    def is_constant(self):
        return True


@dataclasses.dataclass(eq=False)
class TensorVar(Variable):
    node: torch.fx.Node
    example: torch.Tensor
    # an input whose `.data` the program replaced: `node` computes its new data, and the tensor
    # itself is still the input object ([Note: .data = ...] in attributes.py)
    data_replaced: bool = False

    def python_type(self):
        return self.node.meta.get("python_type", torch.Tensor)


@dataclasses.dataclass(eq=False)
class NdarrayVar(Variable):
    """A NumPy array (or NumPy scalar, `scalar`) that stands for a tensor in the graph: NumPy code on
    tensors is traced as torch ops (`numpy_calls.py`). `example` is the tensor's example value."""
    node: torch.fx.Node
    example: torch.Tensor
    scalar: bool = False

    def python_type(self):
        import numpy as np
        dtype = np.dtype(str(self.example.dtype).removeprefix("torch."))
        return dtype.type if self.scalar else np.ndarray


@dataclasses.dataclass(eq=False)
class SymNumber(Variable):
    """A Python number that lives in the graph (e.g. `tensor.item()` captured): a node, not a value."""
    node: torch.fx.Node
    example: Any

    def python_type(self):
        return type(self.example)


@dataclasses.dataclass(eq=False)
class SliceVar(Variable):
    """A slice whose bounds include sizes that live in the graph (`mask[s - t:s]` with dynamic dims)."""
    items: list      # start, stop, step trackers

    def python_type(self):
        return slice


@dataclasses.dataclass(eq=False)
class Null(Variable):
    """The NULL CPython pushes below a callable for CALL."""

    def python_type(self):
        return type(None)


@dataclasses.dataclass(eq=False)
class ListVar(Variable):
    """A list, or a `collections.deque` (`cls`, with its `maxlen`)."""
    items: list
    cls: type = list
    maxlen: int | None = None
    attrs: dict = dataclasses.field(default_factory=dict)  # instance attributes of a user's subclass

    def python_type(self):
        return self.cls


@dataclasses.dataclass(eq=False)
class TupleVar(Variable):
    items: list
    cls: type = tuple  # tuple, torch.Size, a namedtuple class, or a user's subclass
    attrs: dict = dataclasses.field(default_factory=dict)  # instance attributes of a user's subclass

    def python_type(self):
        return self.cls

    def is_constant(self):
        return all(i.is_constant() for i in self.items)


@dataclasses.dataclass(eq=False)
class DictVar(Variable):
    """Keys are Python values (constants, trackers of objects hashed by identity, `ValueKey`s: see
    `keys.py`; `key_var` gives a key's tracker back); values are trackers.
    `cls` is dict or a subclass (OrderedDict, defaultdict with its `default_factory`, a user's);
    `attrs` are the instance attributes of a user's subclass made in traced code (`self.x = x` in
    its `__init__`)."""
    items: dict
    cls: type = dict
    default_factory: Variable | None = None
    attrs: dict = dataclasses.field(default_factory=dict)

    def python_type(self):
        return self.cls


class ValueKey:
    """A dict key or set member that Python hashes by value but kiln cannot fold to a constant: an
    object of a user's class with its own `__hash__`/`__eq__` (a frozen dataclass), or a tuple (a
    namedtuple) holding an object hashed by identity. `shadow` is a real Python value standing for
    it (the same class, its constant attributes; an identity-hashed part is its tracker), so the
    class's own `__hash__` and `__eq__` run on it as Python runs them, at capture time. `var` is the
    tracker the program holds: iterating the dict gives it back, and a lookup with the same tracker
    is found by identity first, as CPython's dict compares `is` before `==`. `fail(exc)` turns an
    exception of the user's `__eq__`/`__hash__` into one raised in the traced code."""
    __slots__ = ("var", "shadow", "hash", "fail")

    def __init__(self, var: Variable, shadow: Any, hash_: int, fail):
        self.var, self.shadow, self.hash, self.fail = var, shadow, hash_, fail

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        if isinstance(other, ValueKey):
            if other.var is self.var:
                return True
            other = other.shadow
        try:
            return self.shadow == other
        except Exception as e:
            self.fail(e)


def key_var(k: Any) -> Variable:
    """The tracker for a key of `DictVar.items` (or `SetVar.keys`): a constant's, or the tracker itself."""
    if isinstance(k, ValueKey):
        return k.var
    return k if isinstance(k, Variable) else Constant(k)


@dataclasses.dataclass(eq=False)
class SetVar(Variable):
    """A set or frozenset. `keys` is a real set of the members' keys (Python values; a tensor is keyed
    by its tracker, as `Tensor.__hash__` is by identity), so iteration order and set algebra are
    Python's own; `members` maps each key to the tracker that was added."""
    keys: set = dataclasses.field(default_factory=set)
    members: dict = dataclasses.field(default_factory=dict)
    cls: type = set
    attrs: dict = dataclasses.field(default_factory=dict)  # instance attributes of a user's subclass

    @property
    def items(self) -> list:
        return [self.members[k] for k in self.keys]

    def python_type(self):
        return self.cls


@dataclasses.dataclass(eq=False)
class MappingProxyVar(DictVar):
    """`types.MappingProxyType(d)`: a read-only view of the dict tracker `target`, whose `items` it
    shares (the same Python dict), so a write to `d` is seen through the proxy, as in Python; reads
    go through every path a dict's do, writes through it raise TypeError (`semantics.dict_set`)."""
    target: DictVar | None = None


@dataclasses.dataclass(eq=False)
class DictViewVar(Variable):
    """`d.keys()`, `d.values()` or `d.items()` of a dict tracker; live (see `views.py`)."""
    dict: DictVar
    kind: str  # "keys" | "values" | "items"

    def python_type(self):
        return VIEW_TYPES[self.kind]


VIEW_TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}


@dataclasses.dataclass(eq=False)
class IteratorVar(Variable):
    """Iterators over a known sequence of trackers (list/tuple/range/zip/enumerate/map/generators).
    Over a dict view, `items` are the keys and `view` gives each value when reached (`views.py`);
    step it with `generators.advance`."""
    items: list
    index: int = 0
    view: DictViewVar | None = None
    size: int = 0  # the dict's length when the iterator over its view was made
    hinted: bool = False  # over a builtin container (list, tuple, set, dict, range, str): has `__length_hint__`

    def python_type(self):
        return types.GeneratorType


@dataclasses.dataclass(eq=False)
class GeneratorVar(Variable):
    """A generator made by calling a generator function in traced code: its own frame (a `Tracer`),
    run to its next `yield` each time it is stepped ([Note: lazy generators] in `generators.py`)."""
    frame: Any
    state: str = "created"   # "created" | "suspended" | "running" | "done" | "broken"
    result: Variable | None = None   # what the frame returned, once "done"
    drained: list | None = None   # the items it had left when the frame returned it ([Note: drained generators])
    # (offset, where) of the root frame's instruction that first stepped it ([Note: a paused
    # generator started natively] in convert.py)
    first_step: tuple | None = None

    def python_type(self):
        return types.GeneratorType


@dataclasses.dataclass(eq=False)
class LazyIteratorVar(Variable):
    """An iterator kiln builds over a generator (`zip`, `map`, `enumerate`, `filter`, itertools):
    `items` is a real iterator that makes each item (a tracker) only when asked, stepping the
    generator then (`iterators.py`). `cls` is the type Python's own iterator would have."""
    items: Any
    cls: type
    drained: list | None = None   # the items it had left when the frame returned it ([Note: drained generators])

    def python_type(self):
        return self.cls


ITERATORS = (IteratorVar, GeneratorVar, LazyIteratorVar)   # what `generators.advance` steps


@dataclasses.dataclass(eq=False)
class Cell(Variable):
    """A closure cell: created inside traced code, or standing for `real`, a cell of an existing
    function (one tracker per real cell, so a `nonlocal` write in one inlined call is seen by the
    next, and is written back after the graph)."""
    contents: Variable | None = None
    real: Any = None


@dataclasses.dataclass(eq=False)
class FunctionVar(Variable):
    """A Python function: an existing one (`fn`), or one made by MAKE_FUNCTION in traced code."""
    code: types.CodeType
    globals: dict
    name: str
    defaults: tuple = ()
    kwdefaults: dict = dataclasses.field(default_factory=dict)
    closure: tuple = ()  # of Cell trackers, or real cells for existing functions
    fn: Any = None  # the real function when it exists
    # attributes set on a function made in traced code (functools.wraps sets `__qualname__`,
    # `__wrapped__`, ...); also what its `__dict__` shows
    attrs: dict = dataclasses.field(default_factory=dict)

    def python_type(self):
        return types.FunctionType


@dataclasses.dataclass(eq=False)
class MethodVar(Variable):
    fn: Variable
    self_var: Variable

    def python_type(self):
        return types.MethodType


@dataclasses.dataclass(eq=False)
class WeakRefVar(Variable):
    """`weakref.ref(obj)` made in traced code: calling it gives `referent` (alive: the frame holds it)."""
    referent: Variable

    def python_type(self):
        import weakref
        return weakref.ReferenceType


@dataclasses.dataclass(eq=False)
class PartialVar(Variable):
    fn: Variable
    args: list
    kwargs: dict

    def python_type(self):
        import functools
        return functools.partial


@dataclasses.dataclass(eq=False)
class ObjectVar(Variable):
    """An existing Python object kiln does not model in detail: modules of Python, classes,
    builtins, torch functions, user objects, nn.Modules. Attributes are read from the real object."""
    value: Any

    def python_type(self):
        return type(self.value)

    def is_constant(self):
        return isinstance(self.value, (types.ModuleType, type, types.BuiltinFunctionType))


@dataclasses.dataclass(eq=False)
class NewObjectVar(Variable):
    """An instance of a user class created inside traced code (dataclasses, plain classes)."""
    cls: type
    attrs: dict

    def python_type(self):
        return self.cls


@dataclasses.dataclass(eq=False)
class SuperVar(Variable):
    cls: type
    obj: Variable

    def python_type(self):
        return super


@dataclasses.dataclass(eq=False)
class ContextVar(Variable):
    """A context manager kiln models: grad mode and autocast."""
    kind: str  # "grad" | "autocast"
    args: tuple
    saved: Any = None

    def python_type(self):
        return object


@dataclasses.dataclass(eq=False)
class ExceptionVar(Variable):
    """An exception made or raised in traced code. `attrs` holds what was set on it: the chaining
    attributes (`__context__`, set when it is raised while another is handled, `__cause__` and
    `__suppress_context__` by `raise ... from ...`), `__traceback__` (kiln keeps no tracebacks: None
    unless the program set one), `__notes__`, and any attribute the program set."""
    cls: type
    args: list
    attrs: dict = dataclasses.field(default_factory=dict)
    raised: bool = False   # raised once: CPython gave it a traceback, which kiln does not keep

    def python_type(self):
        return self.cls


def is_not_implemented(v: Variable) -> bool:
    """Whether `v` is NotImplemented (a constant, or the builtin read as an object)."""
    return isinstance(v, (Constant, ObjectVar)) and v.value is NotImplemented


def is_tensor(v: Variable) -> bool:
    return isinstance(v, TensorVar)
