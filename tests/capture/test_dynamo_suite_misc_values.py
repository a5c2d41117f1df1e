"""test_misc.py of the Dynamo suite (issue #39), second round: programs kiln got wrong or split
differently from torch.compile. Each runs eagerly, under torch.compile (a recording backend) and
under kiln's capture: kiln must give eager's values, and as many graphs and ops as torch.compile."""
from __future__ import annotations

import torch
import torch._dynamo  # mark_dynamic, as a user marks a dim

import kiln
import kiln.capture
from capture_support import Recorder, assert_same, eager_torch_kiln
from kiln.config import CaptureConfig


def same_as_torch(fn, *args, **config):
    expected, got_t, got, theirs, ours = eager_torch_kiln(fn, *args, **config)
    assert_same(got_t, expected)
    assert_same(got, expected)
    assert len(ours.graphs) == len(theirs.graphs), (len(ours.graphs), len(theirs.graphs))
    return got, theirs, ours


def op_count(recorder) -> int:
    return sum(node.op in ("call_function", "call_method", "call_module")
               for gm in recorder.graphs for node in gm.graph.nodes)


# -- an operator on existing user objects runs their Python method in the graph -----------------------
class Boxed:
    def __init__(self, x):
        self.x = x

    def __add__(self, other):
        return Boxed(self.x + other.x)

    def __lt__(self, other):
        return bool((self.x < other.x).all()) if isinstance(self.x, int) else NotImplemented

    def __radd__(self, other):
        return self.x + other


def adds_boxes(a, b):
    return (a + b).x


def int_plus_box(x, c):
    return x + (x.shape[0] + c)


def test_operator_on_user_objects_is_traced_not_folded():
    """`a + b` on two objects passed in ran Boxed.__add__ at capture time and returned its result
    as a constant: a second call with other boxes got the first call's sum back."""
    x, y = torch.randn(3), torch.randn(3)
    same_as_torch(adds_boxes, Boxed(x), Boxed(x + 1))
    ours = Recorder()
    compiled = kiln.capture.capture(adds_boxes, ours, CaptureConfig())
    compiled(Boxed(x), Boxed(x + 1))
    assert_same(compiled(Boxed(y), Boxed(y * 2)), y + y * 2)
    assert len(ours.graphs) == 1


def test_reflected_operator_of_a_user_object():
    same_as_torch(int_plus_box, torch.randn(3), Boxed(4))


# -- iterating over a tensor takes its rows by index --------------------------------------------------
def adds_to_each_row(x):
    for y in x:
        y.add_(1.0)
    return y


def cat_of_rows(x):
    return torch.cat([*x], dim=-1)


def test_tensor_iteration_has_torch_compiles_ops():
    for fn, arg in ((adds_to_each_row, torch.randn(10, 10)), (cat_of_rows, torch.randn(1, 1, 4, 5))):
        _, theirs, ours = same_as_torch(fn, arg)
        assert op_count(ours) == op_count(theirs), (fn.__name__, op_count(ours), op_count(theirs))


# -- tensors traced as distinct objects are guarded to stay distinct ---------------------------------
G1 = torch.randn(4)


def counts_a_set_of_tensors(a, b, c):
    return a + len({G1, a, b, c})


def adds_if_same(a, b):
    return a + (1 if a is b else 2)


def test_a_call_that_aliases_inputs_traced_apart_recompiles():
    """Traced with three distinct tensors, the set had four members; a call passing one tensor
    three times (or the global itself) got 4 added, where eager adds 2 (or 1)."""
    x, y, z = torch.randn(4), torch.randn(4), torch.randn(4)
    for fn, calls in ((counts_a_set_of_tensors, [(x, y, z), (x, x, x), (G1, G1, G1), (y, x, z)]),
                      (adds_if_same, [(x, y), (x, x), (y, z)])):
        kiln.reset()
        ours = Recorder()
        compiled = kiln.capture.capture(fn, ours, CaptureConfig())
        for args in calls:
            assert_same(compiled(*args), fn(*args))
        assert 1 < len(ours.graphs) <= len(calls)   # the aliasing calls recompiled


# -- a dim marked dynamic that the code specializes: torch.compile's error class too ----------------
def branches_on_a_marked_dim(x):
    return x.sin() if x.shape[0] == 3 else x.cos()


def test_specializing_a_marked_dim_raises_a_constraint_violation():
    """kiln's DynamicDimSpecialized (the Dynamo suite's shim lets a test's ConstraintViolationError
    accept it, kiln/bench/dynamo_suite.py)."""
    import pytest
    kiln.reset()
    x = torch.randn(3, 3)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(kiln.errors.DynamicDimSpecialized):
        kiln.compile(branches_on_a_marked_dim, backend="eager")(x)
    with pytest.raises(kiln.errors.Unsupported):
        kiln.compile(branches_on_a_marked_dim, backend="eager")(x)


# -- a container's __class__ is its class ---------------------------------------------------------------
def rebuilds_by_class(x):
    return x.__class__([v + 1 for v in x])


def test_container_class_rebuilds_the_container():
    """`x.__class__` of a list read type's `__class__` method off list, so `x.__class__(items)`
    was `type(x, items)`, refused as a class creation."""
    got, _, _ = same_as_torch(rebuilds_by_class, [torch.zeros(2), torch.ones(2)], fullgraph=True)
    assert type(got) is list
    got, _, _ = same_as_torch(rebuilds_by_class, (torch.zeros(2), torch.ones(2)), fullgraph=True)
    assert type(got) is tuple


# -- a call under other global switches compiles again -----------------------------------------------
def test_deterministic_algorithms_switch_recompiles():
    """A backend may choose its kernels by torch.are_deterministic_algorithms_enabled() (or TF32);
    an entry compiled under one setting ran under the other."""
    prior = torch.are_deterministic_algorithms_enabled()
    kiln.reset()
    ours = Recorder()
    compiled = kiln.capture.capture(lambda x: x + 1, ours, CaptureConfig())
    try:
        for state in (False, True, False, True):
            torch.use_deterministic_algorithms(state)
            assert_same(compiled(torch.ones(2)), torch.full((2,), 2.0))
    finally:
        torch.use_deterministic_algorithms(prior)
    assert len(ours.graphs) == 2


# -- a class statement in captured code: the graph breaks at it, the code around it is captured -----
def defines_a_class(x):
    x = x + 1

    class Local:
        scale = 3

    return x.sin() * Local.scale, Local.__name__


def test_class_statement_breaks_the_graph_not_the_function():
    """LOAD_BUILD_CLASS was refused outright and the whole function ran eagerly (no graph);
    torch.compile breaks at the class's creation and captures both sides."""
    got, theirs, ours = same_as_torch(defines_a_class, torch.randn(3))
    assert len(ours.graphs) == 2


# -- an existing object's own __getattribute__ answers its attribute reads ----------------------------
class Remapped:
    def __init__(self):
        self.a = 1
        self.b = 10

    def __getattribute__(self, name):
        if name == "sentinel":
            raise AttributeError(name)
        return super().__getattribute__("b" if name == "a" else name)

    def __getattr__(self, name):
        if name == "sentinel":
            return 5
        raise AttributeError(name)


def reads_remapped(x, o):
    return x + o.a * o.sentinel


def test_user_getattribute_of_an_existing_object():
    """`o.a` read o.__dict__['a'] (1) past the class's __getattribute__, which answers o.b (10):
    a wrong value; and its AttributeError did not fall back to __getattr__."""
    same_as_torch(reads_remapped, torch.zeros(2), Remapped(), fullgraph=True)


# -- builtins and operators on an existing user object run its Python methods in the trace -----------
class Count:
    def __init__(self, n):
        self.n = n

    def __contains__(self, k):
        return k == self.n

    def __neg__(self):
        return -self.n

    def __abs__(self):
        return self.n + 100

    def __index__(self):
        return self.n

    def __float__(self):
        return float(self.n)


PROTOCOL_PROGRAMS = [
    lambda x, o: x + (3 in o),
    lambda x, o: x + (-o),
    lambda x, o: x + abs(o),
    lambda x, o: x + int(o),
    lambda x, o: x + float(o),
    lambda x, o: x + len(range(o)),
]


def test_protocol_methods_of_user_objects_are_traced_not_folded():
    """`-o`, `abs(o)`, `int(o)`, `k in o`, `range(o)` ran o's method at capture time on the first
    call's object; a call with another Count got the first one's answer."""
    for fn in PROTOCOL_PROGRAMS:
        kiln.reset()
        compiled = kiln.capture.capture(fn, Recorder(), CaptureConfig())
        for n in (3, 5, 2):
            assert_same(compiled(torch.zeros(1), Count(n)), fn(torch.zeros(1), Count(n)))
