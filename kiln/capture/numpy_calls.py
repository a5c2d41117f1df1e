"""NumPy on tensors inside captured code: traced into the graph as torch ops.

[Note: NumPy as torch ops] `x.numpy()` inside captured code does not leave the graph: it gives an
`NdarrayVar`, a NumPy array that stands for the same graph value. NumPy functions (`np.sum`,
ufuncs, `np.where`, `np.linalg.norm`, ...), ndarray methods, attributes and operators on it become
graph nodes calling `numpy_call(name, *args)`, which runs `torch._numpy` (NumPy's API written over
torch tensors) on the example values while capturing and on fake tensors in `aot/`, so the graph
downstream holds ordinary ATen ops. NumPy's own rules hold: dtypes (`torch._numpy` is set to NumPy's
float64/int64 defaults below, never through torch's compiler config), type promotion (NEP 50:
NumPy scalars are strong, Python numbers weak), and 0-d results of reductions are NumPy scalars
(`NdarrayVar.scalar`). `torch.from_numpy(a)` gives a tensor view of the same value; an array that
leaves the graph is rebuilt as `tensor.numpy()` (sharing memory with the tensor, as in eager).

Operators mixing a tensor and an array follow eager: the tensor's operator runs (arrays defer to
`Tensor.__array_priority__`) on the array's tensor, and a NumPy scalar acts as a Python number does,
cast to the dtype torch would pick for one. What reads data back to Python (`a.item()`, `float(a)`,
`if a.any():`, `a.tolist()`) is refused, which breaks the graph (or, under fullgraph, names the line).
NumPy calls on constants alone run in NumPy itself (`np.finfo(np.float32).eps`, `np.float32(2)`).
"""
from __future__ import annotations

import dataclasses
import operator

import numpy as np
import torch
from torch.utils import _pytree as pytree

from kiln.capture import variables as V
from kiln.capture.callables import CALLABLE_TYPES, PACKAGES, handles
from kiln.capture.semantics import BINARY_OPS, VALUE_MODELS
from kiln.capture.constants import constant_of, is_python_constant, python_value
from kiln.capture.torch_calls import call_torch

_tnp = None


def _torch_numpy():
    """`torch._numpy`, with NumPy's default dtypes set here, so that it never reads them from
    torch's compiler configuration."""
    global _tnp
    if _tnp is None:
        import torch._numpy as tnp
        from torch._numpy import _dtypes_impl
        if _dtypes_impl._default_dtypes is None:
            _dtypes_impl._default_dtypes = _dtypes_impl.DefaultDTypes(
                float_dtype=torch.float64, complex_dtype=torch.complex128, int_dtype=torch.int64)
        _tnp = tnp
    return _tnp


def _resolve(tnp, name: str):
    kind, _, rest = name.partition(":")
    if kind == "method":
        return lambda self, *a, **k: getattr(self, rest)(*a, **k)
    if kind == "attr":
        return lambda self: getattr(self, rest)
    if kind == "operator":
        return getattr(operator, rest)
    fn = tnp
    for part in rest.split("."):
        fn = getattr(fn, part)
    return fn


def numpy_call(name: str, *args, **kwargs):
    """The graph's target for NumPy code: `name` is `function:sum`, `function:linalg.norm`,
    `method:reshape`, `attr:T` or `operator:add`; tensor arguments stand for arrays."""
    tnp = _torch_numpy()
    if name.partition(":")[2] in _FLOAT_OF_INTEGERS:
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if not any(t.is_floating_point() or t.is_complex() for t in tensors):
            args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to(torch.float64), (args, kwargs))
    args, kwargs = pytree.tree_map_only(torch.Tensor, tnp.ndarray, (args, kwargs))
    out = _resolve(tnp, name)(*args, **kwargs)
    return pytree.tree_map_only(tnp.ndarray, lambda a: a.tensor, out)


# torch._numpy leaves these to torch's default dtype when all inputs are integers or bools (torch's
# float32, where NumPy computes in float64). Casting the inputs first makes the graph say float64
# itself, so it does not depend on the default dtype when it runs.
_FLOAT_OF_INTEGERS = {"truediv", "true_divide", "divide", "angle", "arctan2", "copysign", "corrcoef", "cov", "i0",
                      "sinc"}


numpy_call.__module__ = __name__


def _np_dtype(torch_dtype) -> np.dtype:
    return np.dtype(str(torch_dtype).removeprefix("torch."))


# -- trackers in and out of NumPy calls -------------------------------------------------------------------
def _as_array_argument(tx, v: V.Variable) -> V.Variable:
    """What NumPy sees for a tracker: tensors convert as `Tensor.__array__` would, NumPy dtypes and
    scalar types become their names, NumPy scalars become 0-d arrays of their dtype (strong)."""
    if isinstance(v, V.TensorVar):
        _check_numpy_able(tx, v.example)
        return v
    if isinstance(v, (V.ListVar, V.TupleVar)):
        return type(v)([_as_array_argument(tx, i) for i in v.items])
    if isinstance(v, (V.Constant, V.ObjectVar)) and is_python_constant(v):
        value = python_value(v)
        if isinstance(value, np.dtype) or isinstance(value, type) and issubclass(value, np.generic):
            return V.Constant(np.dtype(value).name)
        if isinstance(value, np.generic):
            return _call(tx, f"function:{value.dtype.name}", [V.Constant(value.item())], {}, scalar=True)
        if isinstance(value, np.ndarray):
            raise tx.unsupported("a NumPy array made outside captured code, used inside it")
    return v


def _check_numpy_able(tx, example: torch.Tensor):
    if example.requires_grad:
        tx.raise_(RuntimeError, "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
    from kiln.capture.examples import device_of
    if device_of(example).type != "cpu":
        tx.raise_(TypeError, "can't convert a non-CPU tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                             "memory first.")
    try:
        _np_dtype(example.dtype)
    except TypeError:
        tx.raise_(TypeError, f"Got unsupported ScalarType {str(example.dtype).removeprefix('torch.')}")


def _arrays(result: V.Variable, scalar: bool) -> V.Variable:
    """Tensors a NumPy call returned are arrays (0-d ones NumPy scalars, where NumPy gives one)."""
    if isinstance(result, V.TensorVar):
        return V.NdarrayVar(result.node, result.example, scalar and result.example.dim() == 0)
    if isinstance(result, (V.ListVar, V.TupleVar)):
        result.items = [_arrays(i, scalar) for i in result.items]
    return result


# functions whose 0-d result is an array, not a NumPy scalar
_ARRAY_MAKERS = {"array", "asarray", "asanyarray", "ascontiguousarray", "copy", "empty_like", "zeros_like",
                 "ones_like", "full_like", "atleast_1d", "reshape", "expand_dims", "squeeze"}


def _call(tx, name: str, args: list, kwargs: dict, scalar: bool | None = None) -> V.Variable:
    args = [_as_array_argument(tx, a) for a in args]
    kwargs = {k: _as_array_argument(tx, v) for k, v in kwargs.items()}
    result = call_torch(tx, "call_function", numpy_call, [V.Constant(name), *args], kwargs)
    if scalar is None:
        scalar = name.rpartition(":")[2].rpartition(".")[2] not in _ARRAY_MAKERS
    return _arrays(result, scalar)


def _tensor_of(tx, a: V.NdarrayVar, other: V.TensorVar | None = None) -> V.TensorVar:
    """The array as a tensor operand of a torch op; a NumPy scalar acts as a Python number would."""
    t = V.TensorVar(a.node, a.example)
    if a.scalar and other is not None:
        number = {True: True, "i": 1, "f": 1.0, "c": 1j}
        kind = True if a.example.dtype == torch.bool else "c" if a.example.is_complex() else \
            "f" if a.example.is_floating_point() else "i"
        dtype = torch.result_type(other.example, number[kind])
        if dtype != a.example.dtype:
            return call_torch(tx, "call_method", "to", [t, V.Constant(dtype)], {})
    return t


_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
               operator.pow, operator.matmul}


def _mixed_binary(tx, op, a, b):
    """A tensor and an array in one operator, as eager runs it: a NumPy scalar acts as a Python
    number; `tensor <arithmetic> array` of one dtype is the tensor's operator; the rest of eager's
    answers (TypeErrors, `tensor != array` being a bool, dtype quirks) are not modelled: refused."""
    from kiln.capture.semantics import binary_op
    tensor = a if isinstance(a, V.TensorVar) else b
    array = b if tensor is a else a
    if not array.scalar and not (tensor is a and op in _ARITHMETIC and array.example.dtype == tensor.example.dtype):
        raise tx.unsupported(f"operator {op.__name__} between a tensor and a NumPy array (convert one with "
                             "torch.from_numpy or .numpy())")
    converted = _tensor_of(tx, array, tensor)
    return binary_op(tx, op, a, converted) if tensor is a else binary_op(tx, op, converted, b)


# -- the data model for NdarrayVar -------------------------------------------------------------------------
class _ArrayModel:
    @staticmethod
    def binary(tx, op, a, b):
        if isinstance(a, V.TensorVar) or isinstance(b, V.TensorVar):
            return _mixed_binary(tx, op, a, b)
        result = _call(tx, f"operator:{op.__name__}", [a, b], {})
        if op in BINARY_OPS[13:]:
            return a  # `a += b` on an array is in place: the same array
        return result

    @staticmethod
    def unary(tx, op, v):
        return _call(tx, f"operator:{op.__name__}", [v], {})

    @staticmethod
    def getitem(tx, obj, key):
        return _call(tx, "operator:getitem", [obj, key], {})

    @staticmethod
    def setitem(tx, obj, key, value):
        _call(tx, "operator:setitem", [obj, key, value], {})

    @staticmethod
    def iterate(tx, v):
        if v.example.dim() == 0:
            tx.raise_(TypeError, "iteration over a 0-d array")
        return [_ArrayModel.getitem(tx, v, V.Constant(i)) for i in range(v.example.shape[0])]

    @staticmethod
    def truth(tx, v):
        raise tx.unsupported("Python control flow on a NumPy array's value (if/while/and/or/not) needs its data")


VALUE_MODELS[V.NdarrayVar] = _ArrayModel


# attributes read from the example; the rest of an ndarray's attributes are graph values
_META = {
    "shape": lambda e: tuple(e.shape), "ndim": lambda e: e.dim(), "size": lambda e: e.numel(),
    "dtype": lambda e: _np_dtype(e.dtype), "itemsize": lambda e: e.element_size(),
    "nbytes": lambda e: e.numel() * e.element_size(),
    "strides": lambda e: tuple(n * e.element_size() for n in e.stride()),   # in bytes, as NumPy counts
}
_VALUE_ATTRS = {"T", "real", "imag", "mT"}
_DATA_METHODS = {"item", "tolist", "tobytes", "__bool__", "__int__", "__float__", "__index__", "__array__"}


@dataclasses.dataclass(frozen=True)
class NdarrayMethod:
    """`a.name` for an array in the graph: called, it becomes a `numpy_call` node."""
    name: str


def getattr_ndarray(tx, v: V.NdarrayVar, name: str) -> V.Variable:
    if name in _META:
        return constant_of(tx, _META[name](v.example))
    if name in _VALUE_ATTRS:
        return _call(tx, f"attr:{name}", [v], {}, scalar=False)
    if name in _DATA_METHODS:
        raise tx.unsupported(f"ndarray.{name}() reads the array's data, which a graph cannot hand back to Python")
    if not hasattr(np.ndarray, name):
        tx.raise_(AttributeError, f"'numpy.ndarray' object has no attribute '{name}'")
    if not callable(getattr(np.ndarray, name)):   # a data attribute kiln does not model (flags, base, ctypes)
        raise tx.unsupported(f"ndarray.{name} of an array that stands for a tensor in the graph")
    return V.MethodVar(V.ObjectVar(NdarrayMethod(name)), v)


def _call_method(tx, method: NdarrayMethod, args, kwargs):
    return _call(tx, f"method:{method.name}", args, kwargs)


CALLABLE_TYPES[NdarrayMethod] = _call_method


# -- entry points: tensors to arrays and back, NumPy's functions ---------------------------------------------
@handles(torch.Tensor.numpy)
def _tensor_numpy(tx, args, kwargs):
    t = args[0]
    if python_value(kwargs.get("force", V.Constant(False))):
        t = call_torch(tx, "call_method", "detach", [t], {})
    _check_numpy_able(tx, t.example)
    return V.NdarrayVar(t.node, t.example, source=t.source)


def _from_array(fn):
    """`torch.from_numpy(a)`, `torch.as_tensor(a)`: a new tensor on the array's memory (a view)."""
    def handle(tx, args, kwargs):
        a = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        if isinstance(a, V.ObjectVar) and isinstance(a.value, np.ndarray):
            raise tx.unsupported("a NumPy array made outside captured code (an argument or a global), "
                                 "used inside it")
        if not isinstance(a, V.NdarrayVar):
            if fn is torch.from_numpy:
                tx.raise_(TypeError, f"expected np.ndarray (got {a.python_type().__name__})")
            return call_torch(tx, "call_function", fn, args, kwargs)
        t = V.TensorVar(a.node, a.example)
        view = call_torch(tx, "call_method", "view_as", [t, t], {})
        options = {k: v for k, v in kwargs.items() if k in ("dtype", "device")}
        return call_torch(tx, "call_method", "to", [view], options) if options else view
    return handle


for _fn in (torch.from_numpy, torch.as_tensor, torch.asarray):
    handles(_fn)(_from_array(_fn))


def _numpy_function(tx, fn, args, kwargs):
    """A callable of the `numpy` package: run by NumPy on constants (unless it makes an array), else
    traced through `torch._numpy` under the same name."""
    module = (getattr(fn, "__module__", "") or "").removeprefix("numpy").strip(".")
    if module.startswith("_") or module.startswith("core") or module.startswith("lib"):
        module = ""  # numpy._core.fromnumeric.sum is np.sum
    name = f"{module}.{fn.__name__}" if module else fn.__name__
    if module == "random" or name == "ldexp" or name.startswith(_EFFECTS):
        # NumPy's random state, its global settings and files; ldexp's float64 of integers
        raise tx.unsupported(f"numpy.{name} inside captured code")
    if all(is_python_constant(a) for a in [*args, *kwargs.values()]):
        try:
            result = fn(*[python_value(a) for a in args], **{k: python_value(v) for k, v in kwargs.items()})
        except Exception as e:
            tx.raise_(type(e), str(e))
        if not isinstance(result, np.ndarray):
            return constant_of(tx, result)
    tnp = _torch_numpy()
    try:
        _resolve(tnp, f"function:{name}")
    except AttributeError:
        raise tx.unsupported(f"numpy.{name} has no torch equivalent kiln can trace") from None
    return _call(tx, f"function:{name}", list(args), dict(kwargs))


_EFFECTS = ("seterr", "set_", "setbuf", "save", "load", "fromfile", "genfromtxt")  # not setdiff1d, setxor1d
PACKAGES["numpy"] = _numpy_function  # np.finfo/iinfo, dtypes and scalar types too: folded on constants


def _print_array(r, v: V.NdarrayVar) -> str:
    """An array that leaves the graph is its tensor's `.numpy()` (a NumPy scalar: `[()]` of it); an
    input array, the frame's own object."""
    from kiln.capture import rebuild
    from kiln.capture.sources import NumpyTensorSource
    read_as = v.node.meta.get("source") if v.node.op == "placeholder" else None
    if isinstance(read_as, NumpyTensorSource) and read_as.base == v.source:
        return v.source.expr()
    return rebuild._tensor(r, V.TensorVar(v.node, v.example, source=v.source)) + (".numpy()[()]" if v.scalar else ".numpy()")


def _wrap_ndarray(out, value, source):
    """An array argument (`fn(np.arange(5))`) is a graph input, as torch's compiler takes it: its
    tensor view, `torch.from_numpy(a)` (NumpyTensorSource), guarded as a tensor, the array's type
    guarded too. Arrays torch cannot view (object or string dtypes, read-only) stay objects."""
    from kiln.capture import builder
    from kiln.capture.guards import Guard, GuardKind
    from kiln.capture.sources import NumpyTensorSource
    if source is None or value.dtype.kind not in "biuf" or not value.flags.writeable or type(value) is not np.ndarray:
        return builder._wrap_object(out, value, source)
    out.guard(Guard(GuardKind.TYPE, source, np.ndarray))
    t = out.tensor_input(torch.from_numpy(value), NumpyTensorSource(source))
    return V.NdarrayVar(t.node, t.example, source=source)


def _register_printers():
    from kiln.capture import attributes, builder, rebuild, torch_calls
    attributes._GETATTR[V.NdarrayVar] = getattr_ndarray
    torch_calls._TO_FX[V.NdarrayVar] = lambda tx, v: v.node
    rebuild._PRINTERS[V.NdarrayVar] = _print_array
    builder._WRAPPERS[np.ndarray] = _wrap_ndarray
    # a NumPy scalar argument (`np.int64(3)`, which is no int) is a constant, guarded by type and
    # value as an int is: guarded on its type alone, a call with another value reused the graph
    builder._WRAPPERS[np.generic] = builder._wrap_constant


_register_printers()
