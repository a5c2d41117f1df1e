"""Python semantics test_repros.py of the Dynamo suite (issue #39) found kiln getting wrong: each
program runs eagerly and under kiln, over calls that must not reuse a stale graph."""
from __future__ import annotations

import collections
import collections.abc
import enum
import sys
import typing
import warnings

import numpy as np
import pytest
import torch
import torch._dynamo  # the reference compiler: its config, which kiln reads

import kiln
from capture_support import Recorder, assert_same


def compiled(fn, backend="eager", **config):
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kiln.compile(fn, backend=backend, **config)


# -- NumPy scalars are constants guarded by value ------------------------------------------------
def scaled_by_list(x, values):
    return x * torch.tensor(values), x * values[0]


def test_numpy_scalar_arguments_are_guarded_by_value():
    # guarded on their type alone, the second call reused the first call's graph
    fn = compiled(scaled_by_list)
    x = torch.ones(3)
    for values in ([np.int64(1), np.int64(2), np.int64(3)], [np.int64(4), np.int64(5), np.int64(6)]):
        assert_same(fn(x, values), scaled_by_list(x, values))
    floats = [np.float32(0.5)]
    assert_same(fn(torch.ones(1), floats), scaled_by_list(torch.ones(1), floats))


# -- an OptimizedModule's training flag is the original's ----------------------------------------
def test_compiled_module_training_is_the_originals():
    mod = torch.nn.Linear(3, 3)
    mod.eval()
    fast = compiled(mod)
    assert not fast.training
    fast.train()
    assert fast.training and mod.training
    mod.eval()
    assert not fast.training


# -- arguments named by Python keywords (`from`) ---------------------------------------------------
def random_between(t, params):
    torch.manual_seed(0)
    return t.random_(**params), torch.empty(3).uniform_(**params)


def test_keyword_named_arguments_reach_the_graph():
    # FX prints keyword arguments as `name = value`: `from = -10` made the graph's code unparsable
    params = {"from": -10, "to": 10}
    assert_same(compiled(random_between)(torch.zeros(2, 3), params), random_between(torch.zeros(2, 3), params))


# -- a complex Python scalar in an aot graph -------------------------------------------------------
def times_2j(x):
    return torch.mul(x, 2j)


def test_complex_scalar_through_aot():
    # mul's backward conjugates the scalar: torch hands `aten._conj` the number itself
    x_ref = torch.randn(4, 2, requires_grad=True)
    x = x_ref.detach().clone().requires_grad_(True)
    out = compiled(times_2j, "aot_eager")(torch.view_as_complex(x))
    expected = times_2j(torch.view_as_complex(x_ref))
    assert_same(out, expected)
    torch.view_as_real(out).sum().backward()
    torch.view_as_real(expected).sum().backward()
    assert_same(x.grad, x_ref.grad)


# -- a map returned from captured code is a map ----------------------------------------------------
def dot2(a, b):
    return a[0] * b[0] + a[1] * b[1]


def maps(xs, ys):
    return map(dot2, xs, ys), filter(lambda x: True, map(dot2, xs, ys))


def test_returned_map_and_filter_keep_their_type():
    xs, ys = [torch.randn(5) for _ in range(3)], [torch.randn(5) for _ in range(4)]
    got, expected = compiled(maps, fullgraph=True)(xs, ys), maps(xs, ys)
    assert [type(g) for g in got] == [map, filter]
    assert_same([list(g) for g in got], [list(e) for e in expected])


# -- torch's aot_eager_decomp_partition backend name -----------------------------------------------
def write_through_view(a):
    b = torch.zeros(4, 3, 5)
    b[:, 0, 1:4] = a
    d = b.transpose(2, 1)
    d.add_(1)
    return d, (a * 2).sin()


def test_aot_eager_decomp_partition_backend():
    a = torch.randn(4, 3, requires_grad=True)
    got = compiled(write_through_view, "aot_eager_decomp_partition")(a)
    assert_same(got, write_through_view(a))
    got[1].sum().backward()
    assert_same(a.grad, 2 * (a * 2).cos().detach())


# -- `x.data = y` of an input ([Note: .data = ...] in kiln/capture/attributes.py) -------------------
def data_then_add(x, y):
    x.data = y
    x.add_(1)
    return x


def data_swapped_twice(x, y):
    z = x
    x.data = y
    y.data = torch.zeros([0])
    return x, x is z


def data_then_graph_use(x, y):
    x.data = y * 2
    return x * 3, x.shape, x.requires_grad


@pytest.mark.parametrize("fn, requires_grad, fullgraph", [(data_then_add, False, True), (data_swapped_twice, True, True),
                                                          (data_then_graph_use, True, False)])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_setting_data_of_an_input(fn, requires_grad, fullgraph, backend):
    if fn is data_then_add and backend != "eager":
        pytest.skip("an in-place op on an input's replaced data: eager backend only, as in the Dynamo suite")
    compiled_fn = compiled(fn, backend, fullgraph=fullgraph)
    for _ in range(3):    # one graph, reused: the replay happens on every call
        ours = [torch.ones(3, requires_grad=requires_grad), torch.arange(3.0).requires_grad_(requires_grad)]
        theirs = [t.detach().clone().requires_grad_(requires_grad) for t in ours]
        got, expected = compiled_fn(*ours), fn(*theirs)
        assert_same(got, expected)
        assert_same(ours, theirs)
        assert (got[0] if isinstance(got, tuple) else got) is ours[0] or fn is data_then_graph_use
        if requires_grad:
            grad = torch.randn(3)
            ours[0].backward(grad)
            theirs[0].backward(grad)
            assert_same(ours[0].grad, theirs[0].grad)


# -- `assert` on a tensor's truth: checked after the graph ------------------------------------------
_ASSERTS = """
def asserts_on_values(x):
    b = x.sin()
    assert x[0] == 3, "First dim need to be 3"
    assert x.sum() > 0
    return x.cos() + b
"""
_namespace: dict = {}
exec(compile(_ASSERTS, __file__, "exec"), _namespace)   # `assert`'s own bytecode: pytest rewrites this module's
asserts_on_values = _namespace["asserts_on_values"]


def test_assert_on_a_tensor_is_checked_after_the_graph():
    recorder = Recorder()
    fn = compiled(asserts_on_values, recorder, fullgraph=True)
    x = torch.tensor([3.0, 4.0, 5.0])
    assert_same(fn(x), asserts_on_values(x))
    assert len(recorder.graphs) == 1
    with pytest.raises(AssertionError, match="First dim need to be 3"):
        fn(torch.tensor([5.0, 4.0, 5.0]))
    with pytest.raises(AssertionError, match="checked after the compiled graph ran"):
        fn(torch.tensor([3.0, -4.0, -5.0]))


# -- an attribute an object lacks, or takes from its class, is guarded absent from the instance ----
class Config:
    scale = 2.0


def reads_config(cfg, x):
    if hasattr(cfg, "bias"):
        return x * cfg.scale + cfg.bias
    return x * cfg.scale


def test_an_instance_attribute_set_later_is_a_miss():
    fn, cfg, x = compiled(reads_config), Config(), torch.randn(3)
    assert_same(fn(cfg, x), reads_config(cfg, x))
    cfg.bias = 1.0           # hasattr was False: the first graph must not be reused
    assert_same(fn(cfg, x), reads_config(cfg, x))
    cfg.scale = 3.0          # shadows the class attribute read before
    assert_same(fn(cfg, x), reads_config(cfg, x))


# -- `obj.__class__ = Other` -------------------------------------------------------------------------
class Base:
    def __init__(self, x):
        self.x = x

    def kind(self):
        return "base"


class Derived(Base):
    def kind(self):
        return "derived"


def reclassed(x):
    obj = Base(x)
    obj.__class__ = Derived
    return x + 1, isinstance(obj, Derived), obj.kind(), hasattr(obj, "y"), obj


def reclass_argument(obj, x):
    obj.__class__ = Derived
    return x * 2, obj.kind()


def test_assigning_class_of_an_object():
    x = torch.ones(2)
    assert_same(compiled(reclassed, fullgraph=True)(x), reclassed(x))
    ours, theirs = Base(1), Base(1)
    assert_same(compiled(reclass_argument)(ours, x), reclass_argument(theirs, x))   # breaks the graph
    assert type(ours) is type(theirs) is Derived


# -- torch.use_deterministic_algorithms in captured code: in order, and put back after the trace ---
_STATES: list = []


@torch._dynamo.allow_in_graph
def record_deterministic():
    _STATES.append((torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()))


def turns_determinism_off(x):
    record_deterministic()
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False, warn_only=False)
    return x + 1 if enabled else x - 1


def test_deterministic_algorithms_set_in_captured_code():
    prior = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    fn = compiled(turns_determinism_off, fullgraph=True)
    try:
        for mode in (True, True, False):
            _STATES.clear()
            torch.use_deterministic_algorithms(mode, warn_only=True)
            x = torch.zeros(2)
            # the trace's own run (compiling, which calls the allowed function too) set nothing the
            # graph then sees: the state as the call found it, and after it the one the function left
            assert_same(fn(x), x + 1 if mode else x - 1)
            assert _STATES[-1] == (mode, True)
            assert not torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(prior[0], warn_only=prior[1])


# -- attributes set on an instance of a namedtuple's subclass ----------------------------------------
class Pair(typing.NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class PairWithExtras(Pair):
    pass


def extra_on_argument(tup):
    tup.c = tup.a * 3
    return tup, tup.c + 1


def extra_on_new():
    tup = PairWithExtras(a=torch.tensor([1.0]), b=torch.tensor(2.0))
    tup.c = torch.tensor(3.0)
    return tup


def test_attributes_of_a_namedtuple_subclass_instance():
    ours, theirs = PairWithExtras(torch.ones(2), torch.zeros(2)), PairWithExtras(torch.ones(2), torch.zeros(2))
    got = compiled(extra_on_argument, fullgraph=True)(ours)
    assert_same(got, extra_on_argument(theirs))
    assert got[0] is ours and hasattr(ours, "c")
    made = compiled(extra_on_new, fullgraph=True)()     # the attribute was dropped: wrong results
    assert_same(made, extra_on_new())
    assert_same(made.c, torch.tensor(3.0))


# -- a classmethod chaining a property (Python 3.9 to 3.12) -------------------------------------------
class Index(enum.IntEnum):
    X = 0
    Y = 1

    @classmethod
    def size(cls):
        return 3

    if sys.version_info < (3, 13):
        @classmethod
        @property
        def POINT(cls):
            return slice(cls.X, cls.Y + 1)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="Python 3.13 no longer chains classmethod and property")
def test_classmethod_property():
    def fn(x):
        x = x.clone()
        x[..., Index.POINT] = x[..., Index.POINT].tanh() * Index.size()
        return x
    x = torch.randn(2, 3)
    assert_same(compiled(fn, fullgraph=True)(x), fn(x))


# -- a user's container subclass: called (its __call__), and read by dict's own methods ----------------
class Processors(list):
    def __call__(self, x):
        for processor in self:
            x = processor(x)
        return x


def merged_and_called(x, left, right):
    if len(right) == 0:
        return left(x)
    left.extend(right)
    return left(x)


class Output(collections.OrderedDict):
    def __getitem__(self, k):
        return dict(self.items())[k] if isinstance(k, str) else self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def test_container_subclasses_called_and_read():
    x = torch.randn(8)
    fn = compiled(merged_and_called, fullgraph=True)
    theirs = Processors([torch.nn.ReLU(), torch.nn.Sigmoid()])
    ours = Processors([torch.nn.ReLU(), torch.nn.Sigmoid()])
    assert_same(fn(x, ours, Processors([torch.nn.SiLU()])), merged_and_called(x, theirs, Processors([torch.nn.SiLU()])))
    assert len(ours) == 3
    out = Output(a=torch.randn(4), b=torch.randn(4))
    for read in (lambda o: o["b"] + 1, lambda o: o.to_tuple()[0] + 1, lambda o: o[1] * 2):
        assert_same(compiled(read, fullgraph=True)(out), read(out))


# -- a sparse tensor reaching a frame -------------------------------------------------------------------
def sparse_then_scaled(x):
    x_sparse = x.to_sparse()
    return x_sparse * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_sparse_tensor_runs_its_frame_as_python(backend):
    # the resume function got the sparse tensor as an input kiln's fakes cannot be: an error
    x = torch.randn(4, 4)
    assert_same(compiled(sparse_then_scaled, backend)(x).to_dense(), sparse_then_scaled(x).to_dense())


# -- bool() of a number read from a tensor: computed by the graph --------------------------------------
def all_zero(mask):
    return bool((mask == 0).all())


def item_truth(x):
    return bool(x.item())


def truth(x):
    return bool(x)


@pytest.mark.parametrize("fn, inputs", [(all_zero, [torch.zeros(2, 3), torch.tensor([[0, 1], [0, 0]])]),
                                        (item_truth, [torch.tensor([3]), torch.tensor([0])]),
                                        (item_truth, [torch.tensor([True]), torch.tensor([False])]),
                                        (truth, [torch.tensor(3.14), torch.tensor(0.0)])])
def test_bool_of_a_number_read_from_a_tensor(fn, inputs):
    # a guard on it could not be checked (it depends on the data): refused under fullgraph
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled_fn = compiled(fn, fullgraph=True)
        for x in inputs:     # one graph for both values
            assert compiled_fn(x) is fn(x)
        with pytest.raises(RuntimeError, match="ambiguous"):   # as eager's
            compiled(truth, fullgraph=True)(torch.tensor([1, 2, 3]))


# -- `**mapping` of a mapping that is no dict -------------------------------------------------------------
class Registry(collections.abc.MutableMapping, torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self._items = kwargs

    def keys(self):
        return self._items.keys()

    def __getitem__(self, item):
        return self._items[item]

    def __setitem__(self, key, value):
        self._items[key] = value

    def __delitem__(self, item):
        del self._items[item]

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        yield from self._items


def unpacks_a_mapping(x, d):
    return x * d["a"] + sum(dict(**d).values()), {**d}


def test_double_star_of_a_mapping():
    d, x = Registry(a=torch.ones(2), b=torch.full((2,), 2.0)), torch.randn(2)
    assert_same(compiled(unpacks_a_mapping, fullgraph=True)(x, d), unpacks_a_mapping(x, d))


# -- descriptors written in Python: __set__ on a store, __get__ on a read --------------------------
class Doubling:     # __set__ only: reads go to the instance dict
    def __set__(self, obj, value):
        obj.__dict__["field"] += value * 2


class Shifted:      # a data descriptor: __get__ and __set__
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, objtype=None):
        return getattr(obj, self.name) * 10

    def __set__(self, obj, value):
        setattr(obj, self.name, value + 1)


class WithDescriptors:
    field = Doubling()
    shifted = Shifted()

    def __init__(self):
        self.__dict__["field"] = 0


def stores_through_descriptors(x, obj):
    obj.field = 10
    obj.shifted = 3
    return x + obj.field + obj.shifted


def test_stores_through_python_descriptors():
    ours, theirs, x = WithDescriptors(), WithDescriptors(), torch.zeros(2)
    assert_same(compiled(stores_through_descriptors, fullgraph=True)(x, ours), stores_through_descriptors(x, theirs))
    assert (ours.field, ours._shifted) == (theirs.field, theirs._shifted) == (20, 4)


# -- a method of a torch object FX cannot name: run outside the graph --------------------------------
def reseeds(x):
    state = torch.default_generator.get_state()
    a = torch.rand(3) + x
    torch.default_generator.set_state(state)
    return a, torch.rand(3) + x


def test_generator_state_methods():
    # as graph nodes, the graph's code could not be printed (no module to read them from)
    x = torch.zeros(3)
    a, b = compiled(reseeds)(x)
    assert_same(a, b)


def test_jit_trace_of_a_compiled_function_is_refused_plainly():
    fn = compiled(lambda x: x + 1, dynamic=True)
    with pytest.raises(RuntimeError, match="torch.jit.trace"):
        torch.jit.trace(fn, torch.randn(3))


# -- an input's sizes changed in place -----------------------------------------------------------------
def unsqueezes_input(x):
    x.unsqueeze_(0)
    return x + 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_input_metadata_written_in_place(backend):
    # aot refused it (the caller's tensor would change): the call runs before the graph, on the input
    ours, theirs = torch.randn(3, 4), torch.randn(3, 4)
    theirs.copy_(ours)
    assert_same(compiled(unsqueezes_input, backend)(ours), unsqueezes_input(theirs))
    assert ours.shape == theirs.shape == (1, 3, 4)
