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
from typing import Callable

CALLABLES: dict = {}
CALLABLE_TYPES: dict = {}  # type -> handler(tx, value, args, kwargs), for callable instances
PACKAGES: dict = {}  # top-level package -> handler(tx, value, args, kwargs), for its functions and classes
ATTRIBUTES: dict = {}

_FAMILIES = ("builtins", "containers", "collections_types", "iterators", "generators", "stdlib_functions",
             "numpy_calls", "pytree_calls", "vmap", "calls", "distributed", "torch_python", "run_time_checks")
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
    if handler is None:
        package = PACKAGES.get((getattr(value, "__module__", None) or "").partition(".")[0])
        if package is not None:
            return lambda tx, args, kwargs: package(tx, value, args, kwargs)
    return handler
