"""Corpus programs for standard-library values built inside captured code: collections (deque,
defaultdict, OrderedDict, Counter, namedtuple methods), set algebra, dict.fromkeys, itertools,
functools' caches, dict subclasses, copy, heapq, bisect and operator's getters. Each runs under fullgraph=True and equals eager; aliasing is checked by
mutating through a second name and by returning or mutating the frame's own inputs."""
from __future__ import annotations

import bisect
import collections
import copy
import functools
import heapq
import itertools
import operator
import typing

import torch

from capture_corpus import program

deque = collections.deque


# -- deque ----------------------------------------------------------------------------------------------
@program()
def deque_methods(x):
    d = deque([x, x * 2], maxlen=3)
    d.append(x * 3)
    d.appendleft(x - 1)           # full: drops from the right
    d.extend([x + 1, x + 2])      # full: drops from the left
    d.rotate(1)
    d.extendleft([x * 5])
    left = d.popleft()
    return left + d.pop() + sum(d) + len(d) + d.maxlen + d[0] + d[-1]


@program()
def deque_alias_mutation(x):
    d = deque([x])
    e = d
    e.append(x * 2)
    e.rotate(-1)
    d[0] = d[0] + 10
    del d[1]
    return list(d), len(e), d is e


@program()
def deque_ops_and_search(x):
    d = deque([1, 2, 3, 2])
    e = d + deque([4])
    e += [5]
    f = d * 2
    d.remove(2)
    return x * (d.index(3) + d.count(2) + len(e) + len(f) + (3 in d) + e[-1]), deque(reversed(e)), d.copy()


@program()
def sequence_equality_by_type(x):
    d = deque([x])
    y = x + 1
    found = (x in [x, y]) + 2 * [x, y].index(x) + 4 * d.count(x) + 8 * (x in (x, y))  # identity, no __eq__
    return x * ((d == deque([x])) + 2 * (d == [x]) + 4 * ([x] == (x,)) + 8 * ((x,) == _Row(x, 1, 2)[:1])) + found


@program()
def deque_returned(x):
    return deque([x, x + 1], maxlen=2), deque()


@program(inputs=lambda seed: (torch.randn(3, generator=torch.Generator().manual_seed(seed)),
                              deque([1, 2], maxlen=3)))
def deque_argument_mutated(x, d):
    alias = d
    alias.append(3)
    alias.append(4)
    d.rotate(1)
    return x * sum(d), d


# -- defaultdict, OrderedDict, dict.fromkeys ----------------------------------------------------------------
@program()
def defaultdict_list(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["b"].append(x * 2)
    d["a"].append(x * 3)
    rows = d["a"]
    rows.append(x)                 # through an alias of the factory's list
    return len(d["a"]) * x + d["b"][0], "c" in d, d.get("c"), len(d), d.default_factory is list


@program()
def defaultdict_returned(x):
    d = collections.defaultdict(int)
    for k in ("u", "v", "u"):
        d[k] += 1
    e = collections.defaultdict(None, {"k": x})
    return d, e, x * d["u"]


@program()
def dict_fromkeys_shared(x):
    d = dict.fromkeys(["u", "v"], [])
    d["u"].append(x)               # one list shared by both keys, as in Python
    e = dict.fromkeys("ab")
    return len(d["v"]) * x, e, collections.OrderedDict.fromkeys([1, 2], 0)


@program()
def ordereddict_methods(x):
    d = collections.OrderedDict(a=x, b=x * 2, c=x * 3)
    d.move_to_end("a")
    d.move_to_end("c", last=False)
    k, v = d.popitem()
    k2, v2 = d.popitem(last=False)
    return d, k + k2, v - v2


@program()
def dict_merge_operators(x):
    a = collections.OrderedDict(a=x)
    b = a | {"b": x * 2}
    alias = a
    alias |= {"c": x}
    return a, b


# -- namedtuple ---------------------------------------------------------------------------------------------
_Row = collections.namedtuple("_Row", "a b c", defaults=[3, 4])


class _Typed(typing.NamedTuple):
    t: torch.Tensor
    k: int = 2


@program()
def namedtuple_make_replace_asdict(x):
    p = _Row._make([x, 2, 5])
    q = _Row(x)
    r = q._replace(c=7)
    return p.a * p.b + q.b + r.c, p._asdict(), r, _Row._fields, _Row._field_defaults


@program()
def namedtuple_typed_methods(x):
    p = _Typed(x)
    q = p._replace(k=5)
    return q.t * q.k + p.k, q, tuple(p), p._asdict()["k"]


# -- sets ---------------------------------------------------------------------------------------------------
@program()
def set_algebra_methods(x):
    a, b = {1, 2, 3}, {2, 3, 4}
    u, i, d, s = a.union(b, [9]), a.intersection(b), a.difference(b), a.symmetric_difference(b)
    return x * (len(u) + sum(i) + sum(d) + sum(s)), a.issubset(u), u.issuperset(b), a.isdisjoint({7}), sorted(u)


@program()
def set_operators_alias(x):
    a = {1, 2}
    alias = a
    alias |= {3}
    alias -= {1}
    a ^= {5, 2}
    b = a & {3, 5, 8}
    return x * len(a), a, b, a <= {3, 5, 9}, a == {3, 5}, a != b, frozenset(a) | {0}


@program()
def set_mutating_methods(x):
    a = set(range(6))
    a.discard(0)
    a.remove(1)
    a.intersection_update({2, 3, 4, 9})
    a.difference_update([4])
    a.symmetric_difference_update({7})
    first = a.pop()
    return x + first, a, list({"b", "a", "c"} | {"d"}) == list({"b", "a", "c", "d"})


@program()
def set_iteration_order_of_strings(x):
    # string hashes change per process: the order must still be this process's Python's
    a = {"alpha", "beta", "gamma", "delta"}
    b = set(["eps", "zeta"]) | a
    c = frozenset(["k", "l", "m"]) ^ {"l", "n"}
    a.update({"omega", "kappa"})
    return x * len(b), list(b), list(a), list(c), sorted(a - b), [s for s in b if s in c or len(s) > 4]


@program()
def set_of_tensors(x):
    y = x * 2
    s = {x, y}
    s.add(x)
    return len(s) * x, x in s, (x + 1) in s


@program()
def frozenset_methods(x):
    f = frozenset([1, 2, 3])
    g = f.union({4})
    return x * len(g), type(g).__name__, f.intersection([2, 3]), g


# -- itertools ----------------------------------------------------------------------------------------------
@program()
def itertools_combinatorics(x):
    s = x
    for i, j in itertools.combinations(range(4), 2):
        s = s + i * j
    for p in itertools.permutations([x, x * 2, x * 3], 2):
        s = s + p[0] * p[1]
    return s + len(list(itertools.combinations_with_replacement("ab", 2))) + \
        len(list(itertools.product([1, 2], repeat=3)))


@program()
def itertools_chain_from_iterable_zip_longest(x):
    s = x
    for v in itertools.chain.from_iterable([[x, x * 2], (x * 3,)]):
        s = s + v
    for a, b in itertools.zip_longest([1, 2, 3], [x], fillvalue=0):
        s = s + a * b
    return s, list(itertools.zip_longest("ab", "xyz"))


@program()
def itertools_iterator_consumption(x):
    it = iter([x, x * 2, x * 3, x * 4, x * 5, x * 6])
    first = list(zip(it, [0, 1]))    # zip takes a third item from `it` before it sees [0, 1] end
    head = list(itertools.islice(it, 1))
    pairs = list(zip(it, it))        # one iterator twice: (6, ?) never completes
    return first[1][0] + head[0], len(pairs), next(it, None), list(zip(iter([1, 2, 3]), [4]))


@program()
def itertools_with_functions(x):
    xs = [1, 2, 3, 4, 1]
    s = x * sum(itertools.starmap(lambda a, b: a * b, [(1, 2), (3, 4)]))
    s = s + sum(itertools.takewhile(lambda v: v < 3, xs)) + sum(itertools.dropwhile(lambda v: v < 3, xs))
    s = s + sum(itertools.compress(xs, [1, 0, 1, 0, 1])) + sum(itertools.filterfalse(lambda v: v > 2, xs))
    groups = [(k, len(list(g))) for k, g in itertools.groupby("aabccc")]
    return s + list(itertools.accumulate(xs, initial=10))[-1], groups


@program()
def zip_strict_enumerate_start(x):
    out = x
    for i, (a, b) in enumerate(zip([1, 2], [x, x * 2], strict=True), start=5):
        out = out + i * a * b
    return out


# -- functools, dict subclasses -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _cached_scale(n):
    return n * 2 + 1


@functools.cache
def _cached_pair(n, m=1):
    return (n, m)


@program()
def lru_cache_function(x):
    return x * _cached_scale(3) + _cached_pair(2, m=4)[1]


class _AttrDict(dict):
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def total(self):
        return sum(self.values())

    @property
    def size(self):
        return len(self)


class _PlainSub(dict):
    pass


@program()
def dict_subclass_with_new(x):
    d = _AttrDict(a=x, b=x * 2)
    d["c"] = x * 3
    p = _PlainSub([("k", 1)])
    return d.total() + d.size + p["k"], d, isinstance(d, _AttrDict), p


# -- Counter, operator's getters, copy, heapq, bisect ------------------------------------------------------
@program()
def counter_methods(x):
    c = collections.Counter("abracadabra")
    c.update(["a", "z"])
    c["q"] += 2
    return x * c["a"] + c["missing"], c.most_common(2), c, sorted(c.elements())[:3], c.total()


@program()
def operator_getters(x):
    first, last = operator.itemgetter(0, -1)([x, x * 2, x * 3])
    rows = operator.attrgetter("shape")(x)[0]
    total = operator.methodcaller("sum", 1)(x)
    pairs = sorted([(2, "b"), (1, "a")], key=operator.itemgetter(0))
    return first + last + rows, total, pairs


@program()
def copy_keeps_sharing(x):
    inner = [1, 2]
    outer = [inner, inner, {"k": inner}]
    deep = copy.deepcopy(outer)
    deep[0].append(3)                      # deep[1] and deep[2]["k"] are the same new list
    shallow = copy.copy(outer)
    shallow[0].append(4)                   # the original inner list
    d = copy.copy(collections.OrderedDict(a=x))
    d["b"] = x
    return x * len(deep[1]) + len(inner), deep, shallow, d, copy.copy((x, 1))[0]


@program()
def heapq_and_bisect(x):
    h = [5, 1, 4]
    heapq.heapify(h)
    heapq.heappush(h, 0)
    smallest = heapq.heappop(h)
    alias = h
    heapq.heappushpop(alias, 3)
    sorted_list = [1, 3, 5]
    bisect.insort(sorted_list, 4)
    at = bisect.bisect_left(sorted_list, 3) + bisect.bisect(sorted_list, 5)
    return x * (smallest + at), h, sorted_list, heapq.nlargest(2, [3, 9, 1]), \
        heapq.nsmallest(1, ["bb", "a"], key=len)
