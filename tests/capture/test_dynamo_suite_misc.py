"""Python and torch semantics test_misc.py and test_repros.py of the Dynamo suite (issue #39) found
kiln refusing or getting wrong. Each program runs eagerly, under torch.compile (a recording
backend) and under kiln's capture: kiln must give eager's values, and as many graphs as
torch.compile."""
from __future__ import annotations

import warnings

import torch
import torch._dynamo  # the reference compiler; tests may use torch's compiler
from torch.utils import _pytree as pytree

import kiln
import kiln.capture
from capture_support import Recorder, assert_same, eager_torch_kiln
from kiln.config import CaptureConfig


def same_as_torch(fn, *args, **config):
    """`fn(*args)` under kiln matches eager, and kiln makes as many graphs as torch.compile;
    returns kiln's result."""
    expected, got_t, got, theirs, ours = eager_torch_kiln(fn, *args, **config)
    assert_same(got_t, expected)
    assert_same(got, expected)
    assert len(ours.graphs) == len(theirs.graphs), (len(ours.graphs), len(theirs.graphs))
    return got


# -- structseqs (torch.return_types) built in captured code ------------------------------------------
def builds_structseq(x):
    r = torch.return_types.max((x + 1, torch.zeros(3, dtype=torch.long)))
    return r, r.values * 2, r.indices


def pytree_over_structseq(x):
    tree = {"a": torch.return_types.qr((2 * x, None)), "b": [x, x - 1]}
    leaves, spec = pytree.tree_flatten(tree)
    return leaves, pytree.tree_unflatten([leaf * 3 if leaf is not None else None for leaf in leaves], spec)


def test_structseq_built_in_captured_code():
    got = same_as_torch(builds_structseq, torch.randn(3), fullgraph=True)
    assert type(got[0]) is torch.return_types.max


def test_pytree_over_a_structseq():
    got = same_as_torch(pytree_over_structseq, torch.randn(3, 2), fullgraph=True)
    assert type(got[1]["a"]) is torch.return_types.qr


# -- torch._higher_order_ops.wrap: its body traced inline ---------------------------------------------
from torch._higher_order_ops.wrap import wrap  # noqa: E402

GLOBAL_SCALE = 3.0


def wraps_nested_closures(x, y):
    z = x + y
    return wrap(lambda a: wrap(lambda b: b * GLOBAL_SCALE + z, a), x), wrap(lambda a, *, k: [a.sin(), k], y, k=2)


def test_wrap_calls_its_body():
    same_as_torch(wraps_nested_closures, torch.randn(3), torch.randn(3), fullgraph=True)


# -- Tensor.tolist() of an integer tensor: unbacked symbols, one graph -------------------------------
def scales_tolist(x):
    out = []
    for row in x.tolist():
        out.append([v * 4 for v in row] if isinstance(row, list) else row * 4)
    return out, x.sum()


def zero_dim_tolist(x):
    return x.tolist() + 1


def test_tolist_of_an_integer_tensor():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        same_as_torch(scales_tolist, torch.tensor([2, 1]), fullgraph=True)
        same_as_torch(scales_tolist, torch.tensor([[1, 2], [3, 4], [5, 6]]), fullgraph=True)
        same_as_torch(zero_dim_tolist, torch.tensor(7), fullgraph=True)


def broken_at_tolist(a):
    a = a * 100
    u0, u1, *_ = a.tolist()
    return a * u0 * u1


def test_tolist_breaks_the_graph_without_capture_scalar_outputs():
    with torch._dynamo.config.patch(capture_scalar_outputs=False):
        same_as_torch(broken_at_tolist, torch.tensor([1, 2, 3, 4, 5]))


# -- a compiled call keeps none of its arguments alive -----------------------------------------------
def test_compiled_code_does_not_keep_its_inputs_alive():
    import gc
    import weakref

    def double(x, mod):
        return mod(x + x)

    compilers = (lambda fn: kiln.capture.capture(fn, Recorder(), CaptureConfig(fullgraph=True)),
                 lambda fn: kiln.compile(fn, backend="eager", fullgraph=True))
    for compile_ in compilers:
        kiln.reset()   # the compile caches of earlier tests hold nothing of this one
        x, mod = torch.rand(4, 3), torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        refs = [weakref.ref(x), weakref.ref(mod), weakref.ref(mod[0].weight)]
        compiled = compile_(double)
        assert_same(compiled(x, mod), double(x, mod))
        del x
        gc.collect()
        assert refs[0]() is None     # the input tensor, while the compiled function lives on
        del mod, compiled
        gc.collect()
        assert [r() for r in refs] == [None, None, None]   # the module, once the function is gone


# -- a class's own __new__ -----------------------------------------------------------------------------
class Scaled:
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, scale):
        self.scale = scale


class Doubled(Scaled):
    def __init__(self, scale):
        super().__init__(scale * 2)


class Cached:
    made = None

    def __new__(cls, value):
        if value is None:
            return cls.made        # not an instance: __init__ is not run
        return object.__new__(cls)

    def __init__(self, value):
        self.value = value


def builds_objects_with_their_new(x):
    a, b = Scaled(3), Doubled(x.shape[0])
    c = Cached(None)
    return x * a.scale + b.scale, type(b).__name__, c, Cached(x).value


def test_a_class_s_own_new_is_followed():
    got = same_as_torch(builds_objects_with_their_new, torch.randn(4), fullgraph=True)
    assert got[2] is None


# -- allow_in_graph handed an object an FX node cannot take -------------------------------------------
import dataclasses  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Pair:
    x: torch.Tensor
    y: torch.Tensor
    z: int = 5


@torch.compiler.allow_in_graph
def combine(pair):
    return pair.x + pair.y * pair.z


def calls_allowed_fn_on_a_dataclass(x, y):
    return combine(Pair(x, y)).sin()


def test_allow_in_graph_on_a_frozen_dataclass():
    same_as_torch(calls_allowed_fn_on_a_dataclass, torch.randn(3), torch.randn(3), fullgraph=True)


# -- a dict argument keyed by enum members --------------------------------------------------------------
import enum  # noqa: E402


class Part(enum.Enum):
    HEAD = "head"
    TAIL = 2


def reads_enum_keyed_dict(inputs):
    return inputs[Part.HEAD] * 2 + inputs[Part.TAIL]


def test_dict_argument_keyed_by_enum_members():
    inputs = {Part.HEAD: torch.randn(3), Part.TAIL: torch.randn(3)}
    same_as_torch(reads_enum_keyed_dict, inputs, fullgraph=True)
    compiled = kiln.compile(reads_enum_keyed_dict, backend="eager", fullgraph=True)
    for _ in range(2):   # the guards read the items by the same keys: a new dict is seen
        inputs = {Part.HEAD: torch.randn(3), Part.TAIL: torch.randn(3)}
        assert_same(compiled(inputs), reads_enum_keyed_dict(inputs))


# -- the __dict__ of the program's own dict-subclass instance ------------------------------------------
import collections  # noqa: E402


class TrackedDict(collections.OrderedDict):
    pass


def writes_through_dunder_dict(x, d):
    if "tracker" not in d.__dict__:
        d.__dict__["tracker"] = []
    d.__dict__["tracker"].append(1)
    d.__dict__["scale"] = 3
    return x * d.scale * len(d.tracker)


def test_writes_through_a_dict_subclass_dunder_dict_reach_the_object():
    expected_d, got_d = TrackedDict(a=1), TrackedDict(a=1)
    x = torch.randn(3)
    expected = writes_through_dunder_dict(x, expected_d)
    kiln.reset()
    got = kiln.capture.capture(writes_through_dunder_dict, Recorder(), CaptureConfig(fullgraph=True))(x, got_d)
    assert_same(got, expected)
    assert got_d.__dict__ == expected_d.__dict__ == {"tracker": [1], "scale": 3}
    assert dict(got_d) == {"a": 1}


# -- C attribute descriptors: __class__, __weakref__, descriptor.__get__(obj) ----------------------------
import collections as _collections  # noqa: E402

Point = _collections.namedtuple("Point", ["x", "y"])
_shape_of = torch.Tensor.shape.__get__
_dict_of_class = type.__dict__["__dict__"].__get__


class Plain:
    a = 1


def reads_c_descriptors(p):
    q = p.__class__(*[v + 1 for v in p])
    made = Plain()
    weak = made.__weakref__
    return q, weak, _shape_of(p.x), len(_dict_of_class(Plain)) > 0, torch.Tensor.shape.__get__(p.y)


def test_c_attribute_descriptors():
    got = same_as_torch(reads_c_descriptors, Point(torch.zeros(2, 2), torch.ones(3)), fullgraph=True)
    assert type(got[0]) is Point


# -- a builtin value's slot called as a bound method ----------------------------------------------------
def calls_slots_directly(x):
    it = range(3).__iter__()
    first = next(it)
    s = "ab"
    rows = x.__iter__()
    return x + first + len(s) + s.__len__() + (next(s.__iter__()) == "a"), [r * 2 for r in rows]


def test_slots_called_as_bound_methods():
    same_as_torch(calls_slots_directly, torch.randn(2, 3), fullgraph=True)


# -- attributes the program sets on tensors -----------------------------------------------------------
def sets_tensor_attributes(x, flag):
    x.offloading = flag
    y = x + 10
    y.grad = x
    y.tag = "made"
    return y, y.tag, x.offloading


def reads_own_attribute(x):
    return x + (2 if hasattr(x, "test") else 1)


def test_attributes_set_on_tensors_reach_them():
    x = torch.ones(3)
    y, tag, flag = same_as_torch(sets_tensor_attributes, x, True, fullgraph=True)
    assert x.offloading is True and (tag, flag) == ("made", True)
    assert y.tag == "made" and y.grad is x


def test_an_input_tensor_s_own_attribute_is_guarded():
    kiln.reset()
    compiled = kiln.compile(reads_own_attribute, backend="eager", fullgraph=True)
    plain, marked = torch.ones(2), torch.ones(2)
    marked.test = None
    assert_same(compiled(plain), plain + 1)
    assert_same(compiled(marked), marked + 2)
    assert_same(compiled(plain), plain + 1)


# -- weak references ------------------------------------------------------------------------------------
import gc  # noqa: E402
import weakref  # noqa: E402


def made_weakref(x, y):
    ref = weakref.ref(x)
    return ref() * y, ref() is x


def returns_weakref(x):
    return weakref.ref(x), x + 1


def dereferences(ref, y):
    target = ref()
    if target is not None:
        return torch.sin(y) + target
    return torch.cos(y)


def test_weakref_made_in_captured_code():
    x, y = torch.randn(4), torch.randn(4)
    same_as_torch(made_weakref, x, y, fullgraph=True)
    ref, _ = kiln.compile(returns_weakref, backend="eager", fullgraph=True)(x)
    assert type(ref) is weakref.ReferenceType and ref() is x


def test_weakref_argument_read_again_on_every_call():
    kiln.reset()
    compiled = kiln.compile(dereferences, backend="eager", fullgraph=True)
    weight, y = torch.randn(4), torch.randn(4)
    ref = weakref.ref(weight)
    same_as_torch(dereferences, ref, y, fullgraph=True)
    assert_same(compiled(ref, y), torch.sin(y) + weight)
    del weight
    gc.collect()
    assert_same(compiled(ref, y), torch.cos(y))


# -- del obj.attr of the program's own object -----------------------------------------------------------
class Holder:
    kind = "class"

    def __init__(self, a, b):
        self.a, self.b = a, b


def deletes_attributes(x, obj):
    del obj.a
    obj.c = x + 1
    del obj.c
    obj.kind = "instance"
    del obj.kind            # the class attribute shows through again
    made = Holder(x + 2, x + 3)
    del made.b
    return x * 2 if hasattr(obj, "a") else x + 1, obj.kind, hasattr(obj, "c"), made


def test_del_of_an_attribute_of_the_program_s_object():
    x = torch.zeros(2)
    expected_obj, got_obj = Holder(x, x), Holder(x, x)
    expected = deletes_attributes(x, expected_obj)
    kiln.reset()
    got = kiln.capture.capture(deletes_attributes, Recorder(), CaptureConfig(fullgraph=True))(x, got_obj)
    assert_same(got[:3], expected[:3])
    assert vars(got_obj).keys() == vars(expected_obj).keys() == {"b"}
    assert vars(got[3]).keys() == {"a"}


# -- TypedDict classes, os.fspath, a signature's parameters --------------------------------------------
import inspect  # noqa: E402
import os  # noqa: E402
from typing import TypedDict  # noqa: E402


class Inputs(TypedDict):
    kind: str
    data: torch.Tensor


def _target(a, b):
    return a


def builds_typed_dict_and_reads_signature(x, y):
    obj = Inputs(kind="pixels", data=y)
    out = x * obj["data"]
    obj["data"] = 3
    names = [n for n in inspect.signature(_target).parameters]
    return out * obj["data"], type(obj).__name__, names, os.fspath("."), len(set(inspect.signature(_target).parameters))


def test_typed_dict_fspath_and_signature_parameters():
    same_as_torch(builds_typed_dict_and_reads_signature, torch.randn(4), torch.randn(4), fullgraph=True)


# -- a class's hierarchy; a partial's attributes ---------------------------------------------------------
import functools  # noqa: E402


class Base:
    pass


class Derived(Base):
    pass


def _add(x, y):
    return x + y


_add_four = functools.partial(_add, y=4)


def reads_hierarchy_and_partial(x):
    subs = Base.__subclasses__()
    return (x + len(subs), subs[0] is Derived, hasattr(_add_four, "__name__"),
            _add_four.func is _add, _add_four.keywords["y"], functools.partial(_add, x).args[0] + 1)


def test_class_hierarchy_and_partial_attributes():
    same_as_torch(reads_hierarchy_and_partial, torch.randn(2), fullgraph=True)


def test_mro_read_at_trace_time():   # torch's compiler refuses type.mro(); kiln reads it
    def reads_mro(x):
        return x + (Derived.mro()[1] is Base)
    x = torch.randn(2)
    assert_same(kiln.compile(reads_mro, backend="eager", fullgraph=True)(x), reads_mro(x))


# -- warnings.catch_warnings inside captured code (module attribute writes) --------------------------
def catches_warnings(x):
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        warnings.warn("inside")
        y = x.sin()
    return y, log


def test_catch_warnings_in_captured_code():
    x = torch.randn(3)
    filters_before = list(warnings.filters)
    expected, expected_log = catches_warnings(x)
    kiln.reset()
    got, log = kiln.compile(catches_warnings, backend="eager", fullgraph=True)(x)
    assert_same(got, expected)
    assert [str(w.message) for w in log] == [str(w.message) for w in expected_log] == ["inside"]
    assert warnings.filters == filters_before   # restored (a list equal to it: module reads are copies)


# -- torch.compiler.config.dynamic_sources ---------------------------------------------------------------
def scales(n, y):
    return y * n


def test_dynamic_sources_make_arguments_symbolic_from_the_first_compile():
    with torch.compiler.config.patch(dynamic_sources="L\\['n.*'\\], L['y']"):
        for dynamic in (None, False):   # the config wins over dynamic=False, as under torch.compile
            theirs, ours = Recorder(), Recorder()
            torch._dynamo.reset()
            kiln.reset()
            compiled_t = torch.compile(scales, backend=theirs, dynamic=dynamic)
            compiled_k = kiln.capture.capture(scales, ours, CaptureConfig(dynamic=dynamic))
            for n in (2, 3, 4):
                y = torch.randn(n)
                assert_same(compiled_k(n, y), compiled_t(n, y))
            assert len(ours.graphs) == len(theirs.graphs) == 1


# -- NumPy array arguments are graph inputs ------------------------------------------------------------------
import numpy as np  # noqa: E402


def numpy_on_an_argument(a, x):
    rows = [r * 2 for r in a]
    return a.size + a, (a * 5).astype(bool).astype(float).astype(int) + 8, rows, x + torch.from_numpy(a)


def returns_its_array(a):
    return a


def test_numpy_array_arguments_are_graph_inputs():
    a = np.arange(6.0).reshape(3, 2)
    got = same_as_torch(numpy_on_an_argument, a, torch.ones(3, 2), fullgraph=True)
    assert type(got[0]) is np.ndarray and [type(r) for r in got[2]] == [np.ndarray] * 3
    kiln.reset()
    assert kiln.compile(returns_its_array, backend="eager", fullgraph=True)(a) is a


# -- torch.tensor of 0-d tensors ---------------------------------------------------------------------------
def tensor_of_tensors(x, y):
    return torch.tensor([x], dtype=torch.int64), torch.tensor((x * 2, y)) + 1


def test_torch_tensor_of_zero_dim_tensors():
    same_as_torch(tensor_of_tensors, torch.tensor(20), torch.tensor(3), fullgraph=True)
    got = kiln.compile(lambda x, y: torch.tensor([[x, y], [y, x]]), backend="eager", fullgraph=True)(
        torch.tensor(2.5, requires_grad=True), torch.tensor(1.0))
    assert_same(got, torch.tensor([[2.5, 1.0], [1.0, 2.5]]))
    assert not got.requires_grad


# -- id() of an object the frame reads is guarded --------------------------------------------------------
class Owner:
    def call(self, x, ref_id):
        return torch.mul(x, 1.0) if id(self) == ref_id else torch.mul(x, 0)


def test_id_of_an_argument_is_guarded():
    kiln.reset()
    compiled = kiln.compile(Owner.call, backend="eager", fullgraph=True)
    x, first, second = torch.ones(2), Owner(), Owner()
    assert_same(compiled(first, x, id(first)), torch.ones(2))
    assert_same(compiled(second, x, id(first)), torch.zeros(2))   # another object: compiled again
    y = torch.ones(2)
    ids = kiln.compile(lambda t, ref: t + 1 if id(t) == ref else t - 1, backend="eager", fullgraph=True)
    assert_same(ids(y, id(y)), y + 1)
    assert_same(ids(x, id(y)), x - 1)


# -- every is_compiling() query of torch's answers True inside captured code ------------------------------
def test_every_is_compiling_query_is_true_in_captured_code():
    queries = [torch._dynamo.is_compiling, torch._utils.is_compiling, torch.compiler.is_compiling,
               torch.compiler.is_dynamo_compiling]
    for query in queries:
        def fn(x, query=query):
            return x + 1 if query() else x - 1
        x = torch.zeros(2)
        torch._dynamo.reset()
        kiln.reset()
        assert_same(fn(x), x - 1)
        assert_same(torch.compile(fn, backend="eager", fullgraph=True)(x), x + 1)
        assert_same(kiln.compile(fn, backend="eager", fullgraph=True)(x), x + 1)


# -- a metaclass's own __instancecheck__; __bool__ must return a bool ------------------------------------
class AcceptsAll(type):
    def __instancecheck__(cls, instance):
        return True


class Anything(metaclass=AcceptsAll):
    pass


class Unrelated:
    pass


def checks_instances(x, obj):
    return x + 1 if isinstance(obj, Anything) else x - 1, isinstance(3, Unrelated)


def checks_instances_of_a_tuple(x, obj):
    return isinstance(obj, (int, Anything)), isinstance(obj, (int, Unrelated)), isinstance(obj, (int, str))


def test_metaclass_instancecheck_decides():
    same_as_torch(checks_instances, torch.zeros(2), Unrelated(), fullgraph=True)
    # (torch.compile answers False for the tuple holding the metaclass's class, eager True)
    args = (torch.zeros(2), Unrelated())
    kiln.reset()
    got = kiln.compile(checks_instances_of_a_tuple, backend="eager", fullgraph=True)(*args)
    assert got == checks_instances_of_a_tuple(*args) == (True, True, False)


class FloatBool:
    def __bool__(self):
        return 1.2


def branches_on(x, obj):
    return x + 1 if obj else x - 1


def test_bool_returning_a_float_raises_type_error():
    kiln.reset()
    compiled = kiln.compile(branches_on)
    for call in (lambda: branches_on(torch.zeros(2), FloatBool()), lambda: compiled(torch.zeros(2), FloatBool())):
        try:
            call()
        except TypeError as e:
            assert "__bool__ should return bool, returned float" in str(e)
        else:
            raise AssertionError("TypeError not raised")


# -- a tuple subclass's own __getitem__ is not how its items are read as inputs ---------------------------
import typing  # noqa: E402


class Sliced(typing.NamedTuple):
    a: torch.Tensor
    b: torch.Tensor

    def __getitem__(self, index):
        return Sliced(self.a[index], self.b[index])


def reads_fields(pair):
    return pair.a + 1, pair.b * 2


def test_namedtuple_with_its_own_getitem_as_an_argument():
    kiln.reset()
    compiled = kiln.compile(reads_fields, backend="eager", fullgraph=True)
    for _ in range(2):   # the second call runs the guards, which read the items too
        pair = Sliced(torch.randn(2), torch.randn(2))
        assert_same(compiled(pair), reads_fields(pair))


# -- len() of a builtin container held whole --------------------------------------------------------------
TABLE_BY_FUNCTION = {torch.sin: 1, torch.cos: 2, _add: 3}


def scales_by_table_size(x, table):
    return x * len(TABLE_BY_FUNCTION) + len(table)


def test_len_of_a_container_held_whole():
    kiln.reset()
    compiled = kiln.compile(scales_by_table_size, backend="eager", fullgraph=True)
    x = torch.randn(2)
    for table in ({torch.sin: 1}, {torch.sin: 1, torch.cos: 2}):   # the argument's length is guarded
        assert_same(compiled(x, table), scales_by_table_size(x, table))


# -- Size + Size is a Size; a builtin given keywords it does not take raises TypeError ---------------
def adds_sizes(x):
    y = x.size()
    return y + y, y + (1,)


def test_size_plus_size_is_a_size():
    got = same_as_torch(adds_sizes, torch.ones(2, 3))
    assert type(got[0]) is torch.Size and type(got[1]) is torch.Size


def test_builtin_called_with_keywords_it_does_not_take():
    def fn(x):
        return x.sin() if isinstance(x, torch.Tensor, invalid=True) else x
    kiln.reset()
    for call in (fn, kiln.compile(fn, backend="eager")):
        try:
            call(torch.randn(3))
        except TypeError as e:
            assert "isinstance() takes no keyword arguments" in str(e)
        else:
            raise AssertionError("TypeError not raised")


# -- a class attribute read through an instance is guarded ----------------------------------------------
class Scale:
    factor = 4

    def apply(self, x):
        return x * self.factor


class SubScale(Scale):
    def apply(self, x):
        return super().apply(x) + super().factor


def test_class_attribute_change_is_seen():
    kiln.reset()
    obj, x = SubScale(), torch.ones(2)
    compiled = kiln.compile(obj.apply, backend="eager", fullgraph=True)
    assert_same(compiled(x), obj.apply(x))
    try:
        Scale.factor = 5
        assert_same(compiled(x), obj.apply(x))
    finally:
        Scale.factor = 4
    assert_same(compiled(x), obj.apply(x))
