"""Guards on what a frame read of a container's contents or an object's truth: `in` on a set or a
dict held whole, `len()` and iteration of a set, `if obj:` through a user `__bool__`/`__len__`.
Each case calls the compiled function with one input, then with a changed one (or the same object
changed in place), and compares with eager each time, under kiln's own backend and "eager"; the
second call must not reuse the first entry's answer (the Dynamo suite's `TestSetGuards`,
`test_dict_namedtuple`, `test_custom_bool`)."""
from __future__ import annotations

import collections
from collections import namedtuple

import pytest
import torch

import kiln

BACKENDS = [{}, {"backend": "eager"}]


def _check_both(fn, first, second, *, mutate=None):
    """`first()` and `second()` build the inputs; with `mutate`, the first input itself is changed in
    place between the calls (`s.remove(...)`), as the Dynamo tests do."""
    for backend in BACKENDS:
        compiled = kiln.compile(fn, fullgraph=True, **backend)
        x = torch.randn(3)
        a = first()
        torch.testing.assert_close(compiled(x, a), fn(x, first()))
        if mutate is not None:
            mutate(a)
            b, b_eager = a, a
        else:
            b, b_eager = second(), second()
        torch.testing.assert_close(compiled(x, b), fn(x, b_eager))


def _sin_if_pytorch(x, s):
    return x.sin() if "PyTorch" in s else x.cos()


def test_set_membership_after_remove():
    _check_both(_sin_if_pytorch, lambda: {"PyTorch", "Numpy"}, None, mutate=lambda s: s.remove("PyTorch"))


def test_set_membership_after_add():
    _check_both(_sin_if_pytorch, lambda: {"Numpy"}, None, mutate=lambda s: s.add("PyTorch"))


def test_set_membership_other_set():
    _check_both(_sin_if_pytorch, lambda: {"PyTorch"}, lambda: {"Jax"})


def test_frozenset_membership():
    _check_both(_sin_if_pytorch, lambda: frozenset({"PyTorch"}), lambda: frozenset({"Jax"}))


def test_set_len():
    _check_both(lambda x, s: x + len(s), lambda: {"a", "b"}, None, mutate=lambda s: s.add("c"))


def test_set_iteration():
    def fn(x, s):
        return sum(x * len(k) for k in s)
    _check_both(fn, lambda: {"a", "bb"}, lambda: {"ccc", "dddd", "e"})


def test_set_truth():
    _check_both(lambda x, s: x.sin() if s else x.cos(), lambda: {1}, None, mutate=lambda s: s.clear())


def test_set_of_objects_membership():
    """Members a guard cannot print (classes) keep the set a real object: the `in` is guarded."""
    _check_both(lambda x, s: x.sin() if int in s else x.cos(), lambda: {int, float}, lambda: {float})


def test_set_of_objects_truth():
    _check_both(lambda x, s: x.sin() if s else x.cos(), lambda: {int, float}, lambda: set())


def test_set_mutated_in_frame_is_written_back():
    def fn(x, s):
        s.add("z")
        s.discard("a")
        return x + len(s)
    for backend in BACKENDS:
        compiled = kiln.compile(fn, fullgraph=True, **backend)
        x = torch.randn(3)
        for start in ({"a", "b"}, {"b", "c"}):
            mine, eager = set(start), set(start)
            torch.testing.assert_close(compiled(x, mine), fn(x, eager))
            assert mine == eager


def test_dict_key_presence_namedtuple_function():
    """`namedtuple in d` (test_dict_namedtuple): a key a guard cannot print keeps the dict a real
    object; the `in` is guarded, so a dict without the key takes the other branch."""
    def fn(x, d):
        return d[3] * 2 if namedtuple in d else d[3] * 3
    _check_both(fn, lambda: {namedtuple: None, 3: torch.ones(3)}, lambda: {2: None, 3: torch.ones(3)})


def test_dict_key_presence_namedtuple_and_string():
    point = collections.namedtuple("Point", "x y")

    def fn(x, d):
        return x.sin() if point(1, 2) in d and "k" in d else x.cos()
    _check_both(fn, lambda: {point(1, 2): 0, "k": 1}, lambda: {point(3, 4): 0, "k": 1})
    _check_both(fn, lambda: {point(1, 2): 0, "k": 1}, lambda: {point(1, 2): 0, "j": 1})


class _Flag:
    def __init__(self, result: bool):
        self._result = result

    def __bool__(self):
        return self._result


class _Sized:
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n


class _FlagDict(dict):
    def __bool__(self):
        return self.get("on", 0) > 0


@pytest.mark.parametrize("first,second", [
    (lambda: _Flag(True), lambda: _Flag(False)),
    (lambda: _Flag(False), lambda: _Flag(True)),
    (lambda: _Sized(1), lambda: _Sized(0)),
    (lambda: _FlagDict(on=1), lambda: _FlagDict(on=0)),
], ids=["bool-true-then-false", "bool-false-then-true", "len", "dict-subclass-bool"])
def test_user_truth(first, second):
    def fn(x, obj):
        return x.sin() * (1 if bool(obj) else 2) * (3 if not obj else 4) if obj else x.cos()
    _check_both(fn, first, second)


def test_iterating_a_set_of_classes():
    def fn(x, s):
        out = x
        for t in s:
            out = out * (2 if t is int else 3)
        return out
    _check_both(fn, lambda: {int}, lambda: {float})
    _check_both(fn, lambda: {int, float}, lambda: {float})


def test_iterating_a_dict_keyed_by_functions():
    def fn(x, d):
        out = x
        for k in d:
            out = out * (2 if k is namedtuple else 3)
        return out
    _check_both(fn, lambda: {namedtuple: 2, 3: 4}, lambda: {3: 4, namedtuple: 2, 5: 7})


def test_iterating_a_set_of_tensors_guards_their_identity():
    """Members `==` cannot tell apart are guarded by identity: another set of tensors (equal
    values included) recompiles, never reuses the first call's tensors."""
    def fn(x, s):
        out = x
        for t in s:
            out = out * t
        return out
    for backend in BACKENDS:
        compiled = kiln.compile(fn, fullgraph=True, **backend)
        x = torch.randn(3)
        for s in ({torch.ones(3)}, {torch.full((3,), 2.0)}, {torch.full((3,), 2.0), torch.ones(3)}):
            torch.testing.assert_close(compiled(x, s), fn(x, s))
