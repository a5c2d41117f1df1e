"""`==` and `!=` in captured code answer as Python does: dicts and sets compare by content (they
compared by identity, so `d == {...}` was always False: a wrong result, not a refusal), and a user
class's own __eq__ / __ne__ (a dataclass's too) is called, the reflected one when the left operand
has none."""
import collections
import dataclasses

import pytest
import torch

import kiln


@dataclasses.dataclass
class Point:
    a: int
    b: int


class Tagged:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Tagged) and self.v == other.v


class OnlyNe:
    def __init__(self, v):
        self.v = v

    def __ne__(self, other):
        return self.v != other.v


CASES = {
    "dict_equal": lambda t, d: t * (d == {"b": 2, "a": 1}),
    "dict_other_value": lambda t, d: t * (d == {"a": 1, "b": 3}),
    "dict_more_keys": lambda t, d: t * (d != {"a": 1}),
    "dict_of_lists": lambda t, d: t * ({"k": [1, 2]} == {"k": [1, 2]}),
    "ordered_dicts_in_other_order": lambda t, d: t * (collections.OrderedDict([("a", 1), ("b", 2)]) ==
                                                       collections.OrderedDict([("b", 2), ("a", 1)])),
    "ordered_dict_and_dict": lambda t, d: t * (collections.OrderedDict([("b", 2), ("a", 1)]) == d),
    "sets": lambda t, d: t * ({1, 2} == {2, 1}) + ({1} != {1, 2}),
    "set_and_frozenset": lambda t, d: t * ({1, 2} == frozenset([2, 1])),
    "dataclass": lambda t, d: t * (Point(1, 2) == Point(1, 2)) + (Point(1, 2) != Point(1, 3)),
    "user_eq": lambda t, d: t * (Tagged(1) == Tagged(1)) + 2 * (Tagged(1) != Tagged(2)),
    "user_eq_reflected": lambda t, d: t * (1 == Tagged(1)) + (None == Point(1, 2)),
    "user_ne_only": lambda t, d: t * (OnlyNe(1) != OnlyNe(1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_equality_matches_eager(name):
    fn, x = CASES[name], torch.ones(3)
    kiln.reset()
    got = kiln.compile(fn, fullgraph=True)(x, {"a": 1, "b": 2})
    assert torch.equal(got, fn(x, {"a": 1, "b": 2}))


def test_an_input_dict_compared_recompiles_when_its_values_change():
    def fn(t, d):
        return t + 1 if d == {"a": 1, "b": 2} else t - 1
    kiln.reset()
    compiled, x = kiln.compile(fn), torch.ones(3)
    for d in ({"a": 1, "b": 2}, {"a": 1, "b": 3}, {"b": 2, "a": 1}, {"a": 1}):
        assert torch.equal(compiled(x, d), fn(x, d)), d


def test_an_input_object_with_eq():
    def fn(t, o):
        return t * (o == Tagged(3))
    kiln.reset()
    compiled, x = kiln.compile(fn, fullgraph=True), torch.ones(3)
    for o in (Tagged(3), Tagged(4)):
        assert torch.equal(compiled(x, o), fn(x, o))
