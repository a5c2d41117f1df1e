"""Torch operations become graph nodes: functions, tensor methods, tensor attributes, operators.

`call_torch` turns trackers into FX arguments, adds the node, runs it on example values and wraps
the result. Tensor methods and attributes that only read metadata (`size`, `dim`, `dtype`, ...) are
answered from the example value, guarded by the tensor's metadata guard; those that read data
(`tolist`, `__bool__`) cannot be captured and break the graph, except `item()` (and `int(t)`, and
`tolist()` of a static shape under torch's capture_scalar_outputs) of an integer tensor: its value is
an unbacked SymInt ([Note: unbacked sizes] in kiln/symbolic/shape_env.py), a node of the graph that
later ops may take as a size.
"""
from __future__ import annotations

import keyword
import operator
import sys
import types
from typing import Any

import torch

from kiln.capture import controls
from kiln.capture import variables as V
from kiln.errors import KilnError

# torch.nn.modules holds forward() methods to inline; the rest of torch's Python is taken as ops
_INLINED_TORCH_MODULES = ("torch.nn.modules", "torch.nn.utils.parametriz", "torch.utils.checkpoint", "torch.testing")


def is_torch_op(fn: Any) -> bool:
    """Whether a call of `fn` is one node of the graph (an ATen op, a torch builtin, a torch Python
    function the graph can name), not Python to inline."""
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(fn, "__module__", None) or ""
    if isinstance(fn, types.BuiltinFunctionType) and (module.startswith("torch") or module == ""):
        self_obj = getattr(fn, "__self__", None)
        if self_obj is None or isinstance(self_obj, types.ModuleType):
            return True
        # a method of a torch object: a node only where FX can name it in the graph's code (a
        # Generator's `get_state` has no module to be read from: it runs outside the graph)
        return type(self_obj).__module__.startswith("torch") and \
            (module != "" or getattr(sys.modules["torch"], fn.__name__, None) is fn)
    if isinstance(fn, types.FunctionType):
        # a graph node must name its target as module.name (lambdas and local helpers are inlined)
        return module.startswith("torch.") and not module.startswith(_INLINED_TORCH_MODULES) and \
            _reached_by_attributes(module, fn)
    return False


def _reached_by_attributes(module: str, fn) -> bool:
    """Whether `module.name` read attribute by attribute from `torch` is `fn`, as the graph's Python
    reads it. A package can shadow a submodule by a function of the same name
    (`torch._higher_order_ops.associative_scan` is the function there): its helpers are inlined."""
    value = sys.modules.get("torch")
    for part in [*module.split(".")[1:], fn.__name__]:
        value = getattr(value, part, None)
    return value is fn


def is_tensor_method(fn: Any) -> bool:
    return getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor) or \
        isinstance(fn, types.FunctionType) and fn.__qualname__.startswith("Tensor.")


# torch functions answered at capture time (no node): their value never depends on tensor data
FOLDED = {
    torch.is_tensor: lambda *a: isinstance(a[0], torch.Tensor),
    torch.is_floating_point: lambda x: x.is_floating_point(),
    torch.is_complex: lambda x: x.is_complex(),
    torch.numel: lambda x: x.numel(),
    torch.get_default_dtype: torch.get_default_dtype,
    torch.jit.is_scripting: lambda: False,
    torch.jit.is_tracing: lambda: False,
    torch._C._get_tracing_state: lambda: None,
    torch.is_autocast_enabled: torch.is_autocast_enabled,
    torch.overrides.has_torch_function: lambda *a: False,
    torch.overrides.has_torch_function_unary: lambda *a: False,
    torch.overrides.has_torch_function_variadic: lambda *a: False,
    torch._C._has_torch_function: lambda *a: False,
    torch._C._has_torch_function_unary: lambda *a: False,
    torch._C._has_torch_function_variadic: lambda *a: False,
    torch.cuda.is_available: torch.cuda.is_available,
    torch.is_inference_mode_enabled: torch.is_inference_mode_enabled,
}
for _name in ("is_compiling", "is_dynamo_compiling"):
    if hasattr(torch.compiler, _name):
        FOLDED[getattr(torch.compiler, _name)] = lambda: True

# tensor attributes read from the example's metadata
TENSOR_META_ATTRS = {"shape", "dtype", "ndim", "requires_grad", "is_cuda", "is_sparse", "is_quantized", "layout",
                     "is_leaf", "is_mps", "is_meta", "is_nested", "itemsize", "names", "is_mkldnn", "is_xpu"}
# tensor attributes that are tensors
TENSOR_TENSOR_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
# tensor methods answered from metadata
TENSOR_META_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride", "is_floating_point",
                       "is_complex", "element_size", "is_contiguous", "get_device", "is_signed", "__len__",
                       "storage_offset", "has_names", "is_inference"}
# tensor methods whose value depends on data: a graph break
TENSOR_DATA_METHODS = {"tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "data_ptr",
                       "nonzero_static", "__array__", "__iter__"}
# in-place methods that change a tensor's sizes or strides
INPUT_METADATA_WRITES = {"unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "resize_",
                         "resize_as_", "as_strided_", "set_"}
# [Note: autograd ends the graph] `loss.backward()`, `torch.autograd.grad(...)` differentiate what
# the graph computed so far: in a graph they would be traced too (a backend tracing the graph's own
# backward meets a second one), so the graph ends before them and they run as Python, as
# torch.compile's graph does
AUTOGRAD_CALL = "autograd (backward, autograd.grad) runs on what the graph computed: the graph ends before it"


def to_fx(tx, v: V.Variable) -> Any:
    """A tracker as an FX argument: nodes for tensors, Python values for constants and containers."""
    fn = _TO_FX.get(type(v))
    if fn is None:
        raise tx.unsupported(f"a {v.python_type().__name__} cannot be passed to a torch operation in a graph")
    return fn(tx, v)


_PYTHON_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _object_to_fx(tx, v):
    if type(v.value).__module__ == "numpy":
        return _constant_to_fx(tx, v)
    if isinstance(v.value, type) and v.value in _PYTHON_DTYPES:
        return _PYTHON_DTYPES[v.value]  # `torch.zeros(n, dtype=int)`: the dtype torch's parser reads
    if isinstance(v.value, (torch.dtype, torch.device, torch.memory_format, torch.layout, type(None), type(Ellipsis))) \
            or is_torch_op(v.value):  # FX prints a torch function by its module and name
        return v.value
    raise tx.unsupported(f"a {type(v.value).__name__} object cannot be passed to a torch operation in a graph")


def _constant_to_fx(tx, v):
    """A numpy scalar (`np.sqrt(d)` scaling a tensor) is the Python number it holds, as torch's
    argument parser reads it: the graph's printed code must not name numpy, which it cannot see.
    An array, even 0-d, is not: `tensor * array` is numpy's operation (a float64 array back)."""
    if type(v.value).__module__ == "numpy":
        if type(v.value).__name__ == "ndarray":
            raise tx.unsupported("a numpy array in a torch operation (numpy computes it)")
        return v.value.item()
    return v.value


def _tensor_to_fx(tx, v: V.TensorVar):
    if v.data_replaced and v.example.requires_grad:
        # [Note: a replaced .data that requires grad] ([Note: .data = ...] in attributes.py)
        raise tx.unsupported("an op on a tensor that requires grad whose .data the program replaced "
                             "(its gradient would reach the input itself)")
    return v.node


_TO_FX = {
    V.TensorVar: _tensor_to_fx,
    V.SymNumber: lambda tx, v: v.node,
    V.Constant: _constant_to_fx,
    # a torch.Size holding symbolic sizes (nodes) goes into the graph as a tuple of them
    V.TupleVar: lambda tx, v: (torch.Size if v.cls is torch.Size and v.is_constant() else tuple)(
        to_fx(tx, i) for i in v.items),
    V.ListVar: lambda tx, v: [to_fx(tx, i) for i in v.items],
    V.SliceVar: lambda tx, v: slice(*(to_fx(tx, i) for i in v.items)),
    V.DictVar: lambda tx, v: {k: to_fx(tx, i) for k, i in v.items.items()},
    V.ObjectVar: _object_to_fx,
    V.FunctionVar: lambda tx, v: v.fn if v.fn is not None and _printable(v.fn) else _no_fn(tx),
}


def _printable(fn) -> bool:
    return getattr(sys.modules.get(fn.__module__ or ""), fn.__name__, None) is fn


def _no_fn(tx):
    raise tx.unsupported("a local function or lambda cannot be passed to a torch operation in a graph")


def call_torch(tx, kind: str, target: Any, args: list, kwargs: dict) -> V.Variable:
    fx_args = tuple(to_fx(tx, a) for a in args)
    fx_kwargs = {k: to_fx(tx, v) for k, v in kwargs.items()}
    if any(keyword.iskeyword(k) for k in fx_kwargs):
        fx_args, fx_kwargs = _keywords_by_position(target, fx_args, fx_kwargs)
    try:
        node, example = tx.out.call(kind, target, fx_args, fx_kwargs)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError, KilnError) as e:
        name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
        why = data_dependent_reason(e)
        guard = _data_dependent_guard(e) if why is None else None
        if why is not None or guard is not None:
            error = tx.unsupported(f"torch op {name}: {why}, so the graph breaks here" if why is not None
                                   else f"torch op {name}: {guard}")
            error.data_dependent = True      # a torch Python function is then inlined (calls.py)
            raise error from e
        text = str(e).split("\n")[0]
        raise tx.unsupported(f"torch op {name} could not run on example values ({type(e).__name__}: {text}); "
                             "it probably depends on tensor data") from e
    if _new_leaf(example, args):
        raise tx.unsupported("a tensor made with requires_grad=True is a leaf of autograd, whose gradient a "
                             "backward after the graph fills: it is made outside the graph")
    return wrap_result(tx, node, example, args)


def _new_leaf(example, args: list) -> bool:
    """Whether an op made a new autograd leaf (`torch.ones(2, requires_grad=True)`,
    `t.detach().requires_grad_()`): inside a graph it would be a value of the graph, which a
    backward differentiates through instead of filling its `.grad`. (A view made under no_grad of
    a parameter says requires_grad and is_leaf too: it is no new leaf.)"""
    return isinstance(example, torch.Tensor) and example.requires_grad and example.is_leaf and \
        not example._is_view() and \
        not any(isinstance(a, V.TensorVar) and a.source is not None and a.example is example for a in args)


def _keywords_by_position(target, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`t.random_(**{"from": -10, "to": 10})`: a graph's printed code cannot pass an argument named by
    a Python keyword (`from = -10` does not parse), so it goes by position, as the ATen schema of the
    op's name orders its parameters (the defaults of the ones skipped filled in). Left as they are
    where no schema takes them so."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    packet = getattr(torch.ops.aten, name, None)
    for overload in packet.overloads() if isinstance(packet, torch._ops.OpOverloadPacket) else ():
        params = [a for a in getattr(packet, overload)._schema.arguments if not a.kwarg_only]
        names = [a.name for a in params]
        wanted = [k for k in kwargs if keyword.iskeyword(k)]
        if not all(k in names[len(args):] for k in wanted):
            continue
        last = max(names.index(k) for k in wanted)
        filled = params[len(args):last + 1]
        if all(a.name in kwargs or a.has_default_value() for a in filled):
            rest = {k: v for k, v in kwargs.items() if k not in {a.name for a in filled}}
            return (*args, *(kwargs[a.name] if a.name in kwargs else a.default_value for a in filled)), rest
    return args, kwargs


# [Note: data-dependent ops] ATen ops whose output size, or the Python value they hand back, is
# known only from the values in a tensor. nonzero, masked_select, x[mask], unique and
# repeat_interleave(tensor) are captured: their sizes are unbacked symbols ([Note: unbacked sizes]
# in kiln/symbolic/shape_env.py), as is an integer read from a tensor. What remains is a float or
# bool read from a tensor (`torch.full((2,), t)` of a float t): kiln breaks the graph there and runs
# it eagerly (results equal eager's); the reason names the op's kind.
_DATA_DEPENDENT = {
    "_local_scalar_dense": "it reads a float or bool from a tensor",
}


def tensor_item(tx, t: V.TensorVar) -> V.Variable:
    """`t.item()` (also `int(t)`) of an integer tensor: a graph node whose value is an unbacked
    SymInt; of a bool tensor an unbacked SymBool (for `torch._check`; a branch on it breaks the
    graph). A float read from a tensor still breaks the graph (it can be no size, and a branch on it
    needs its value)."""
    dtype = t.example.dtype
    if dtype.is_floating_point or dtype.is_complex:
        raise tx.unsupported(f"Tensor.item() of a {dtype} tensor reads tensor data, which a graph cannot hand "
                             "back to Python (only an integer read from a tensor becomes a symbolic size)")
    return call_torch(tx, "call_method", "item", [t], {})


def _reads_as_unbacked(t: V.TensorVar) -> bool:
    """Whether `t.item()` of each element is an unbacked symbol (an integer or bool tensor) and
    its shape is static, so that `t.tolist()` has a known structure."""
    dtype = t.example.dtype
    return not (dtype.is_floating_point or dtype.is_complex) and all(type(n) is int for n in t.example.shape)


def tensor_tolist(tx, t: V.TensorVar) -> V.Variable:
    """`t.tolist()` of an integer or bool tensor of static shape, where the program set torch's
    `capture_scalar_outputs` (else tolist breaks the graph, as under torch.compile): nested lists of
    `t[i, j].item()`, each an unbacked symbol."""
    def read(index: tuple, depth: int) -> V.Variable:
        if depth == t.example.dim():
            element = call_torch(tx, "call_function", operator.getitem, [t, V.Constant(index)], {}) if index else t
            return tensor_item(tx, element)
        return V.ListVar([read(index + (i,), depth + 1) for i in range(t.example.shape[depth])])
    return read((), 0)


def data_dependent_reason(e: BaseException) -> str | None:
    """What makes the op that raised `e` (or its cause) depend on tensor values, if it does."""
    from kiln.symbolic.fake import DataDependentOp, MissingMetaKernel
    while e is not None:
        if isinstance(e, DataDependentOp) and e.reason is not None:
            return e.reason
        if isinstance(e, (DataDependentOp, MissingMetaKernel)):
            packet = getattr(e.op, "_opname", None) or getattr(getattr(e.op, "overloadpacket", None), "__name__", "")
            why = _DATA_DEPENDENT.get(packet) or _DATA_DEPENDENT.get(str(packet).split(".")[-1])
            return why and why + ", and kiln cannot take it as a size (only an integer read from a tensor can be one)"
        e = e.__cause__
    return None


def _data_dependent_guard(e: BaseException):
    """The DataDependentGuard that raised `e` or caused it, if one did."""
    from kiln.symbolic import DataDependentGuard
    while e is not None:
        if isinstance(e, DataDependentGuard):
            return e
        e = e.__cause__ or e.__context__
    return None


SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def wrap_result(tx, node: torch.fx.Node, example: Any, args=()) -> V.Variable:
    if isinstance(example, SYM_TYPES):
        return V.SymNumber(node, example)
    if isinstance(example, torch.Tensor):
        # in-place ops return their input: keep one tracker so identity (`y is x`) holds
        for a in args:
            if isinstance(a, V.TensorVar) and a.example is example:
                return a
        node.meta["python_type"] = type(example) if type(example) is not torch.nn.Parameter else torch.Tensor
        return V.TensorVar(node, example)
    if isinstance(example, (tuple, list)) and _holds_graph_values(example):
        # a nested list is read by index too: histogramdd returns (hist, [edges, ...])
        items = [wrap_result(tx, tx.out.getitem(node, i, e), e) if _holds_graph_values(e)
                 else V.Constant(e) for i, e in enumerate(example)]
        if isinstance(example, list):
            return V.ListVar(items)
        return V.TupleVar(items, type(example) if type(example) is not tuple else tuple)
    if isinstance(example, torch.Size):
        return V.TupleVar([V.Constant(e) for e in example], torch.Size)
    # a number or string computed from metadata alone needs no node; None or an opaque object
    # (torch.manual_seed's Generator) means the call was made for its effect: keep it
    if isinstance(example, (int, float, bool, str, torch.dtype, torch.device, tuple, list)) and not node.users:
        tx.out.graph.erase_node(node)
    elif example is not None and not isinstance(example, (int, float, bool, str, torch.dtype, torch.device,
                                                               tuple, list)):
        return V.ObjectVar(example)
    if isinstance(example, (tuple, list)):
        return (V.ListVar if isinstance(example, list) else V.TupleVar)([V.Constant(e) for e in example])
    return V.Constant(example)


def _holds_graph_values(value) -> bool:
    """A tensor or SymInt, or a list/tuple holding one at any depth: a value of the graph."""
    if isinstance(value, (torch.Tensor, *SYM_TYPES)):
        return True
    return isinstance(value, (tuple, list)) and any(_holds_graph_values(v) for v in value)


def _has_sym(value) -> bool:
    if isinstance(value, SYM_TYPES):
        return True
    return isinstance(value, (tuple, list)) and any(isinstance(v, SYM_TYPES) for v in value)


def tensor_getattr(tx, t: V.TensorVar, name: str) -> V.Variable:
    if name == "shape":
        return tensor_method(tx, "size", [t], {})
    if name in TENSOR_META_ATTRS:
        return V.Constant(getattr(t.example, name))
    if name == "device":
        from kiln.capture.examples import device_of
        return V.Constant(device_of(t.example))
    if name == "is_cuda":
        from kiln.capture.examples import device_of
        return V.Constant(device_of(t.example).type == "cuda")
    if name in TENSOR_TENSOR_ATTRS:
        return call_torch(tx, "call_function", getattr, [t, V.Constant(name)], {})
    if name == "grad":
        return _grad(tx, t)
    if name == "data":   # not detach(): `.data` has a version counter of its own, which a write through it leaves
        return call_torch(tx, "call_function", getattr, [t, V.Constant("data")], {})
    if name == "__class__":
        return V.ObjectVar(t.python_type())
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        own = _own_attribute(tx, t, name)
        if own is not None:
            return own
        tx.raise_(AttributeError, f"'Tensor' object has no attribute '{name}'")
    if callable(attr):
        return V.MethodVar(V.ObjectVar(attr), t)
    raise tx.unsupported(f"reading tensor attribute {name!r} is not supported")


def _grad(tx, t: V.TensorVar) -> V.Variable:
    """`t.grad`: an input's is read from the real tensor, as any attribute of an input is (a
    tensor becomes an input of the graph, None is guarded None). A tensor the graph computes has
    none: no backward runs inside a graph ([Note: autograd ends the graph]), and a fake's `.grad`
    says nothing of the real one's."""
    from kiln.capture.builder import wrap
    from kiln.capture.sources import AttrSource
    real = tx.out.input_values.get(t.node) if t.source is not None else None
    if not isinstance(real, torch.Tensor):
        return V.Constant(None)
    return wrap(tx.out, real.grad, AttrSource(t.source, "grad"))


def _own_attribute(tx, t: V.TensorVar, name: str) -> V.Variable | None:
    """An attribute the program set on an input tensor (`inp.test = None`), read from the real
    tensor's `__dict__`; guarded present or absent, so a call with a tensor that has it, or has
    not, compiles again. None where the tensor has no such attribute (or is not an input)."""
    from kiln.capture.builder import wrap
    from kiln.capture.guards import Guard, GuardKind
    from kiln.capture.sources import AttrSource
    real = tx.out.input_values.get(t.node) if t.source is not None else None
    if not isinstance(real, torch.Tensor):
        return None
    own = real.__dict__
    tx.out.guard(Guard(GuardKind.PRESENT if name in own else GuardKind.ABSENT, AttrSource(t.source, "__dict__"), name))
    return wrap(tx.out, own[name], AttrSource(t.source, name)) if name in own else None


def tensor_of_tensors(tx, args: list, kwargs: dict) -> V.Variable | None:
    """`torch.tensor([t0, t1])` of 0-d tensors (nested lists of them, of one dtype): the values
    copied, as `torch.stack` of them detached, in the dtype asked for or theirs (what
    torch.tensor reads from them, without handing their data to Python). None for anything else,
    which runs as torch.tensor."""
    if len(args) != 1 or set(kwargs) - {"dtype"} or not isinstance(args[0], (V.ListVar, V.TupleVar)):
        return None

    def leaves(v):
        if isinstance(v, (V.ListVar, V.TupleVar)):
            return [leaf for item in v.items for leaf in leaves(item)] if v.items else [None]
        return [v]
    found = leaves(args[0])
    if not all(isinstance(t, V.TensorVar) and t.example.dim() == 0 for t in found) or \
            len({t.example.dtype for t in found}) != 1:
        return None

    def build(v):
        if isinstance(v, V.TensorVar):
            return v
        return call_torch(tx, "call_function", torch.stack, [V.ListVar([build(i) for i in v.items])], {})
    out = call_torch(tx, "call_method", "detach", [build(args[0])], {})
    dtype = kwargs.get("dtype")
    if dtype is not None and not (isinstance(dtype, V.Constant) and dtype.value is None):
        out = call_torch(tx, "call_method", "to", [out, dtype], {})
    return out


def tensor_method(tx, name: str, args: list, kwargs: dict) -> V.Variable:
    """`args[0]` is the tensor."""
    self_var = args[0]
    if name in TENSOR_META_METHODS:
        from kiln.capture.constants import python_value
        from kiln.capture.examples import device_of
        if name == "get_device":
            d = device_of(self_var.example)
            return V.Constant(d.index if d.type == "cuda" else -1)
        values = [python_value(a) for a in args[1:]]
        kw = {k: python_value(v) for k, v in kwargs.items()}
        result = getattr(self_var.example, name)(*values, **kw)
        if _has_sym(result):  # a symbolic size: the graph computes it, so it stays symbolic
            return call_torch(tx, "call_method", name, args, kwargs)
        if isinstance(result, torch.Size):
            return V.TupleVar([V.Constant(n) for n in result], torch.Size)
        return V.Constant(result)
    if name == "__iter__" and len(args) == 1 and not kwargs:   # `t.__iter__()` is `iter(t)`: over dim 0
        return tx.call(V.ObjectVar(iter), [self_var])
    if name == "tolist" and len(args) == 1 and not kwargs and _reads_as_unbacked(self_var) and \
            controls.capture_scalar_outputs():
        return tensor_tolist(tx, self_var)
    if name in TENSOR_DATA_METHODS:
        raise tx.unsupported(f"Tensor.{name}() reads tensor data, which a graph cannot hand back to Python")
    if name == "backward":
        raise tx.unsupported(AUTOGRAD_CALL)
    if name == "retain_grad" and len(args) == 1 and not kwargs:
        return _retain_grad(tx, self_var)
    if name in INPUT_METADATA_WRITES and self_var.source is not None:
        # the caller's tensor changes shape: a graph's input keeps the metadata it was traced with
        # (aot refuses to replay it), so the call runs before the graph that follows, on the input
        raise tx.unsupported(f"Tensor.{name}() changes the sizes or strides of an input in place")
    if name == "item":
        return tensor_item(tx, self_var)
    if name == "__setitem__":
        call_torch(tx, "call_function", operator.setitem, args, kwargs)
        return V.Constant(None)
    if name == "new":
        return _legacy_new(tx, args, kwargs)
    if name == "type" and len(args) + len(kwargs) == 2:
        wanted = args[1] if len(args) > 1 else kwargs.get("dtype")
        if isinstance(wanted, V.ObjectVar) and is_legacy_tensor_type(wanted.value):
            # `t.type(torch.HalfTensor)` is `t.type("torch.HalfTensor")`: the graph holds the name
            return call_torch(tx, "call_method", "type", [self_var, V.Constant(legacy_type_name(wanted.value))], {})
    if name == "type" and len(args) == 1 and not kwargs:
        # the type's name ('torch.FloatTensor', 'torch.cuda.HalfTensor'): metadata, guarded already
        from kiln.capture.examples import device_of
        device, cpu_name = device_of(self_var.example), torch.empty(0, dtype=self_var.example.dtype).type()
        return V.Constant(cpu_name if device.type == "cpu" else cpu_name.replace("torch.", f"torch.{device.type}.", 1))
    return call_torch(tx, "call_method", name, args, kwargs)


def _retain_grad(tx, t: V.TensorVar) -> V.Variable:
    """`t.retain_grad()` of an input marks the real tensor for the backward that runs after the
    graph: done on it after the graph ran (a node would mark the graph's own value, which no
    backward outside the graph reaches). A tensor the graph computes gets its gradient inside the
    graph's backward: the graph ends before the call, which then marks the real tensor."""
    from kiln.capture.output import DeferredCall
    if not t.example.requires_grad:
        tx.raise_(RuntimeError, "can't retain_grad on Tensor that has requires_grad=False")
    if t.source is None:
        raise tx.unsupported("retain_grad() of a tensor the graph computes (its gradient flows inside the graph)")
    tx.out.side_effects.append(DeferredCall(torch.Tensor.retain_grad, (t,), ()))
    return V.Constant(None)


def _legacy_new(tx, args: list, kwargs: dict) -> V.Variable:
    """`t.new(...)`, the legacy constructor, by what its arguments are: sizes (ints, or a
    torch.Size) give `t.new_empty(sizes)`, a list or tuple of numbers `t.new_tensor(data)`. An FX
    graph keeps no torch.Size (it stores a tuple, which `new` would read as data), so the call is
    not left as it is."""
    self_var, rest = args[0], args[1:]
    if all(isinstance(a, V.SymNumber) or isinstance(a, V.Constant) and isinstance(a.value, int) for a in rest):
        sizes = list(rest) if rest else ([] if "size" in kwargs else [V.Constant(0)])
        return call_torch(tx, "call_method", "new_empty", [self_var, *sizes], kwargs)
    if len(rest) == 1 and isinstance(rest[0], V.TupleVar) and rest[0].cls is torch.Size:
        return call_torch(tx, "call_method", "new_empty", [self_var, V.TupleVar(list(rest[0].items))], kwargs)
    if len(rest) == 1 and isinstance(rest[0], (V.ListVar, V.TupleVar)):
        return call_torch(tx, "call_method", "new_tensor", [self_var, rest[0]], kwargs)
    return call_torch(tx, "call_method", "new", args, kwargs)


# [Note: legacy tensor types] `torch.FloatTensor`, `torch.cuda.LongTensor`, ...: each names one dtype
# on one device (strided, or sparse under torch.sparse). A tensor is an instance of one when its
# dtype, device and layout match (their metaclass's __instancecheck__); `t.type(T)` converts to it.
_LEGACY_TENSOR_TYPE = type(torch.FloatTensor)


def is_legacy_tensor_type(value) -> bool:
    return type(value) is _LEGACY_TENSOR_TYPE


def legacy_type_name(cls) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def is_instance_of_legacy_type(example: torch.Tensor, cls) -> bool:
    from kiln.capture.examples import device_of
    return example.dtype == cls.dtype and (device_of(example).type == "cuda") == cls.is_cuda and \
        example.is_sparse == cls.is_sparse
