"""Iteration over trackers: the iteration builtins (`iter`, `next`, `zip`, `enumerate`, `map`,
`sorted`, `sum`, ...) and `itertools`.

kiln unrolls loops, so an iterator is an `IteratorVar` over a known list of trackers; one built
over a generator made in traced code is a `LazyIteratorVar` instead, whose items are made only as
the consumer asks, so the generator's effects interleave with the consumer's ([Note: lazy
generators] in `generators.py`). Both come out of `_result`, from a real iterator over trackers.

[Note: itertools run for real on tokens] What `zip`, `enumerate`, `itertools.product`,
`combinations`, `permutations`, `zip_longest`, `islice`, `chain` (and `from_iterable`) and `pairwise`
produce depends only on how many items each argument has, never on their values. So kiln runs the
real function on tokens (one per item tracker) and maps the tokens in its output back to trackers:
Python decides the order, the lengths, `strict=` errors and fill values. `_STRUCTURAL` says per
function which arguments are iterables of items (`I`), iterables of iterables (`J`), single items
(`i`) or constants (`c`). An iterator argument is consumed as far as the real function consumed it.
Functions that call user code (`map`, `filter`, `starmap`, `takewhile`, `accumulate`, ...) are
written out below, calling it through the tracer.
"""
from __future__ import annotations

import functools
import itertools
import operator

import torch

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.semantics import binary_op, get_iter, iterate, truth
from kiln.capture.constants import constant_of, is_python_constant, python_value
from kiln.capture.generators import advance

_LONGEST = 100_000  # an unrolled loop longer than this is taken to be infinite (`itertools.count`)


@handles(iter)
def _iter(tx, args, kwargs):
    if len(args) > 1:
        raise tx.unsupported("iter(callable, sentinel) inside captured code")
    return get_iter(tx, args[0])


@handles(next)
def _next(tx, args, kwargs):
    it = args[0]
    if not isinstance(it, V.ITERATORS):
        raise tx.unsupported(f"next() on a {it.python_type().__name__}")
    item = advance(tx, it)             # a dict view's iterator reads the dict as it is now
    if item is None:
        if len(args) > 1:
            return args[1]
        tx.raise_(StopIteration)
    return item


@handles(range)
def _range(tx, args, kwargs):
    from kiln.capture.builtins import user_protocol
    from kiln.capture.constants import fold_call
    # a user object as a bound is its __index__, traced
    args = [user_protocol(tx, operator.index, [a], {}) or a for a in args]
    return fold_call(tx, range, args, kwargs)


# -- structural functions: run for real on tokens ---------------------------------------------------------
class Token:
    """Stands for one item tracker inside a real container or iterator (compared by identity only)."""
    __slots__ = ("var",)

    def __init__(self, var):
        self.var = var


class _Consumed:
    """A real iterator over an IteratorVar's remaining items that counts what was taken."""

    def __init__(self, it: V.IteratorVar):
        self.it, self.taken = it, 0
        self.tokens = [Token(v) for v in it.items[it.index:]]

    def __iter__(self):
        return self

    def __next__(self):
        if self.taken >= len(self.tokens):
            raise StopIteration
        self.taken += 1
        return self.tokens[self.taken - 1]


def _real_argument(tx, kind, v, consumed: dict | None):
    """The real argument standing for tracker `v`; `consumed` is None when the result is lazy
    (an iterator argument is then stepped only as the real function asks)."""
    if kind == "c":
        return python_value(v)
    if kind == "i":
        return Token(v)
    if kind == "J":
        return [_real_argument(tx, "I", inner, consumed) for inner in iterate(tx, v)]
    if consumed is None and isinstance(v, V.ITERATORS):
        return (Token(x) for x in _stream(tx.out, v))
    if isinstance(v, V.IteratorVar):
        if v.view is not None:     # its items are the dict's keys, read live ([Note] in views.py)
            raise tx.unsupported("an itertools function over an iterator of a dict view")
        if id(v) not in consumed:  # zip(it, it) takes from one iterator twice
            consumed[id(v)] = _Consumed(v)
        return consumed[id(v)]
    return [Token(x) for x in iterate(tx, v)]


def _tracker_of(value):
    if isinstance(value, Token):
        return value.var
    if isinstance(value, tuple):
        return V.TupleVar([_tracker_of(x) for x in value])
    if isinstance(value, list):
        return V.ListVar([_tracker_of(x) for x in value])
    return constant_of(None, value)


def _structural(fn, spec: str, kwspec: dict):
    """`spec`: one kind per positional argument; a last kind followed by `*` repeats."""
    def handle(tx, args, kwargs):
        kinds = spec.rstrip("*")
        lazy = any(_reads_generator(a) for a in [*args, *kwargs.values()])
        consumed = None if lazy else {}
        real_args = [_real_argument(tx, kinds[min(i, len(kinds) - 1)] if spec.endswith("*") or i < len(kinds)
                                    else "c", a, consumed) for i, a in enumerate(args)]
        real_kwargs = {k: _real_argument(tx, kwspec.get(k, "c"), v, consumed) for k, v in kwargs.items()}
        if lazy:
            try:
                real = fn(*real_args, **real_kwargs)
            except (TypeError, ValueError) as e:
                tx.raise_(type(e), *e.args)
            return _result(tx, map(_tracker_of, real), fn, lazy=True)
        try:
            out = list(itertools.islice(fn(*real_args, **real_kwargs), _LONGEST + 1))
        except (TypeError, ValueError) as e:
            tx.raise_(type(e), *e.args)
        if len(out) > _LONGEST:
            raise tx.unsupported(f"{fn.__qualname__} over an endless iterable inside captured code")
        for c in consumed.values():
            c.it.index += c.taken
        return V.IteratorVar([_tracker_of(x) for x in out])
    return handle


_STRUCTURAL = {
    zip: ("I*", {}),
    enumerate: ("Ic", {}),
    itertools.chain: ("I*", {}),
    itertools.chain.from_iterable: ("J", {}),
    itertools.product: ("I*", {}),
    itertools.islice: ("Ic*", {}),
    itertools.combinations: ("Ic", {}),
    itertools.combinations_with_replacement: ("Ic", {}),
    itertools.permutations: ("Ic", {}),
    itertools.zip_longest: ("I*", {"fillvalue": "i"}),
    itertools.repeat: ("ic", {}),
}
if hasattr(itertools, "pairwise"):
    _STRUCTURAL[itertools.pairwise] = ("I", {})
if hasattr(itertools, "batched"):  # Python 3.12
    _STRUCTURAL[itertools.batched] = ("Ic", {})
for _fn, (_spec, _kwspec) in _STRUCTURAL.items():
    handles(_fn)(_structural(_fn, _spec, _kwspec))


@handles(itertools.tee)
def _tee(tx, args, kwargs):
    """`tee(it, n)`: n iterators sharing one buffer over `it`, which each steps only as far as its
    consumer asks (a real tee over a stream of `it`'s trackers)."""
    from kiln.capture.constants import python_value
    if len(args) not in (1, 2) or kwargs:
        tx.raise_(TypeError, f"tee expected at most 2 arguments, got {len(args) + len(kwargs)}")
    n = python_value(args[1]) if len(args) > 1 else 2
    if not isinstance(n, int):
        tx.raise_(TypeError, f"'{type(n).__name__}' object cannot be interpreted as an integer")
    if n < 0:
        tx.raise_(ValueError, "n must be >= 0")
    source = _stream(tx.out, get_iter(tx, args[0]))
    return V.TupleVar([V.LazyIteratorVar(_guarded(tx.out, t), type(t)) for t in itertools.tee(source, n)])


@handles(itertools.count, itertools.cycle)
def _endless(tx, args, kwargs):
    raise tx.unsupported("an endless iterator (itertools.count/cycle) inside captured code")


# -- lazy iteration over generators ----------------------------------------------------------------------
def _reads_generator(v: V.Variable) -> bool:
    """Whether iterating `v` steps a generator made in traced code (so must wait for the consumer)."""
    return isinstance(v, (V.GeneratorVar, V.LazyIteratorVar))


def _stream(out, it: V.Variable):
    """The items of iterator tracker `it`, each taken only when asked, by the frame running then."""
    while (item := advance(out.current, it)) is not None:
        yield item


def _items(tx, v: V.Variable, lazy: bool):
    """The items of iterable `v`: a stream when the result is lazy, else a list (all taken now)."""
    return _stream(tx.out, get_iter(tx, v)) if lazy else iterate(tx, v)


def _result(tx, real, cls: type, lazy: bool) -> V.Variable:
    """An iterator tracker over the trackers `real` produces: produced now, or as the consumer asks."""
    if lazy:
        return V.LazyIteratorVar(_guarded(tx.out, real), cls)
    return V.IteratorVar(list(real))


def _guarded(out, real):
    """`real`'s items; an error the real itertools function raises (zip's `strict=`) is the program's."""
    try:
        yield from real
    except (TypeError, ValueError) as e:
        out.current.raise_(type(e), *e.args)


# -- functions that call user code --------------------------------------------------------------------
def _runs_python(fn: V.Variable) -> bool:
    """Whether calling `fn` runs Python code kiln inlines, whose effects must interleave with the
    consumer's as in Python (`map(f, xs)` calls `f` only when the loop asks for the next item)."""
    return isinstance(fn, (V.FunctionVar, V.MethodVar, V.PartialVar, V.NewObjectVar))


def _caller(tx, fn):
    """`fn` called on trackers by the frame that runs when it is called."""
    out = tx.out
    return lambda *row: out.current.call(fn, list(row))


@handles(map)
def _map(tx, args, kwargs):
    lazy = _runs_python(args[0]) or any(_reads_generator(a) for a in args[1:])
    return _result(tx, map(_caller(tx, args[0]), *[_items(tx, a, lazy) for a in args[1:]]), map, lazy)


@handles(itertools.starmap)
def _starmap(tx, args, kwargs):
    lazy, call = _runs_python(args[0]) or _reads_generator(args[1]), _caller(tx, args[0])
    out = tx.out
    return _result(tx, (call(*iterate(out.current, row)) for row in _items(tx, args[1], lazy)),
                   itertools.starmap, lazy)


def _predicate(tx, fn):
    out = tx.out
    if isinstance(fn, V.Constant) and fn.value is None:
        return lambda x: truth(out.current, x)
    return lambda x: truth(out.current, out.current.call(fn, [x]))


def _filtering(real_fn):
    def handle(tx, args, kwargs):
        lazy = _runs_python(args[0]) or _reads_generator(args[1])
        return _result(tx, real_fn(_predicate(tx, args[0]), _items(tx, args[1], lazy)), real_fn, lazy)
    return handle


for _fn in (filter, itertools.filterfalse, itertools.takewhile, itertools.dropwhile):
    handles(_fn)(_filtering(_fn))


@handles(itertools.compress)
def _compress(tx, args, kwargs):
    lazy = _reads_generator(args[0]) or _reads_generator(args[1])
    out = tx.out
    pairs = zip(_items(tx, args[0], lazy), _items(tx, args[1], lazy))
    return _result(tx, (x for x, s in pairs if truth(out.current, s)), itertools.compress, lazy)


def _accumulated(out, items, fn, initial):
    total = initial
    if total is not None:
        yield total
    for item in items:
        tx = out.current
        total = item if total is None else (tx.call(fn, [total, item]) if fn else
                                            binary_op(tx, operator.add, total, item))
        yield total


@handles(itertools.accumulate)
def _accumulate(tx, args, kwargs):
    lazy = _reads_generator(args[0])
    fn = args[1] if len(args) > 1 else kwargs.get("func")
    initial = kwargs.get("initial")
    if initial is not None and _is_none(initial):
        initial = None
    return _result(tx, _accumulated(tx.out, _items(tx, args[0], lazy), fn, initial), itertools.accumulate, lazy)


@handles(itertools.groupby)
def _groupby(tx, args, kwargs):
    if _reads_generator(args[0]):
        raise tx.unsupported("itertools.groupby over a generator inside captured code")
    key = args[1] if len(args) > 1 else kwargs.get("key")
    groups = []
    for x in iterate(tx, args[0]):
        k = tx.call(key, [x]) if key is not None and not _is_none(key) else x
        if groups and truth(tx, binary_op(tx, operator.eq, groups[-1][0], k)):
            groups[-1][1].append(x)
        else:
            groups.append((k, [x]))
    return V.IteratorVar([V.TupleVar([k, V.IteratorVar(g)]) for k, g in groups])


@handles(reversed)
def _reversed(tx, args, kwargs):
    if isinstance(args[0], V.ITERATORS):
        tx.raise_(TypeError, f"{args[0].python_type().__name__!r} object is not reversible")
    return V.IteratorVar(list(reversed(iterate(tx, args[0]))))


def _is_none(v):
    return isinstance(v, V.Constant) and v.value is None


@handles(sorted)
def sorted_items(tx, args, kwargs):
    items = iterate(tx, args[0])
    key = kwargs.get("key")
    reverse = python_value(kwargs.get("reverse", V.Constant(False)))
    keys = [tx.call(key, [x]) if key is not None and not _is_none(key) else x for x in items]
    if all(is_python_constant(k) for k in keys):
        keys = [python_value(k) for k in keys]
    elif all(isinstance(k, (V.NewObjectVar, V.Constant)) for k in keys):
        keys = [_TracedOrder(tx, k) for k in keys]
    else:
        raise tx.unsupported("sorting by keys known only at run time")
    order = sorted(range(len(items)), key=lambda i: keys[i], reverse=reverse)
    return V.ListVar([items[i] for i in order])


class _TracedOrder:
    """A sort key made in traced code (a user's object with `__lt__`, functools.cmp_to_key's): Python's
    own sort runs over these, so it makes the comparisons CPython's would, in the same order, and
    each `<` is the traced code's (inlined, its side effects recorded)."""
    __slots__ = ("tx", "var")

    def __init__(self, tx, var: V.Variable):
        self.tx, self.var = tx, var

    def __lt__(self, other: "_TracedOrder") -> bool:
        return truth(self.tx, binary_op(self.tx, operator.lt, self.var, other.var))


class CmpKey:
    """functools.cmp_to_key's key object, written in Python so captured code inlines its comparisons
    (CPython's is C: `functools.KeyWrapper`)."""
    __hash__ = None

    def __init__(self, obj, mycmp):
        self.obj, self.mycmp = obj, mycmp

    def __lt__(self, other):
        return self.mycmp(self.obj, other.obj) < 0

    def __gt__(self, other):
        return self.mycmp(self.obj, other.obj) > 0

    def __le__(self, other):
        return self.mycmp(self.obj, other.obj) <= 0

    def __ge__(self, other):
        return self.mycmp(self.obj, other.obj) >= 0

    def __eq__(self, other):
        return self.mycmp(self.obj, other.obj) == 0


@handles(functools.cmp_to_key)
def _cmp_to_key(tx, args, kwargs):
    mycmp = args[0] if args else kwargs.get("mycmp")
    return V.PartialVar(V.ObjectVar(CmpKey), [], {"mycmp": mycmp})


# -- reductions over an iterable ----------------------------------------------------------------------
@handles(sum)
def _sum(tx, args, kwargs):
    total = args[1] if len(args) > 1 else kwargs.get("start", V.Constant(0))
    for item in iterate(tx, args[0]):
        total = binary_op(tx, operator.add, total, item)
    return total


def _reduce_compare(op):
    def handle(tx, args, kwargs):
        from kiln.capture.constants import fold_call
        items = iterate(tx, args[0]) if len(args) == 1 else list(args)
        if not items:
            if "default" in kwargs:
                return kwargs["default"]
            tx.raise_(ValueError, "arg is an empty sequence")
        if all(is_python_constant(i) for i in items) and "key" not in kwargs:
            return fold_call(tx, op, [V.TupleVar(items)], {})
        if "key" not in kwargs and any(isinstance(i, V.TensorVar) for i in items):
            result = items[0]
            for item in items[1:]:
                result = _tensor_extreme(tx, op, result, item)
            return result
        if "key" not in kwargs and all(_is_int(i) for i in items):
            return _int_extreme(tx, op, items)
        raise tx.unsupported(f"{op.__name__}() over values known only at run time "
                             "(for tensors use torch.maximum/torch.minimum)")
    return handle


def _is_int(v: V.Variable) -> bool:
    return isinstance(v, V.SymNumber) and isinstance(v.example, torch.SymInt) or \
        is_python_constant(v) and type(python_value(v)) is int


def _int_extreme(tx, op, items: list) -> V.Variable:
    """`max(n, 2)` / `min(n, x.shape[0])` over ints, some known only at run time (a count read with
    `.item()`, a dynamic size): `torch.sym_max`/`sym_min`, a symbolic int later ops take as a size,
    as torch.compile traces it; no branch, so a value known only at run time needs no guard."""
    from kiln.capture.torch_calls import call_torch
    result = items[0]
    for item in items[1:]:
        result = call_torch(tx, "call_function", torch.sym_max if op is max else torch.sym_min, [result, item], {})
    return result


def _tensor_extreme(tx, op, a: V.Variable, b: V.Variable) -> V.Variable:
    """`max(a, b)` / `min(a, b)` where a tensor takes part, as torch.compile traces it: two tensors
    give `torch.maximum`/`minimum`, a tensor and a number a clamp of the tensor by the number, a
    tensor either way. Python compares the two (`b > a`), which needs a tensor of one value: one
    of more values raises eager's error."""
    from kiln.capture.torch_calls import call_torch
    for v in (a, b):
        if isinstance(v, V.TensorVar) and v.example.numel() != 1:
            tx.raise_(RuntimeError, "Boolean value of Tensor with more than one value is ambiguous")
    if isinstance(a, V.TensorVar) and isinstance(b, V.TensorVar):
        return call_torch(tx, "call_function", torch.maximum if op is max else torch.minimum, [a, b], {})
    if not isinstance(a, V.TensorVar) and not isinstance(b, V.TensorVar):
        if is_python_constant(a) and is_python_constant(b):
            return constant_of(tx, op(python_value(a), python_value(b)))
        raise tx.unsupported(f"{op.__name__}() over numbers known only at run time")
    tensor, number = (a, b) if isinstance(a, V.TensorVar) else (b, a)
    if not (isinstance(number, V.SymNumber) or is_python_constant(number) and
            isinstance(python_value(number), (int, float))):
        raise tx.unsupported(f"{op.__name__}() of a tensor and a {number.python_type().__name__}")
    return call_torch(tx, "call_function", torch.clamp, [tensor], {"min" if op is max else "max": number})


handles(max)(_reduce_compare(max))
handles(min)(_reduce_compare(min))


@handles(any)
def _any(tx, args, kwargs):
    # short-circuits as Python's does: a generator or iterator is stepped only up to the first true item
    return V.Constant(any(truth(tx, x) for x in _items(tx, args[0], isinstance(args[0], V.ITERATORS))))


@handles(all)
def _all(tx, args, kwargs):
    return V.Constant(all(truth(tx, x) for x in _items(tx, args[0], isinstance(args[0], V.ITERATORS))))
