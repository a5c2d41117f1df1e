"""Sources: where a value that capture read came from, as a path from the frame's arguments or globals.

A `Source` is what turns a specialization into a guard (`guards.py` prints `source.expr()` into the
guard function) and what lets generated code re-read a value at run time (graph inputs, values
rebuilt after a graph break). Sources are plain frozen dataclasses; `expr()` is their one printer.
In printed code the frame's arguments are locals of the same name and globals are reached through
`__G` (the function's globals dict), so names never collide with kiln's helpers.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

# [Note: keys printed by reference] A key whose repr is no expression (an Enum member:
# `<Color.RED: 1>`) is printed as `__kiln_keys[i]`, an index into this list, which every namespace
# kiln execs generated code in binds (convert.compile_source, guards.py). Members are never
# removed: an index stays valid for every entry that printed it (enum members live as long as
# their class, which the program's own dicts hold anyway).
KEYS: list = []
_KEY_INDEX: dict[int, int] = {}


def key_text(key: Any) -> str:
    """`key` as an expression in generated code: its repr, or a reference to it (see the Note)."""
    if isinstance(key, enum.Enum):
        i = _KEY_INDEX.get(id(key))
        if i is None:
            i = _KEY_INDEX[id(key)] = len(KEYS)
            KEYS.append(key)
        return f"__kiln_keys[{i}]"
    return repr(key)


@dataclasses.dataclass(frozen=True)
class Source:
    def expr(self) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        return self.expr().replace("__G[", "globals()[")


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    """An argument of the captured frame."""
    name: str

    def expr(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class GlobalSource(Source):
    name: str
    globals_name: str = "__G"  # "__G" is the captured frame's globals; "__G1".. those of inlined modules

    def expr(self) -> str:
        return f"{self.globals_name}[{self.name!r}]"


@dataclasses.dataclass(frozen=True)
class AttrSource(Source):
    """`base.attr`. `base.__dict__` is read as object's own lookup does
    (`__kiln_object_getattribute(base, '__dict__')`, bound wherever kiln execs generated code):
    capture reads an instance dict only to model object's lookup, and a class with its own
    `__getattribute__` in Python (transformers' configs) would otherwise run it on every read,
    about a microsecond each (60 us of guards a LLaMA decode step)."""
    base: Source
    attr: str

    def expr(self) -> str:
        if self.attr == "__dict__":
            return f"__kiln_object_getattribute({self.base.expr()}, '__dict__')"
        return f"{self.base.expr()}.{self.attr}"


@dataclasses.dataclass(frozen=True)
class DictEntrySource(Source):
    """`base.__dict__`-like storage read directly (e.g. `module._modules['fc']`): skips slow
    `nn.Module.__getattr__` in guards, where every nanosecond is paid on each call."""
    base: Source
    table: str
    key: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.table}[{key_text(self.key)}]"


@dataclasses.dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: Any

    def expr(self) -> str:
        return f"{self.base.expr()}[{key_text(self.key)}]"

    def __hash__(self):  # slices (`out[1:]`) do not hash before Python 3.12
        key = (slice, self.key.start, self.key.stop, self.key.step) if isinstance(self.key, slice) else self.key
        return hash((self.base, key))


@dataclasses.dataclass(frozen=True)
class KeyedItemSource(Source):
    """`base[key]` where the key is an object a guard cannot print but another source reads (a dict
    keyed by instances, looked up by an argument: `REF[a]`): the lookup is made again with that
    source's object, so a call with another key object reads its own item."""
    base: Source
    key: Source

    def expr(self) -> str:
        return f"{self.base.expr()}[{self.key.expr()}]"


@dataclasses.dataclass(frozen=True)
class BuiltinItemSource(Source):
    """`base[key]` by the builtin container's own lookup (`dict.__getitem__(base, key)`), past a
    subclass's `__getitem__`, which may build a new object on each read (transformers' ACT2FN)."""
    base: Source
    key: Any
    container: str  # "dict" | "list" | "tuple"

    def expr(self) -> str:
        return f"{self.container}.__getitem__({self.base.expr()}, {key_text(self.key)})"


@dataclasses.dataclass(frozen=True)
class ClosureSource(Source):
    """The contents of cell `index` of a function's closure."""
    fn: Source
    index: int

    def expr(self) -> str:
        return f"{self.fn.expr()}.__closure__[{self.index}].cell_contents"


@dataclasses.dataclass(frozen=True)
class DefaultSource(Source):
    fn: Source
    index: int | str  # positional default index, or keyword-only default name

    def expr(self) -> str:
        if isinstance(self.index, str):
            return f"{self.fn.expr()}.__kwdefaults__[{self.index!r}]"
        return f"{self.fn.expr()}.__defaults__[{self.index}]"


@dataclasses.dataclass(frozen=True)
class ViewDictSource(Source):
    """The dict a dict view (`d.keys()`) looks at. A view has no attribute for it (`.mapping` is a
    read-only proxy); CPython hands it to the garbage collector as the view's one referent."""
    base: Source

    def expr(self) -> str:
        return f"__import__('gc').get_referents({self.base.expr()})[0]"


@dataclasses.dataclass(frozen=True)
class TypeSource(Source):
    base: Source

    def expr(self) -> str:
        return f"type({self.base.expr()})"


@dataclasses.dataclass(frozen=True)
class NumpyTensorSource(Source):
    """`torch.from_numpy(base)`: the tensor view of a NumPy array the frame reads, the graph's input
    for it ([Note: NumPy as torch ops] in numpy_calls.py). `__kiln_from_numpy` is bound wherever
    kiln execs generated code, as `__kiln_keys` is."""
    base: Source

    def expr(self) -> str:
        return f"__kiln_from_numpy({self.base.expr()})"


@dataclasses.dataclass(frozen=True)
class WeakRefCallSource(Source):
    """`base()`: what a weak reference the frame reads refers to now (None once it died)."""
    base: Source

    def expr(self) -> str:
        return f"{self.base.expr()}()"


@dataclasses.dataclass(frozen=True)
class ConstSource(Source):
    """A value kiln holds itself (a module kiln imported, a resume function): no guard needed."""
    name: str

    def expr(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class PinnedSource(Source):
    """The object a guard function holds as `__p<index>`, checked elsewhere to be what a read gives
    ([Note: settled module state] in settled.py)."""
    index: int

    def expr(self) -> str:
        return f"__p{self.index}"


def root_of(source: Source) -> Source:
    while hasattr(source, "base") or hasattr(source, "fn"):
        source = getattr(source, "base", None) or getattr(source, "fn")
    return source
