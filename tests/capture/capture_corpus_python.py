"""Corpus programs for the Python data model: containers, functions, closures, classes, modules,
control flow, exceptions, context managers, builtins, math/operator/functools/itertools."""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import itertools
import math
import operator
import typing

import torch
import torch.nn.functional as F
from torch import nn

from capture_corpus import PROGRAMS, TT, T, Program, program, t, with_args  # noqa: F401


# -- containers ---------------------------------------------------------------------------------------
@program()
def list_build_index(x):
    a = [x, x * 2, x * 3]
    return a[0] + a[-1] + a[1:][0]


@program()
def list_append_loop(x):
    out = []
    for i in range(4):
        out.append(x * i)
    return torch.stack(out)


@program()
def list_comprehension(x):
    return sum([x * i for i in range(3)])


@program()
def list_comprehension_if(x):
    return torch.cat([x + i for i in range(6) if i % 2 == 0])


@program()
def nested_comprehension(x):
    return torch.stack([x[i] * j for i in range(2) for j in range(2)])


@program()
def list_extend_insert_pop(x):
    a = [x]
    a.extend([x + 1, x + 2])
    a.insert(0, x - 1)
    b = a.pop()
    a.pop(0)
    return b + a[0] + len(a)


@program()
def list_reverse_copy(x):
    a = [x, x * 2, x * 3]
    b = a.copy()
    a.reverse()
    return a[0] - b[0]


@program()
def list_mul_concat(x):
    a = [x] * 2 + [x * 3]
    return sum(a)


@program()
def list_setitem(x):
    a = [x, x, x]
    a[1] = x * 5
    a[0:1] = [x - 1]
    return a[0] + a[1] + a[2]


@program()
def list_del(x):
    a = [x, x * 2, x * 3]
    del a[1]
    return a[1]


@program()
def list_index_count(x):
    a = [1, 2, 3, 2]
    return x * a.index(3) + a.count(2)


@program()
def list_sort_constants(x):
    a = [3, 1, 2]
    a.sort()
    return x * a[0] + a[-1]


@program()
def list_unpack_star(x):
    a, *b, c = [x, x + 1, x + 2, x + 3]
    return a + c + len(b)


@program()
def list_in_check(x):
    return x * 2 if 3 in [1, 2, 3] else x


@program()
def list_equality(x):
    return x + 1 if [1, 2] == [1, 2] else x


@program()
def tuple_ops(x):
    a = (x, x * 2)
    b = a + (x * 3,)
    return b[2] - b[0] + len(b)


@program()
def tuple_unpack_swap(x):
    a, b = x, x * 2
    a, b = b, a
    return a - b


@program()
def tuple_nested_unpack(x):
    (a, b), c = (x, x + 1), x + 2
    return a * b * c


@program()
def tuple_count_index(x):
    a = (1, 2, 2, 3)
    return x * a.count(2) + a.index(3)


@program()
def dict_build_get(x):
    d = {"a": x, "b": x * 2}
    return d["a"] + d.get("b") + d.get("c", x)


@program()
def dict_iteration(x):
    d = {"a": 1, "b": 2, "c": 3}
    total = x
    for k, v in d.items():
        total = total + v
    return total, list(d.keys())


@program()
def dict_comprehension(x):
    d = {i: x * i for i in range(3)}
    return d[2] - d[1]


@program()
def dict_update_pop(x):
    d = {"a": x}
    d.update({"b": x + 1}, c=x + 2)
    b = d.pop("b")
    return b + d["c"], sorted(d)


@program()
def dict_setdefault(x):
    d = {}
    d.setdefault("k", x)
    d.setdefault("k", x * 100)
    return d["k"]


@program()
def dict_in(x):
    d = {"a": 1}
    return x * 2 if "a" in d and "b" not in d else x


@program()
def dict_kwargs_splat(x):
    def f(a, b, c=1):
        return a * b + c
    kw = {"b": x, "c": 3}
    return f(x, **kw)


@program()
def dict_values_sum(x):
    d = {"a": x, "b": x * 2}
    return sum(d.values())


@program()
def dict_merge_operator(x):
    d = {"a": x} | {"b": x * 2}
    return d["a"] + d["b"]


@program()
def ordered_dict(x):
    d = collections.OrderedDict()
    d["z"] = x
    d["a"] = x * 2
    return list(d)[0], d["a"]


@program()
def set_ops(x):
    s = {1, 2}
    s.add(3)
    s.update([4, 5])
    return x * len(s) if 3 in s else x


@program()
def set_comprehension(x):
    s = {i % 3 for i in range(10)}
    return x * len(s)


@program()
def container_return(x):
    return {"out": [x, (x * 2, {"deep": x + 1})], "n": 3}


@program()
def empty_containers(x):
    return x + 1, [], (), {}


# -- functions and closures -----------------------------------------------------------------------------
def _helper_add(a, b=2):
    return a + b


def _helper_kwonly(a, *, scale=3):
    return a * scale


def _helper_varargs(*args, **kwargs):
    return sum(args) + sum(kwargs.values())


@program()
def call_helper_defaults(x):
    return _helper_add(x) + _helper_add(x, b=5)


@program()
def call_kwonly(x):
    return _helper_kwonly(x) + _helper_kwonly(x, scale=0.5)


@program()
def call_varargs(x):
    return _helper_varargs(x, x * 2, k=x * 3)


@program()
def call_star_args(x):
    args = (x, 4)
    return _helper_add(*args)


@program()
def closure_read(x):
    k = 3

    def inner(y):
        return y * k
    return inner(x)


@program()
def closure_write(x):
    total = x

    def add(v):
        nonlocal total
        total = total + v
    add(1)
    add(x)
    return total


@program()
def closure_factory(x):
    def make(scale):
        return lambda y: y * scale
    double, triple = make(2), make(3)
    return double(x) + triple(x)


def _make_scaler(s):
    def scale(y):
        return y * s
    return scale


_scaler = _make_scaler(7)


@program()
def global_closure_fn(x):
    return _scaler(x)


@program()
def lambda_inline(x):
    f = lambda a, b=1: a - b  # noqa: E731
    return f(x) + f(x, 3)


@program()
def recursion_bounded(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(4)


@program()
def default_mutable_tuple(x, scales=(1, 2, 3)):
    return sum(x * s for s in scales)


@program()
def generator_function(x):
    def gen(n):
        for i in range(n):
            yield x * i
    return sum(gen(4))


@program()
def generator_expression(x):
    return torch.stack(tuple(x + i for i in range(3)))


@program()
def generator_next(x):
    it = iter([x, x * 2])
    a = next(it)
    b = next(it)
    c = next(it, x * 10)
    return a + b + c


@program()
def yield_from_list(x):
    def gen():
        yield x
        yield x + 1
    return list(gen())[1]


@program()
def partial_call(x):
    f = functools.partial(_helper_add, b=10)
    return f(x)


@program()
def partial_positional(x):
    f = functools.partial(torch.add, x)
    return f(1)


@program()
def reduce_call(x):
    return functools.reduce(operator.add, [x, x, x])


@program()
def map_filter(x):
    vals = list(map(lambda i: x * i, filter(lambda i: i > 1, range(4))))
    return sum(vals)


@program()
def zip_enumerate(x):
    out = x
    for i, (a, b) in enumerate(zip([1, 2, 3], [4, 5, 6])):
        out = out + i * a - b
    return out


@program()
def enumerate_start(x):
    return sum(x * i for i, _ in enumerate(range(3), start=1))


@program()
def reversed_sorted(x):
    a = sorted([3, 1, 2], reverse=True)
    return x * a[0] + list(reversed(a))[0]


@program()
def sorted_key(x):
    a = sorted(["bbb", "a", "cc"], key=len)
    return x * len(a[-1])


@program()
def range_features(x):
    r = range(2, 10, 3)
    return x * len(r) + r[1] + (5 in r)


@program()
def any_all(x):
    return x * 2 if any([False, True]) and all([1, 2]) else x


@program()
def min_max_constants(x):
    return x * max(1, 5, 3) - min([4, 2])


@program()
def abs_round_divmod(x):
    q, r = divmod(17, 5)
    return x * abs(-3) + round(2.6) + q * r


@program()
def builtin_conversions(x):
    return x * int("3") + float(2) + bool(1) + int(3.7)


@program()
def str_ops(x):
    s = "a,b,c".split(",")
    return x * len(s) if "-".join(s).upper() == "A-B-C" else x


@program()
def fstring_constants(x):
    name = f"layer_{3}_{'x'!r}_{2.5:.1f}"
    return x * len(name), name


@program()
def isinstance_checks(x):
    a = 1 if isinstance(x, torch.Tensor) else 0
    b = 1 if isinstance([1], (list, tuple)) else 0
    c = 1 if isinstance(3, float) else 0
    return x * (a + b + c)


@program()
def type_checks(x):
    return x * 2 if type(3) is int and type(x) is torch.Tensor else x


@program()
def getattr_hasattr(x):
    a = getattr(x, "shape")[0]
    b = getattr(x, "missing_attr", 5)
    c = hasattr(x, "sum")
    d = hasattr(x, "nope")
    return x * (a + b + c + d)


@program()
def callable_check(x):
    return x * 2 if callable(_helper_add) and not callable(3) else x


# -- math, operator, itertools ---------------------------------------------------------------------------
@program()
def math_functions(x):
    return x * math.sqrt(16) + math.pi + math.log(math.e) + math.floor(2.7) + math.ceil(1.2)


@program()
def math_on_shape(x):
    return x / math.sqrt(x.shape[-1])


@program()
def operator_functions(x):
    return operator.mul(operator.add(x, 1), 2) - operator.neg(x)


@program()
def operator_getitem(x):
    return operator.getitem([x, x * 2], 1)


@program()
def itertools_chain_product(x):
    out = x
    for a, b in itertools.product([1, 2], [3]):
        out = out + a * b
    return out + sum(itertools.chain([1], [2, 3]))


@program()
def itertools_islice_accumulate(x):
    return x * sum(itertools.islice(range(10), 2, 5)) + list(itertools.accumulate([1, 2, 3]))[-1]


@program()
def itertools_repeat_pairwise(x):
    return x * len(list(itertools.repeat(0, 3))) + sum(a * b for a, b in itertools.pairwise([1, 2, 3]))


# -- control flow ------------------------------------------------------------------------------------------
@program(inputs=with_args(T, 3))
def branch_on_int_arg(x, n):
    if n > 2:
        return x * n
    return x


@program(inputs=with_args(T, True))
def branch_on_bool_arg(x, flag):
    return x + 1 if flag else x - 1


@program(inputs=with_args(T, None))
def branch_on_none(x, mask):
    if mask is not None:
        x = x * mask
    return x + 1


@program()
def while_loop_constant(x):
    i = 0
    while i < 3:
        x = x * 2
        i += 1
    return x


@program()
def for_break_continue(x):
    for i in range(10):
        if i == 1:
            continue
        if i == 4:
            break
        x = x + i
    return x


@program()
def for_else(x):
    for i in range(3):
        x = x + i
    else:
        x = x * 2
    return x


@program()
def nested_loops(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j
    return x


@program()
def ternary_chain(x):
    n = 5
    k = 1 if n < 3 else 2 if n < 6 else 3
    return x * k


@program()
def boolean_ops_constants(x):
    a = 3
    b = a > 2 and a < 5 or a == 10
    c = not (a == 3)
    return x * b + c


@program()
def loop_over_tensor(x):
    return sum(row * 2 for row in x)


@program()
def loop_over_shape(x):
    total = 0
    for s in x.shape:
        total += s
    return x * total


@program()
def walrus(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


@program()
def match_statement(x):
    match x.dim():
        case 1:
            return x
        case 2:
            return x * 2
        case _:
            return x * 3


# -- exceptions ----------------------------------------------------------------------------------------------
@program()
def try_except_caught(x):
    try:
        raise ValueError("bad")
    except ValueError:
        x = x + 1
    return x


@program()
def try_except_as(x):
    try:
        raise KeyError("k")
    except (KeyError, IndexError) as e:
        x = x * len(e.args)
    return x


@program()
def try_finally(x):
    try:
        x = x + 1
    finally:
        x = x * 2
    return x


@program()
def try_else(x):
    try:
        y = x + 1
    except ValueError:
        y = x
    else:
        y = y * 3
    return y


@program()
def exception_from_dict(x):
    d = {"a": x}
    try:
        return d["missing"]
    except KeyError:
        return d["a"] * 2


@program()
def exception_from_call(x):
    def check(v):
        if v < 0:
            raise ValueError("negative")
        return v
    try:
        check(-1)
    except ValueError:
        x = x - 1
    return x + check(2)


@program()
def exception_index_error(x):
    a = [1]
    try:
        a[5]
    except IndexError:
        return x * 3
    return x


@program()
def assert_true(x):
    assert x.dim() == 2, "needs 2-D"
    return x + 1


@program()
def nested_try(x):
    try:
        try:
            raise TypeError
        except ValueError:
            x = x * 100
    except TypeError:
        x = x + 5
    return x


# -- context managers --------------------------------------------------------------------------------------
@program()
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + 1, y.requires_grad


@program(inputs=lambda s: (torch.randn(3, 4, requires_grad=True),))
def no_grad_with_requires_grad(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y.requires_grad, z.requires_grad


@program(inputs=lambda s: (torch.randn(3, 4, requires_grad=True),))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 2
    return y.requires_grad, z.requires_grad


@program()
def set_grad_enabled_ctx(x):
    with torch.set_grad_enabled(False):
        y = x + 1
    return y, torch.is_grad_enabled()


@program()
def is_grad_enabled_branch(x):
    return x * 2 if torch.is_grad_enabled() else x


class _Tracker:
    def __init__(self):
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        return False


@program()
def user_context_manager(x):
    with _Tracker() as tr:
        y = x * tr.entered
    return y


# -- classes ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Pair:
    a: torch.Tensor
    b: int = 2

    def total(self):
        return self.a * self.b


@dataclasses.dataclass(frozen=True)
class _Frozen:
    scale: float


_Point = collections.namedtuple("_Point", ["x", "y"])


class _TypedPoint(typing.NamedTuple):
    x: torch.Tensor
    y: int = 3


class _Color(enum.Enum):
    RED = 1
    BLUE = 2


class _Base:
    factor = 2

    def __init__(self, v):
        self.v = v

    def apply(self, x):
        return x * self.factor + self.v

    @property
    def doubled(self):
        return self.v * 2

    @staticmethod
    def static(x):
        return x + 100

    @classmethod
    def make(cls, v):
        return cls(v)


class _Child(_Base):
    factor = 3

    def apply(self, x):
        return super().apply(x) - 1


@program()
def dataclass_create(x):
    p = _Pair(x)
    return p.total() + p.b


@program()
def dataclass_return(x):
    return _Pair(x * 2, 5)


@program()
def frozen_dataclass(x):
    return x * _Frozen(1.5).scale


@program()
def namedtuple_create_access(x):
    p = _Point(x, x * 2)
    return p.x + p.y + p[0], p


@program()
def typed_namedtuple(x):
    p = _TypedPoint(x)
    return p.x * p.y


@program()
def namedtuple_unpack(x):
    a, b = _Point(x, 3)
    return a * b


@program()
def enum_use(x):
    c = _Color.BLUE
    return x * c.value if c is _Color.BLUE else x


@program()
def class_methods(x):
    b = _Base(3)
    return b.apply(x) + b.doubled + _Base.static(x) + _Base.make(1).v


@program()
def super_call(x):
    return _Child(1).apply(x)


@program()
def class_attribute(x):
    return x * _Child.factor + _Base.factor


_GLOBAL_OBJ = _Base(5)


@program()
def global_object_attr(x):
    return x * _GLOBAL_OBJ.v + _GLOBAL_OBJ.doubled


class _WithCall:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


@program()
def callable_object(x):
    return _WithCall(4)(x)


class _Container:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        return iter(self.items)


@program()
def user_container(x):
    c = _Container([x, x * 2])
    return c[1] + len(c) + sum(c)


# -- nn.Module ------------------------------------------------------------------------------------------------
def _module_program(name, make_module, inputs=T, call=None):
    torch.manual_seed(0)
    module = make_module()
    module.eval()
    fn = call(module) if call else (lambda x: module(x))
    fn.__name__ = name
    PROGRAMS.append(Program(name, fn, inputs))


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)
        self.norm = nn.LayerNorm(5)
        self.scale = 0.5

    def forward(self, x):
        return self.norm(x + self.fc(x) * self.scale)


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(5, 2), "b": nn.Linear(5, 3)})
        self.register_buffer("offset", torch.ones(5))
        self.weight = nn.Parameter(torch.randn(5))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        x = x * self.weight + self.offset
        return {k: head(x) for k, head in self.heads.items()}


class _Sub(_Block):
    def forward(self, x):
        return super().forward(x) * 2


class _Kwargs(nn.Module):
    def forward(self, x, *, scale=2.0, bias=None):
        y = x * scale
        if bias is not None:
            y = y + bias
        return y


_module_program("module_linear", lambda: nn.Linear(5, 3))
_module_program("module_sequential", lambda: nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)))
_module_program("module_block", _Block)
_module_program("module_stack", _Stack)
_module_program("module_super_forward", _Sub)
_module_program("module_kwargs", _Kwargs, call=lambda m: lambda x: m(x, scale=3.0, bias=x))
_module_program("module_seq_index", lambda: nn.Sequential(nn.Linear(5, 5), nn.Tanh()),
                call=lambda m: lambda x: m[0](x) + m[-1](x))
_module_program("module_seq_len", lambda: nn.Sequential(nn.Linear(5, 5), nn.Tanh()),
                call=lambda m: lambda x: x * len(m))
_module_program("module_conv_bn", lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
                inputs=t(2, 3, 8, 8))
_module_program("module_embedding", lambda: nn.Embedding(10, 4),
                inputs=lambda s: (torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(s)),))
_module_program("module_mha", lambda: nn.MultiheadAttention(5, 1, batch_first=True),
                inputs=t(2, 3, 5), call=lambda m: lambda x: m(x, x, x)[0])
_module_program("module_transformer_layer",
                lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), inputs=t(2, 3, 8))
_module_program("module_gru_free_dropout_eval", lambda: nn.Sequential(nn.Linear(5, 5), nn.Dropout(0.5)))
_module_program("module_parameters_iter", lambda: nn.Linear(5, 5),
                call=lambda m: lambda x: x * sum(p.sum() for p in m.parameters()))
_module_program("module_named_children", _Block,
                call=lambda m: lambda x: x * len([n for n, _ in m.named_children()]))


def _hooked():
    m = nn.Linear(5, 5)
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out + 1)
    return m


_module_program("module_hooks", _hooked)


class _Training(nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x * 3


_module_program("module_training_flag", _Training)


# -- more constructs ------------------------------------------------------------------------------------------
@program()
def autocast_cpu_bf16(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x.T
    return y.float() + 1, y.dtype


@program()
def autocast_disabled(x):
    with torch.autocast("cpu", enabled=False):
        y = x @ x.T
    return y


@program()
def comprehension_shadowing(x):
    i = 10
    vals = [x * i for i in range(2)]
    return vals[1] + i


@program()
def comprehension_closure(x):
    k = 2
    return [(lambda v: v * k)(x) for _ in range(2)][0]


@program()
def nested_function_default(x):
    def f(a, scale=x.shape[0]):
        return a * scale
    return f(x)


@program()
def star_kwargs_forwarding(x):
    def inner(a, b=1, **rest):
        return a * b + len(rest)

    def outer(*args, **kwargs):
        return inner(*args, **kwargs)
    return outer(x, b=2, extra=1)


@program()
def keyword_only_forwarding(x):
    def f(a, *, b, c=3):
        return a * b + c
    return f(x, b=2) + f(x, c=1, b=1)


@program()
def positional_only(x):
    def f(a, b, /, c=1):
        return a + b * c
    return f(x, 2, c=3)


@program()
def method_on_list_of_tensors(x):
    parts = list(x.split(2, dim=1))
    parts.reverse()
    return torch.cat(parts, dim=1)


@program()
def tensor_in_dict_iteration(x):
    d = {"a": x, "b": x * 2}
    return {k: v.sum() for k, v in d.items()}


@program()
def tensor_list_unpack(x):
    a, b, c, d = x.unbind(0)
    return a * b + c - d


@program()
def chunk_loop(x):
    return sum(c.mean() for c in x.chunk(2, dim=0))


@program()
def getattr_dynamic_name(x):
    name = "sig" + "moid"
    return getattr(torch, name)(x)


@program()
def torch_functional_via_module_attr(x):
    return torch.nn.functional.relu(x) + torch.special.expit(x)


@program()
def tensor_constructor_from_list(x):
    return x * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])


@program()
def tensor_new_tensor(x):
    return x + x.new_tensor([1.0, 2.0, 3.0, 4.0, 5.0])


@program()
def dtype_promotion(x):
    return (x.to(torch.float16) + 1).dtype, x.to(torch.int32) + 1.5


@program()
def inplace_chain(x):
    y = x.clone()
    y.mul_(2).add_(1).clamp_(-1, 1)
    return y


@program()
def inplace_identity(x):
    y = x.clone()
    z = y.add_(1)
    return z is y, z


@program()
def setitem_with_tensor_index(x):
    y = x.clone()
    y[y > 0] = 0.0
    return y


@program()
def empty_like_fill(x):
    y = torch.empty_like(x).fill_(3.0)
    return y * x


@program()
def random_with_seed(x):
    torch.manual_seed(0)
    return x + torch.rand(4, 5)


@program()
def math_inf_nan(x):
    return x.clamp(-math.inf, 1.0) + (0.0 if math.isnan(1.0) else 1.0)


@program()
def string_format_methods(x):
    name = "{}-{}".format("a", 3)
    return x * len(name.replace("-", "").strip())


@program()
def bytes_and_tuples(x):
    key = (1, "a", None)
    d = {key: 2}
    return x * d[(1, "a", None)]


_LAYERS = [torch.nn.Identity(), torch.nn.ReLU()]


@program()
def enumerate_modules_list(x):
    for i, layer in enumerate(_LAYERS):
        x = layer(x) + i
    return x


@program()
def early_return_in_loop(x):
    for i in range(5):
        if i == 2:
            return x * i
    return x


@program()
def while_with_break(x):
    i = 0
    while True:
        x = x + 1
        i += 1
        if i >= 3:
            break
    return x


@program()
def chained_comparison(x):
    n = 5
    return x * 2 if 1 < n < 10 else x


@program()
def is_none_default(x, bias=None):
    return x + (0 if bias is None else bias)


@program()
def conditional_import(x):
    import math as m
    from operator import mul
    return mul(x, m.tau)


@program()
def sum_with_start(x):
    return sum([x, x], x * 0 + 1)


@program()
def zip_strict_lengths(x):
    return sum(a * b for a, b in zip([x, x], [1, 2], strict=True))


@program()
def set_membership_of_strings(x):
    allowed = {"relu", "gelu"}
    return F.gelu(x) if "gelu" in allowed else x


@dataclasses.dataclass
class _Cfg:
    scale: float = 2.0
    layers: tuple = (1, 2)


@program()
def dataclass_field_defaults(x):
    c = _Cfg()
    return x * c.scale * len(c.layers)


class _Acc:
    def __init__(self):
        self.total = 0

    def add(self, v):
        self.total = self.total + v
        return self


@program()
def chained_methods_on_new_object(x):
    a = _Acc().add(x).add(x * 2)
    return a.total


class _P:
    def __init__(self, v):
        self._v = v

    @property
    def v(self):
        return self._v * 2


@program()
def property_chain(x):
    return _P(x).v + _P(3).v


@program()
def operator_itemgetter_like(x):
    pairs = [(2, x), (1, x * 3)]
    pairs = sorted(pairs, key=lambda p: p[0])
    return pairs[0][1]


@program()
def list_of_lists(x):
    grid = [[x * i * j for j in range(2)] for i in range(2)]
    return grid[1][1] + grid[0][1]


@program()
def isinstance_namedtuple(x):
    p = _Point(x, 1)
    return x * 2 if isinstance(p, tuple) and hasattr(p, "_fields") else x


class _A:
    def f(self, v):
        return v + 1


class _B(_A):
    def f(self, v):
        return super(_B, self).f(v) * 2


@program()
def super_two_arg(x):
    return _B().f(x)
