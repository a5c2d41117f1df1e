"""Dict keys and set members that Python hashes by value but kiln cannot fold to a constant
(issue #39, test_dicts.py): objects of a user's class with their own `__hash__`/`__eq__` made in
traced code, frozen dataclasses, namedtuples holding a functools.partial. Each is compared with
eager under `fullgraph=True` ([Note: keys hashed by value] in kiln/capture/keys.py)."""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, NamedTuple

import pytest
import torch

import kiln
import kiln.errors
from capture_support import assert_same


def same_as_eager(fn, *args):
    expected = fn(*args)
    for backend in ({}, {"backend": "eager"}):
        kiln.reset()
        assert_same(kiln.compile(fn, fullgraph=True, **backend)(*args), expected)


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


def frozen_dataclass_keys(t):
    d = {Point(1, 2): t * 2, Point(3, 4): t * 3}
    d[Point(1, 2)] = d[Point(1, 2)] + 1      # an equal key writes the entry, the first key stays
    keys = list(d)
    return d[Point(1, 2)] + d[Point(3, 4)], keys, Point(3, 4) in d, Point(5, 6) in d, len(d)


def test_frozen_dataclass_as_dict_key():
    same_as_eager(frozen_dataclass_keys, torch.randn(4))


def frozen_dataclass_set(t):
    s = {Point(1, 2), Point(3, 4), Point(1, 2)}
    return t + len(s), sorted((p.x, p.y) for p in s), Point(3, 4) in s


def test_frozen_dataclass_as_set_member():
    same_as_eager(frozen_dataclass_set, torch.randn(4))


class Holder(NamedTuple):
    fn: Callable
    const: int


def _add(x, y):
    return x + y


def namedtuple_holding_partial(t):
    d = {}
    fn = functools.partial(_add, x=1)
    d[Holder(fn, 4)] = 5
    other = functools.partial(_add, x=1)          # another partial: hashed by identity, not found
    return t * d[Holder(fn, 4)], Holder(other, 4) in d, (fn, 4) in d


def test_namedtuple_holding_partial_as_dict_key():
    same_as_eager(namedtuple_holding_partial, torch.randn(4))


class ByName:
    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, ByName) and other.name == self.name


def user_hash_and_eq(t):
    d = {ByName("a"): t, ByName("b"): t * 2}
    d[ByName("a")] = t + 1
    return d[ByName("a")] + d[ByName("b")], [k.name for k in d], d.get(ByName("c"), 7)


def test_user_class_with_hash_and_eq_as_dict_key():
    same_as_eager(user_hash_and_eq, torch.randn(4))


class RaisingEq(Exception):
    pass


class BadCmp:
    def __eq__(self, other):
        raise RaisingEq

    def __hash__(self):
        return 1


def eq_raises_in_dict_compare(t):
    key = BadCmp()
    d = {key: 1}
    found = d[key]                    # the same object: found by identity, no __eq__
    try:
        d == {1: 1}                   # noqa: B015  equal hashes: __eq__ runs and raises
    except RaisingEq:
        return t + found, "raised"
    return t, "not raised"


def test_key_eq_raising_in_dict_compare():
    same_as_eager(eq_raises_in_dict_compare, torch.randn(4))


class CountingHash:
    calls = 0

    def __init__(self, v):
        self.v = v

    def __hash__(self):
        self.hashed = True            # changes the object: kiln would change only its shadow
        return self.v

    def __eq__(self, other):
        return self.v == other.v


def hash_with_side_effect(t):
    return t + len({CountingHash(1): 1})


def test_hash_that_changes_its_object_is_refused():
    kiln.reset()
    with pytest.raises(kiln.errors.Unsupported, match="used as a dict key"):
        kiln.compile(hash_with_side_effect, fullgraph=True)(torch.randn(4))
    kiln.reset()
    t = torch.randn(4)
    assert_same(kiln.compile(hash_with_side_effect)(t), hash_with_side_effect(t))


def ordered_dict_of_points(t):
    d = collections.OrderedDict([(Point(1, 1), t), (Point(2, 2), t * 2)])
    d.move_to_end(Point(1, 1))
    return list(d.items())[0][1], [p.x for p in d]


def test_ordered_dict_with_value_keys():
    same_as_eager(ordered_dict_of_points, torch.randn(4))


class HoldsTensor:
    def __init__(self, t):
        self.t = t

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return bool((self.t == other.t).all())


def key_holding_a_tensor(t):
    d = {HoldsTensor(t): 1}
    return t + d[HoldsTensor(t)]


def test_user_key_holding_a_tensor_is_refused_not_misread():
    """Its `__eq__` would see a tracker in kiln's shadow: refused under fullgraph, eager otherwise."""
    kiln.reset()
    with pytest.raises(kiln.errors.Unsupported, match="used as a dict key"):
        kiln.compile(key_holding_a_tensor, fullgraph=True)(torch.randn(4))
    kiln.reset()
    t = torch.randn(4)
    assert_same(kiln.compile(key_holding_a_tensor)(t), key_holding_a_tensor(t))


# -- a dict of the program's keyed by tensors: keyed by identity, its key order guarded --------------
def reads_by_a_tensor_key(d, x):
    return d[x] + 3


def test_dict_keyed_by_tensors_read_by_an_argument():
    x, y, z = torch.randn(4), torch.randn(4), torch.randn(4)
    first = {x: y, 3: z}
    counted = []
    kiln.reset()
    compiled = kiln.compile(reads_by_a_tensor_key, fullgraph=True,
                            backend=lambda gm, example_inputs: counted.append(gm) or gm.forward)
    assert_same(compiled(first, x), reads_by_a_tensor_key(first, x))
    compiled(first, x)
    assert len(counted) == 1
    reordered = {3: z, x: y}            # another key order: compiled again, as torch.compile does
    assert_same(compiled(reordered, x), reads_by_a_tensor_key(reordered, x))
    assert len(counted) == 2
    other = {x: z, 3: y}                # the same key objects: read through the argument
    assert_same(compiled(other, x), reads_by_a_tensor_key(other, x))


# -- a program's dict subclass with its own __getitem__, written to and read through it --------------
class CountingDict(dict):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def __getitem__(self, key):
        self.calls += 1
        return super().__getitem__(key) + 1


def writes_then_reads_a_counting_dict(x, d):
    d["d"] = 4
    return x * d["a"] + d["b"] + d["d"], d.get("a"), sorted(d.items())


def test_dict_subclass_with_own_getitem_written_and_read():
    kiln.reset()
    graphs = []
    compiled = kiln.compile(writes_then_reads_a_counting_dict, fullgraph=True,
                            backend=lambda gm, example_inputs: graphs.append(gm) or gm.forward)
    for _ in range(3):                # the guards read items past the subclass's __getitem__
        expected_d, got_d = CountingDict(a=2, b=3), CountingDict(a=2, b=3)
        expected = writes_then_reads_a_counting_dict(torch.ones(2), expected_d)
        assert_same(compiled(torch.ones(2), got_d), expected)
        assert got_d.calls == expected_d.calls == 3 and dict(got_d) == dict(expected_d)
    assert len(graphs) == 1           # the guards hold on the later calls: no recompile
