"""Guards: the conditions under which a captured graph may be reused, derived from sources.

Capture records a `Guard` whenever it specializes on a value it read (its type, its identity, a
constant, a tensor's metadata, a container's length, the grad mode). `compile_guards` prints all of
an entry's guards into ONE Python function with the frame's own signature, so a cache hit costs one
call and a chain of `and`s. `failure_finder` prints them once more, each in its own `try`, into a
function that returns the index of the first guard that fails: on a miss only, to say which guard
missed (recompile messages, the cache-limit warning, `kiln.explain`; see recompiles.py).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable

import torch
from torch.utils.hooks import RemovableHandle

from kiln.capture.sources import KEYS, AttrSource, DictEntrySource, GlobalSource, Source
from kiln.runtime.module_writes import MODULE_WRITES, TENSOR_WRITES


class GuardKind(enum.Enum):
    TYPE = "type"            # type(value) is T
    ID = "id"                # value is obj (modules, functions, classes)
    CONST = "const"          # value == constant (ints, strings, ...), type included
    TENSOR = "tensor"        # dtype, device, sizes, strides, requires_grad
    STATE_TENSOR = "state_tensor"  # a parameter's or buffer's dtype, device, sizes, strides ([Note: module tensors' metadata])
    LEN = "len"              # len(value) == n
    DICT_KEYS = "dict_keys"  # list(value) == keys: a dict's keys or a set's members (order matters: iteration order is specialized)
    MEMBER_IDS = "member_ids"  # the members, in order, are these objects (a set of tensors iterated)
    EMPTY = "empty"          # not value (hook dicts)
    TRUTH = "truth"          # bool(value) is expected (a real container or C object branched on)
    ABSENT = "absent"        # key not in value (a lookup that raised KeyError: `os.environ.get(k, default)`)
    PRESENT = "present"      # key in value (`k in d` on a real container that answered True)
    GRAD_MODE = "grad_mode"  # torch.is_grad_enabled() is expected
    AUTOCAST = "autocast"    # autocast_state() == expected: the graph was traced with autocast's casts
    GLOBAL_STATE = "global_state"  # global_state() == expected: deterministic algorithms and TF32 as traced
    SAME = "same"            # value is the object another source reads (aliased inputs)
    DISTINCT = "distinct"    # the tensor inputs, read through these sources, are distinct objects ([Note: distinct inputs])
    SHAPES = "shapes"        # the ShapeEnv's guard function holds over the tensor inputs
    VALUE = "value"          # a function of tensor inputs' values holds ([Note: mask elision])
    PROCESS_GROUP = "process_group"  # a torch.distributed query (get_rank()) returns what it did ([Note: rank-dependent values])


# Guards that read less of the value come first, so a type check protects the attribute reads after it.
_ORDER = {GuardKind.GRAD_MODE: 0, GuardKind.AUTOCAST: 0, GuardKind.GLOBAL_STATE: 0, GuardKind.PROCESS_GROUP: 0, GuardKind.TYPE: 1, GuardKind.ID: 1, GuardKind.LEN: 2,
          GuardKind.DICT_KEYS: 2, GuardKind.ABSENT: 2, GuardKind.PRESENT: 2, GuardKind.TRUTH: 2, GuardKind.MEMBER_IDS: 2, GuardKind.CONST: 3,
          GuardKind.EMPTY: 3, GuardKind.TENSOR: 4, GuardKind.STATE_TENSOR: 4, GuardKind.SAME: 5, GuardKind.DISTINCT: 5,
          GuardKind.SHAPES: 6, GuardKind.VALUE: 7}
# ...and the ones that compute, once every cheap check passed: shapes, then tensor values
_LAST = {GuardKind.SHAPES: 1, GuardKind.VALUE: 2}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    device: torch.device
    sizes: tuple  # an int per dim, or None for a dynamic dim
    strides: tuple  # an int per dim, or None where the stride depends on a dynamic dim
    requires_grad: bool | None   # None: not checked (a module's state: [Note: requires_grad under no_grad])
    traced: tuple = dataclasses.field(default=(), compare=False)   # the sizes it was traced at; not checked


@dataclasses.dataclass(frozen=True)
class Guard:
    kind: GuardKind
    source: Source | None
    expected: Any = None
    where: str | None = None   # the user's line that read the value first ("file:line in fn"); not compared

    def _key(self) -> tuple:
        e = self.expected
        if self.kind is GuardKind.ID:  # by identity: 3.13's dataclass __eq__ would compare tensors with ==
            e = id(e)
        elif isinstance(e, slice):  # a slice constant (`x[slice_indices]`) does not hash before Python 3.12
            e = (slice, e.start, e.stop, e.step)
        elif type(e) is dict:  # a table guarded whole (`builder._is_table`): its items, in order
            e = (dict, tuple(e.items()))
        elif self.kind in (GuardKind.ABSENT, GuardKind.PRESENT) and not _hashable(e):
            e = (id, id(e))   # `[1] in a_list`: the guard's code names the object itself
        return (self.kind, self.source, e)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, Guard) and self._key() == other._key()

    def describe(self) -> str:
        where = self.source.describe() if self.source is not None else ""
        if self.kind in (GuardKind.TENSOR, GuardKind.STATE_TENSOR):
            s = self.expected
            grad = "" if s.requires_grad is None else f", requires_grad={s.requires_grad}"
            return (f"{where} is a tensor of dtype={s.dtype}, device={s.device}, sizes={list(s.sizes)}, "
                    f"strides={list(s.strides)}{grad}")
        if self.kind is GuardKind.GRAD_MODE:
            return f"torch.is_grad_enabled() is {self.expected}"
        if self.kind is GuardKind.AUTOCAST:
            return f"autocast (cpu enabled, dtype, cuda enabled, dtype) is {self.expected}"
        if self.kind is GuardKind.GLOBAL_STATE:
            return f"(deterministic algorithms, warn only, cuBLAS TF32) is {self.expected}"
        if self.kind is GuardKind.SAME:
            return f"{where} is {self.expected.describe()}"
        if self.kind is GuardKind.DISTINCT:
            return "no two of " + ", ".join(s.describe() for s in self.expected) + " are the same tensor"
        if self.kind is GuardKind.SHAPES:
            return "symbolic sizes satisfy: " + (self.expected[2].replace("\n", "; ") or "their ranges")
        if self.kind is GuardKind.VALUE:
            return self.expected[2]
        if self.kind is GuardKind.ABSENT:
            return f"{where} has no key {self.expected!r}"
        if self.kind is GuardKind.PRESENT:
            return f"{where} contains {self.expected!r}"
        if self.kind is GuardKind.TRUTH:
            return f"bool({where}) is {self.expected}"
        if self.kind is GuardKind.MEMBER_IDS:
            return f"{where} holds the same {len(self.expected)} objects, in order"
        if self.kind is GuardKind.PROCESS_GROUP:
            q = self.expected
            return f"{q.call_text()} == {q.value!r}" + (" (rank-dependent: each rank compiles its own graph)"
                                                         if q.rank_dependent else "")
        text = {GuardKind.TYPE: "type is {}", GuardKind.ID: "is the same object ({})",
                GuardKind.CONST: "== {!r}", GuardKind.LEN: "has length {}", GuardKind.DICT_KEYS: "has keys {}",
                GuardKind.EMPTY: "is empty{}"}[self.kind]
        value = self.expected.__qualname__ if isinstance(self.expected, type) else self.expected
        if self.kind is GuardKind.ID:
            value = type(self.expected).__name__
        return f"{where} {text.format('' if self.kind is GuardKind.EMPTY else value)}"


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _device_check(e: str, device: torch.device, const) -> str:
    # `x.device` builds a device object on every call; these read a flag or an int instead
    if device.type == "cpu":
        return f"{e}.is_cpu"
    if device.type == "cuda" and device.index is not None:
        return f"{e}.get_device() == {device.index}"
    return f"{e}.device == {const(device)}"


def _tensor_check(e: str, spec: TensorSpec, const: Callable[[Any], str]) -> list[str]:
    parts = [f"{e}.dtype is {const(spec.dtype)}", _device_check(e, spec.device, const)]
    if spec.requires_grad is not None:
        parts.append(f"{e}.requires_grad is {spec.requires_grad}")
    if None not in spec.sizes:
        # one tuple compare is cheaper than a compare per dim
        parts.append(f"{e}.size() == {tuple(spec.sizes)!r}")
    else:
        parts.append(f"{e}.dim() == {len(spec.sizes)}")
        parts += [f"{e}.size({d}) == {n}" for d, n in enumerate(spec.sizes) if n is not None]
        parts += [f"{e}.size({d}) >= 2" for d, n in enumerate(spec.sizes) if n is None]
    if None not in spec.strides:
        parts.append(f"{e}.stride() == {tuple(spec.strides)!r}")
    else:
        parts += [f"{e}.stride({d}) == {s}" for d, s in enumerate(spec.strides) if s is not None]
    return parts


def guard_code(guard: Guard, const: Callable[[Any], str]) -> list[str]:
    """The Python conditions (joined by `and`) that check `guard`; `const(v)` names an object."""
    e = guard.source.expr() if guard.source is not None else ""
    kind, x = guard.kind, guard.expected
    if kind is GuardKind.TYPE:
        return [f"type({e}) is {const(x)}"]
    if kind is GuardKind.ID:
        return [f"{e} is {const(x)}"]
    if kind is GuardKind.CONST:
        if x is None or isinstance(x, bool):
            return [f"{e} is {x!r}"]
        if type(x) is float and x != x:
            return [f"type({e}) is float", f"{e} != {e}"]  # NaN
        if type(x) is float and x in (float("inf"), float("-inf")):
            return [f"type({e}) is float", f"{e} == {const(x)}"]  # `inf` is not a Python literal
        if type(x) in (int, float, str, bytes):
            return [f"type({e}) is {type(x).__name__}", f"{e} == {x!r}"]
        return [f"type({e}) is {const(type(x))}", f"{e} == {const(x)}"]
    if kind in (GuardKind.TENSOR, GuardKind.STATE_TENSOR):
        return _tensor_check(e, x, const)
    if kind is GuardKind.LEN:
        return [f"len({e}) == {x}"]
    if kind is GuardKind.DICT_KEYS:
        return [f"list({e}) == {const(list(x))}"]
    if kind is GuardKind.EMPTY:
        return [f"not {e}"]
    if kind is GuardKind.ABSENT:
        return [f"{const(x)} not in {e}"]
    if kind is GuardKind.PRESENT:
        return [f"{const(x)} in {e}"]
    if kind is GuardKind.TRUTH:
        return [f"bool({e}) is {bool(x)}"]
    if kind is GuardKind.MEMBER_IDS:  # the objects are kept alive by the entry (`out.keepalive`)
        return [f"list(map(id, {e})) == {list(x)!r}"]
    if kind is GuardKind.GRAD_MODE:
        return [f"__grad_enabled() is {x}"]
    if kind is GuardKind.AUTOCAST:
        return [f"__autocast_state() == {const(x)}"]
    if kind is GuardKind.GLOBAL_STATE:
        return [f"__global_state() == {const(x)}"]
    if kind is GuardKind.SAME:
        return [f"{e} is {x.expr()}"]
    if kind is GuardKind.DISTINCT:
        return [f"len({{{', '.join(f'id({s.expr()})' for s in x)}}}) == {len(x)}"]
    if kind is GuardKind.PROCESS_GROUP:
        return [f"{const(x.fn)}(*{const(x.args)}) == {const(x.value)}"]
    if kind in (GuardKind.SHAPES, GuardKind.VALUE):
        fn, sources = x[0], x[1]
        return [f"{const(fn)}({', '.join(s.expr() for s in sources)})"]
    raise AssertionError(kind)


def sort_guards(guards) -> list[Guard]:
    unique = list(dict.fromkeys(guards))
    return sorted(unique, key=lambda g: (_LAST.get(g.kind, 0), len(g.source.expr()) if g.source else 0,
                                         _ORDER[g.kind]))


_STEP = r"(?:\.[A-Za-z_]\w*(?!\w|\s*\()|\[[^\[\]()]*\])"   # `.attr` (not a method call) or `[key]`


def share_reads(segments: list[list[str]], params: list[str]) -> list[list[str]]:
    """[Note: guard reads shared] A module's guards re-read the same attribute chains from the
    frame's parameters hundreds of times (`self._modules['stages']._modules['0']...` for every
    parameter and flag of a ResNet). Each chain prefix read at least twice is bound once, with
    `:=` at its first read, and named after that: the `and` chain evaluates left to right, and a
    read comes after the guards that protect it, so a later use always finds the name bound.
    Guards only read, so one evaluation sees one object per chain. The conditions come in
    segments, in evaluation order: the first always runs, each later one only sometimes (settled
    module state, hook tables), so a name bound in a later segment is used within it only, and
    another segment reading the same prefix binds it again."""
    import re
    if not params:
        return segments
    conditions = [c for segment in segments for c in segment]
    chain = re.compile(r"(?<![\w.'\]])(?:" + "|".join(map(re.escape, params)) + r")" + _STEP + "+")
    step = re.compile(_STEP)
    counts: dict[str, int] = {}
    for cond in conditions:
        for m in chain.finditer(cond):
            text, ends = m.group(0), [s.end() for s in step.finditer(m.group(0), len(m.group(0).split(".")[0].split("[")[0]))]
            for end in ends[:-1]:        # proper prefixes: the full chain is read once per condition
                counts[text[:end]] = counts.get(text[:end], 0) + 1
    shared = {prefix: f"__r{i}" for i, prefix in enumerate(p for p, n in counts.items() if n >= 2)}
    if not shared:
        return segments
    always: set[str] = set()      # bound by the first segment
    bound: set[str] = set()       # bound by the segment being rewritten

    def rewrite(m):
        text = m.group(0)
        head = len(text.split(".")[0].split("[")[0])
        out, start = text[:head], head
        for s in step.finditer(text, head):
            prefix = text[:s.end()]
            out += s.group(0)
            if prefix in shared:
                if prefix in always or prefix in bound:
                    out = shared[prefix]
                else:
                    bound.add(prefix)
                    out = f"({shared[prefix]} := {out})"
        return out
    rewritten = []
    for i, segment in enumerate(segments):
        rewritten.append([chain.sub(rewrite, cond) for cond in segment])
        if i == 0:
            always = bound
        bound = set()
    return rewritten


# [Note: hook tables by registration count] A module's guards check that each of its hook tables
# (`_forward_hooks`, `_forward_pre_hooks`, ... of every submodule the frame calls, and the global ones
# of torch.nn.modules.module) is still empty: a quarter of a transformer's guard conditions, paid on
# every call. Every way PyTorch adds a hook (`register_forward_hook`, `register_module_forward_hook`,
# `Tensor.register_hook`, ...) first makes a `RemovableHandle`, whose class counter `next_id` only
# grows. So an entry keeps the counter's value at its last full check, and while the counter has not
# moved, no table empty then can have gained a hook: the tables' checks run only when some hook was
# registered since (anywhere), and a check that passes takes the new value. The counter is read
# before the tables, so a hook registered while they are read is seen on the next call. Not covered:
# a hook written into a table by hand (`m._forward_hooks[k] = f`, private API), which Dynamo does not
# guard at all (its `skip_nnmodule_hook_guards`).
HOOK_TABLES = frozenset({
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
    "_global_forward_hooks", "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called",
    "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks",
    "_global_module_registration_hooks", "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks"})


def empty_hook_table(guard: Guard) -> bool:
    """A guard that a hook table is empty (or is of its type): one the registration count stands for."""
    s = guard.source
    name = s.attr if isinstance(s, AttrSource) else s.name if isinstance(s, GlobalSource) \
        else s.key if isinstance(s, DictEntrySource) else None
    if name not in HOOK_TABLES:
        return False
    kind, x = guard.kind, guard.expected
    return kind in (GuardKind.EMPTY, GuardKind.TYPE) or (kind is GuardKind.DICT_KEYS and not x) \
        or (kind is GuardKind.LEN and x == 0) or (kind is GuardKind.TRUTH and not x)


def global_state() -> tuple:
    """The global switches a backend may compile for, as torch.compile's global state guard checks
    them: deterministic algorithms (and their warn-only form) and cuBLAS's TF32 matmuls. A call
    under other switches compiles again (a backend that read them chose its kernels by them)."""
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch._C._get_cublas_allow_tf32())


def autocast_state() -> tuple:
    """What a traced graph's casts depend on: autocast on CPU and on CUDA, each enabled and its dtype
    (a graph traced under autocast holds bf16 casts a call without it must not run)."""
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))


def compile_guards(guards: list[Guard], params: str, bindings: dict[str, Any],
                   name: str = "__kiln_guard", settled: list[Guard] = (), pins: list = (),
                   settled_tensors: list[Guard] = ()) -> Callable[..., bool]:
    """One function `(frame's params) -> bool` that checks every guard; exceptions mean a miss.
    `settled` guards are checked only when some module's state was written since their last pass,
    `settled_tensors` only when some tensor's metadata was, and `PinnedSource(i)` reads `pins[i]`
    ([Note: settled module state] in settled.py)."""
    consts: dict[int, tuple[str, Any]] = {}

    def const(value):
        if id(value) not in consts:
            consts[id(value)] = (f"__c{len(consts)}", value)
        return consts[id(value)][0]

    tables, conditions = [], []
    for g in sort_guards(guards):
        (tables if empty_hook_table(g) else conditions).extend(guard_code(g, const))
    state = [c for g in sort_guards(settled) for c in guard_code(g, const)]
    tensors = [c for g in sort_guards(settled_tensors) for c in guard_code(g, const)]
    # the settled state's, its tensors' and the tables' conditions go last, each run only sometimes
    conditions, state, tensors, tables = share_reads(
        [conditions, state, tensors, tables], [p.strip().lstrip("*") for p in params.split(",") if p.strip()])
    if state:
        conditions.append(f"((__writes_n := __writes[0]) == __settled[0] or ({' and '.join(state)}) "
                          "and __settled.__setitem__(0, __writes_n) is None)")
    if tensors:
        conditions.append(f"((__twrites_n := __twrites[0]) == __tsettled[0] or ({' and '.join(tensors)}) "
                          "and __tsettled.__setitem__(0, __twrites_n) is None)")
    if tables:     # [Note: hook tables by registration count]
        conditions.append(f"((__hooks_n := __handles.next_id) == __stamp[0] or ({' and '.join(tables)}) "
                          "and __stamp.__setitem__(0, __hooks_n) is None)")
    body = " and\n            ".join(conditions or ["True"])
    bindings = {**bindings, **{f"__p{i}": pin for i, pin in enumerate(pins)}}
    if state:
        bindings.update(__writes=MODULE_WRITES, __settled=[-1])
    if tensors:
        bindings.update(__twrites=TENSOR_WRITES, __tsettled=[-1])
    names = ["__grad_enabled", "__autocast_state", "__global_state", "__handles", "__stamp", *bindings,
             *(n for n, _ in consts.values())]
    src = (f"def __make({', '.join(names)}):\n"
           f"    def {name}({params}):\n"
           f"        try:\n"
           f"            return ({body})\n"
           f"        except Exception:\n"
           f"            return False\n"
           f"    return {name}\n")
    # item sources name dtype keys as torch.<dtype>, enum keys by reference, arrays' tensors (sources.py)
    namespace: dict[str, Any] = {"torch": torch, "__kiln_keys": KEYS, "__kiln_from_numpy": torch.from_numpy,
                              "__kiln_object_getattribute": object.__getattribute__}
    exec(compile(src, f"<kiln guards {name}>", "exec"), namespace)
    fn = namespace["__make"](torch.is_grad_enabled, autocast_state, global_state, RemovableHandle, [-1], *bindings.values(),
                             *[v for _, v in consts.values()])
    fn.__kiln_source__ = src
    return fn


def failure_finder(ordered: list[Guard], params: str, bindings: dict[str, Any]) -> Callable[..., int]:
    """`(frame's params) -> int`: the index in `ordered` of the first guard that fails, or -1."""
    consts: dict[int, tuple[str, Any]] = {}

    def const(value):
        if id(value) not in consts:
            consts[id(value)] = (f"__c{len(consts)}", value)
        return consts[id(value)][0]

    tests = []
    for i, guard in enumerate(ordered):
        cond = " and ".join(guard_code(guard, const))
        tests.append(f"        try:\n            if not ({cond}): return {i}\n"
                     f"        except Exception:\n            return {i}\n")
    names = ["__grad_enabled", "__autocast_state", "__global_state", *bindings, *(n for n, _ in consts.values())]
    src = (f"def __make({', '.join(names)}):\n"
           f"    def __kiln_first_failure({params}):\n{''.join(tests)}        return -1\n"
           f"    return __kiln_first_failure\n")
    # item sources name dtype keys as torch.<dtype>, enum keys by reference, arrays' tensors (sources.py)
    namespace: dict[str, Any] = {"torch": torch, "__kiln_keys": KEYS, "__kiln_from_numpy": torch.from_numpy,
                              "__kiln_object_getattribute": object.__getattribute__}
    exec(compile(src, "<kiln guards: first failure>", "exec"), namespace)
    return namespace["__make"](torch.is_grad_enabled, autocast_state, global_state, *bindings.values(),
                               *[v for _, v in consts.values()])
