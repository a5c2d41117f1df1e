"""The one table of real Python callables kiln models: `CALLABLES[fn] -> handler(tx, args, kwargs)`.

Each family of values registers the callables it owns here, next to their handlers:
- `builtins.py`: builtin functions (`len`, `isinstance`, `super`, ...), `operator`, `functools`;
- `containers.py`: list, tuple, dict, set and frozenset, their methods and set algebra;
- `collections_types.py`: `collections.deque`, `defaultdict`, `OrderedDict`, namedtuple methods;
- `iterators.py`: iteration builtins (`zip`, `enumerate`, `sorted`, ...) and `itertools`;
- `generators.py`: the methods of generators made in traced code (`send`, `throw`, `close`);
- `stdlib_functions.py`: `copy`, `heapq`, `bisect`, `operator.itemgetter`/`attrgetter`/`methodcaller`;
- `numpy_calls.py`: NumPy functions on arrays that stand for tensors (traced as torch ops);
- `pytree_calls.py`: `torch.utils._pytree`, inlined with its specs as constants;
- `distributed.py`: torch.distributed's process-group queries (`get_rank`, `get_world_size`, ...);
- `vmap.py`: `torch.vmap`, unrolled per example;
- `higher_order.py`: `torch.cond` (a constant predicate picks the branch; a tensor one breaks the graph);
- `torch_python.py`: torch functions whose ATen kernels decide on tensor data (`cov`, `corrcoef`), in Python;
- `calls.py`: grad mode, RNG regions, `torch._assert`, `torch._is_all_true`, `kl_divergence`,
  `inspect.signature`, model outputs, SDPA.
`calls.py` is the one call dispatch (`interpreter.call_variable` through the handlers calls.py
registers in `interpreter.CALLS`): it looks a real callable up here (`handler_for`)
before it classifies what is left (torch ops, modules, classes, Python functions to inline).

Callable instances are dispatched by their type in `CALLABLE_TYPES` (`functools.lru_cache`
wrappers), and packages modelled as one family by the top-level package of the callable's
`__module__` in `PACKAGES` (NumPy, whose functions are ufuncs, dispatchers and builtins alike;
`typing`). Data attributes of modelled containers (`deque.maxlen`, `defaultdict.default_factory`)
are in `ATTRIBUTES[(type, name)] -> reader(tx, tracker)`, which `attributes.py` consults.

A method is keyed by its descriptor (`list.append`, `collections.deque.rotate`): traced code reads
`d.rotate` as a bound method of the descriptor, and calling it passes the container first.
"""
from __future__ import annotations

import importlib
import types
from typing import Callable

CALLABLES: dict = {}
CALLABLE_TYPES: dict = {}  # type -> handler(tx, value, args, kwargs), for callable instances
PACKAGES: dict = {}  # top-level package -> handler(tx, value, args, kwargs), for its functions and classes
ATTRIBUTES: dict = {}
# (builtin class, name) -> make_handler(cls): a C classmethod (`dict.fromkeys`) reached through a
# subclass (`MyDict.fromkeys` is a new bound method, not `dict.fromkeys`), its handler made for it
CLASS_METHODS: dict = {}

_FAMILIES = ("builtins", "containers", "collections_types", "iterators", "generators", "stdlib_functions",
             "numpy_calls", "pytree_calls", "vmap", "calls", "distributed", "torch_python", "run_time_checks",
             "higher_order")
_loaded = False


def handles(*fns, table: dict = CALLABLES):
    """Decorator: register `handler(tx, args, kwargs)` for each of `fns`."""
    def register(handler: Callable):
        for fn in fns:
            table[fn] = handler
        return handler
    return register


def _load():
    global _loaded
    if not _loaded:
        for name in _FAMILIES:
            importlib.import_module(f"kiln.capture.{name}")
        _loaded = True


# [Note: argument counts of C methods] A handler models what a container method does, not how
# many arguments it takes; before it runs, the call is checked against the method's own signature
# (its text signature, or `_C_ARITY` where inspect cannot read one), so `p.copy(1)` raises
# TypeError as in CPython instead of copying. Entries: (fewest, most positional arguments after
# self (None: any number), whether keywords are accepted).
_C_ARITY: dict = {}


def _register_arity():
    import collections
    none, one, optional = (0, 0, False), (1, 1, False), (0, 1, False)
    many = (0, None, False)
    table = {
        dict: {"keys": none, "items": none, "values": none, "clear": none, "copy": none,
               "pop": (1, 2, False), "update": (0, 1, True), "__getitem__": one},
        list: {"__getitem__": one},
        set: {"add": one, "clear": none, "copy": none, "discard": one, "remove": one, "pop": none,
              "__contains__": one, "difference": many, "intersection": many, "union": many, "update": many,
              "difference_update": many, "intersection_update": many, "symmetric_difference": one,
              "symmetric_difference_update": one, "isdisjoint": one, "issubset": one, "issuperset": one},
        frozenset: {"copy": none, "__contains__": one, "difference": many, "intersection": many, "union": many,
                    "symmetric_difference": one, "isdisjoint": one, "issubset": one, "issuperset": one},
        collections.deque: {"append": one, "appendleft": one, "clear": none, "copy": none, "__copy__": none,
                            "count": one, "extend": one, "extendleft": one, "index": (1, 3, False),
                            "insert": (2, 2, False), "pop": none, "popleft": none, "remove": one,
                            "reverse": none, "rotate": optional},
        collections.OrderedDict: {"keys": none, "items": none, "values": none, "clear": none, "copy": none,
                                  "pop": (1, 2, False), "update": (0, 1, True)},
    }
    for cls, methods in table.items():
        for name, arity in methods.items():
            _C_ARITY[cls.__dict__[name]] = arity


_CHECKED_TYPES = (list, dict, set, frozenset, tuple)


def argument_count_error(fn, n_args: int, kwargs: dict) -> str | None:
    """Why CPython would refuse calling the C method `fn` with `n_args` positional arguments (self
    included) and `kwargs`, or None ([Note: argument counts of C methods])."""
    import collections
    import inspect
    import types
    if isinstance(fn, types.BuiltinFunctionType) and getattr(fn, "__module__", None) == "builtins" and kwargs:
        # a builtin function that takes no keywords (`isinstance(x, T, invalid=True)`)
        try:
            sig = inspect.signature(fn)
            sig.bind(*range(n_args), **kwargs)
        except ValueError:
            return None   # no signature to check against (max, min, print, ...)
        except TypeError as e:
            if all(p.kind is p.POSITIONAL_ONLY for p in sig.parameters.values()):
                return f"{fn.__name__}() takes no keyword arguments"
            return f"{fn.__name__}() {e}"
        return None
    if not isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)) or \
            getattr(fn, "__objclass__", None) not in (*_CHECKED_TYPES, collections.deque, collections.OrderedDict):
        return None
    if not _C_ARITY:
        _register_arity()
    arity = _C_ARITY.get(fn)
    if arity is None:
        try:
            inspect.signature(fn).bind(*range(n_args), **kwargs)
            return None
        except ValueError:
            return None   # no signature to check against
        except TypeError:
            pass
    else:
        fewest, most, keywords = arity
        given = n_args - 1
        if (keywords or not kwargs) and given >= fewest and (most is None or given <= most):
            return None
    # CPython checks the count before it reads any argument: its own message, from a call on an
    # empty instance with placeholders (and no answer if that call does not refuse the count)
    try:
        fn(fn.__objclass__(), *[None] * (n_args - 1), **dict.fromkeys(kwargs))
    except TypeError as e:
        return str(e)
    except Exception:
        return None
    return None


def attribute_for(cls: type, name: str) -> Callable | None:
    _load()
    return ATTRIBUTES.get((cls, name))


def handler_for(value) -> Callable | None:
    """The handler registered for `value`, or None (unhashable values have none)."""
    _load()
    by_type = CALLABLE_TYPES.get(type(value))
    if by_type is not None:
        return lambda tx, args, kwargs: by_type(tx, value, args, kwargs)
    try:
        handler = CALLABLES.get(value)
    except TypeError:
        return None
    owner = getattr(value, "__self__", None)
    if handler is None and isinstance(owner, type) and isinstance(value, types.BuiltinMethodType):
        make = next((CLASS_METHODS[(base, value.__name__)] for base in owner.__mro__
                     if (base, value.__name__) in CLASS_METHODS), None)
        if make is not None:
            handler = make(owner)
    if handler is None:
        package = PACKAGES.get((getattr(value, "__module__", None) or "").partition(".")[0])
        if package is not None:
            return lambda tx, args, kwargs: package(tx, value, args, kwargs)
    return handler
