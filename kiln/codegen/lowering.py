"""Lowering: a prim- (or ATen-) level FX graph to the loop IR (`kiln.codegen.ir.Graph`).

Each FX node is lowered by one function from `LOWERINGS`, keyed by the op's short name (`add`,
`sum`, `reshape`, ...), so one rule serves `kiln_prims.add` and `aten.add` alike (prims are the
strict special case: no promotion, no broadcasting). A rule returns a `TensorValue`: sizes, dtype
and a scalar expression over the loop variables `x0..x{n-1}` — nothing is materialized yet. Views
are index substitutions on that expression, pointwise ops wrap it, so chains of views and
pointwise ops inline into their consumer for free. A value becomes a buffer (`realize`) when a
reduction/scan produces it, an extern call needs it whole, it is a graph output, or several
consumers would each recompute an expensive expression.

Ops without a rule, and dtypes the target printer does not compute in (its `KERNEL_DTYPES`; both
printers compute in the half types), become `ExternKernel`s that call the op eagerly on whole
tensors: always correct, never fused. A copy of a value of such a dtype is an extern clone.
The rules live in `lowering_rules.py`, `lowering_reduce.py` and `lowering_scatter.py`; this module holds the machinery they use.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable, Sequence

import sympy
import torch
import torch.fx

from kiln.codegen import ir
from kiln.codegen.ir import Constant, Load, Op, ScalarExpr, loop_var
from kiln.errors import NotYetImplemented

# Dtypes every loop printer computes in; a printer may declare more (`printer.KERNEL_DTYPES`).
KERNEL_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
                           torch.uint8, torch.bool})

# A multi-use pointwise value is recomputed in each consumer unless it is bigger than this.
REALIZE_OPCOUNT = 12
# ...or unless this many consumers would recompute it.
REALIZE_USERS = 6


@dataclasses.dataclass(frozen=True)
class TensorValue:
    """A tensor during lowering: element `x` is `expr` at loop variables x0..x{n-1}."""

    sizes: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    device: str
    expr: ScalarExpr

    @property
    def ndim(self) -> int:
        return len(self.sizes)


LOWERINGS: dict[str, Callable] = {}


def register(*names: str):
    def wrap(fn):
        for n in names:
            LOWERINGS[n] = fn
        return fn
    return wrap


class LoweringError(Exception):
    """A rule met arguments it does not handle; the node falls back to an extern call."""


def to_sympy(v: Any) -> sympy.Expr:
    if isinstance(v, sympy.Basic):
        return v
    if isinstance(v, (bool, int)):
        return sympy.Integer(int(v))
    if isinstance(v, (torch.SymInt, torch.SymBool)):   # a SymBool: a run-time check's condition
        node = v.node
        expr = getattr(node, "expr", None)
        if isinstance(expr, sympy.Basic):
            # the equalities the guards check (s2 == 16, s3 == s0) are applied, so one size
            # has one name: fewer kernel arguments, more buffer reuse, simpler indices
            shape_env = getattr(node, "shape_env", None)
            return index_form(shape_env.simplify(expr) if shape_env is not None else expr)
        hint = getattr(node, "hint", None)
        if hint is not None:
            return sympy.Integer(int(hint))
        return sympy.Integer(int(v))
    raise LoweringError(f"cannot use {v!r} as a size")


def index_form(expr: sympy.Expr) -> sympy.Expr:
    """A size from kiln.symbolic in the form index expressions use: its `FloorDiv(a, b)` (sizes
    are non-negative, so Python's and C's division agree) becomes `floor(a / b)`, which the index
    simplifier and every printer know."""
    from kiln.symbolic.sympy_ops import FloorDiv
    if expr.has(sympy.Max):   # contiguous strides of a symbolic size: max(1, s) is s
        expr = expr.replace(lambda e: isinstance(e, sympy.Max), _drop_unit_max)
    if not expr.has(FloorDiv):
        return expr
    return expr.replace(FloorDiv, lambda a, b: floordiv(a, b))


def _drop_unit_max(e: sympy.Max) -> sympy.Expr:
    rest = [a for a in e.args if not (a.is_number and a <= 1)]
    if rest and len(rest) < len(e.args) and all(a.is_integer and a.is_positive for a in rest):
        return sympy.Max(*rest)
    return e


def bind_arguments(target, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in (OpOverloads), else positional a0.."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        out = {f"a{i}": a for i, a in enumerate(args)}
        out.update(kwargs)
        return out
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::", 1)[1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::", 1)[1]
    return getattr(target, "__name__", str(target))


class LoweringContext:
    """The state of lowering one graph: buffers and nodes emitted so far. Passed to every rule."""

    def __init__(self, device: str, split_reductions: bool = False, kernel_dtypes: frozenset = KERNEL_DTYPES):
        self.device = device
        self.split_reductions = split_reductions   # see [Note: split reductions]
        self.kernel_dtypes = kernel_dtypes         # what the target printer loads, computes and stores
        self.buffers: dict[str, ir.Buffer] = {}
        self.nodes: list[ir.Node] = []
        self._count = 0
        self.node_of: dict[TensorValue, str] = {}   # a graph node's value -> the node's name
        self.origins: dict[str, str] = {}            # buffer -> the graph node whose value it holds
        self.arg_extents: dict[str, sympy.Expr] = {}  # argmax/argmin result buffer -> the extent it indexes
        # the fake values of the tensor arguments of the node being lowered, in order: their strides
        # and storage offsets, which a TensorValue does not carry (the `as_strided` rule needs them)
        self.arg_metas: tuple = ()
        # the user's op and line of the node being lowered: its gathers' and scatters' bounds
        # checks name them ([Note: an op's origin] in kiln/aot/trace.py)
        self.check_origin: ir.CheckOrigin | None = None
        # [Note: one buffer per value]
        self.realized: dict[tuple[TensorValue, tuple], ir.Buffer] = {}
        self.realized_any: dict[TensorValue, ir.Buffer] = {}

    def new_name(self, prefix: str = "buf") -> str:
        self._count += 1
        return f"{prefix}{self._count - 1}"

    def placed(self, device) -> str:
        """Where this program holds a value eager holds on `device` (a type or torch.device):
        [Note: a CUDA program holds everything on its device]."""
        kind = torch.device(device).type if not isinstance(device, str) or ":" in device else device
        return self.device if kind in ("meta", "cpu") else kind

    def add_buffer(self, buf: ir.Buffer) -> ir.Buffer:
        if self.placed(buf.device) != buf.device:
            buf = dataclasses.replace(buf, device=self.placed(buf.device))
        self.buffers[buf.name] = buf
        return buf

    def load_buffer(self, buf: ir.Buffer) -> TensorValue:
        idx = [loop_var(k) for k in range(len(buf.sizes))]
        return TensorValue(tuple(buf.sizes), buf.dtype, buf.device, Load(buf.name, buf.index(idx), buf.dtype))

    def buffer_of(self, tv: TensorValue) -> ir.Buffer | None:
        """The buffer `tv` reads whole, at its natural index, if it is one."""
        e = tv.expr
        if isinstance(e, Load) and not e.indirect and e.buffer in self.buffers:
            buf = self.buffers[e.buffer]
            if tuple(buf.sizes) == tuple(tv.sizes) and buf.dtype == tv.dtype:
                idx = [loop_var(k) for k in range(len(buf.sizes))]
                if sympy.expand(buf.index(idx) - e.index) == 0:
                    return buf
        return None

    def realize(self, tv: TensorValue, strides: Sequence[Any] | None = None, fresh: bool = False) -> ir.Buffer:
        """Materialize `tv` into a buffer (unless it already is one of the requested layout, or
        `fresh`: always a new buffer, which starts at offset 0 and aliases nothing).

        [Note: one buffer per value] A cheap value with several users is not realized where it is
        computed (it inlines into each consumer), so two consumers that need it whole (an extern,
        a graph output) would each realize it: autocast's bf16 cast of a weight fed the
        convolution and was computed again for the backward that saves it (53 kernels a ResNet-50
        forward). A value is realized once per layout, and `realized_any` lets a consumer that
        takes any layout (a value saved for the backward) take the first."""
        buf = self.buffer_of(tv)
        if not fresh and buf is not None and (strides is None or tuple(map(to_sympy, strides)) == tuple(buf.strides)):
            return buf
        strides = tuple(map(to_sympy, strides)) if strides is not None else ir.contiguous_strides(tv.sizes)
        if not fresh and (tv, strides) in self.realized:
            return self.realized[tv, strides]
        source = self._copy_source(tv) if tv.dtype not in self.kernel_dtypes else None
        buf = self.add_buffer(ir.Buffer(self.new_name(), tuple(tv.sizes), strides, tv.dtype, tv.device))
        if source is not None:
            # no kernel can copy it (a complex64 buffer): the copy is an extern, whose result the
            # host program gives `strides`
            self.nodes.append(ir.ExternKernel((buf.name,), torch.ops.aten.clone.default, (source,)))
        else:
            self.nodes.append(ir.ComputedBuffer(buf.name, ir.Pointwise(tuple(tv.sizes), tv.expr)))
        if tv in self.node_of:
            self.origins[buf.name] = self.node_of[tv]
        if not fresh:         # a fresh buffer may be written in place by the extern it is made for
            self.realized[tv, strides] = buf
            self.realized_any.setdefault(tv, buf)
        return buf

    def _copy_source(self, tv: TensorValue) -> ir.BufferArg | ir.ViewArg:
        """What an extern copy of `tv` reads, for a dtype no kernel handles. No lowering rule runs on
        such a dtype (`_kernel_dtypes_ok`), so its values are extern results read whole or through
        a strided view; a copy is still asked for when an extern needs a buffer of its own
        (`as_strided_scatter` of a complex gradient) or a graph output must not alias an input."""
        from kiln.codegen.lowering_reduce import strided_view
        held = self.buffer_of(tv)
        source = ir.BufferArg(held.name) if held is not None else strided_view(self, tv)
        if source is None:
            raise NotYetImplemented(f"kiln codegen: a {tv.dtype} value computed by {tv.expr}; no kernel "
                                    f"computes in {tv.dtype}")
        return source

    def emit_reduction(self, tv: TensorValue, reduce_dims: Sequence[int], op: str,
                       dtype: torch.dtype) -> TensorValue:
        """Reduce `tv` over `reduce_dims` (result has the kept dims, in order)."""
        kept = [d for d in range(tv.ndim) if d not in reduce_dims]
        mapping = {loop_var(d): loop_var(k) for k, d in enumerate(kept)}
        mapping.update({loop_var(d): ir.reduction_var(k) for k, d in enumerate(reduce_dims)})
        ranges = tuple(tv.sizes[d] for d in kept)
        reduced = tuple(tv.sizes[d] for d in reduce_dims)
        if op in EMPTY_REDUCTION and any(sympy.sympify(s) == 0 for s in reduced):
            # Over no elements a reduction is its identity. As a kernel, a row's loads that its
            # index no longer ties to the reduced range (`x.reshape(-1)` of a [1, 3, 0] bool: the
            # load folds to element 0) ran unmasked on an empty tensor (fuzz seed 1001852 of
            # --triton-interpret: SIGSEGV; on a GPU an out-of-bounds read).
            return TensorValue(ranges, dtype, tv.device, Constant(EMPTY_REDUCTION[op](dtype), dtype))
        split = self._split_of(ranges, reduced, op)
        if split is not None:
            # [Note: split reductions] partial results over `split` chunks of the first reduced
            # dim, a new first dim of a partial buffer (neighbouring outputs stay neighbours in
            # memory), then the same op over the chunks.
            split, chunk = sympy.Integer(split), sympy.Integer(int(reduced[0]) // split)
            mapping.update({loop_var(d): loop_var(k + 1) for k, d in enumerate(kept)})
            mapping[loop_var(reduce_dims[0])] = loop_var(0) * chunk + ir.reduction_var(0)
            partial = self._reduction_buffer((split, *ranges), (chunk, *reduced[1:]), op,
                                             ir.subs_index(tv.expr, mapping), dtype, tv.device)
            index = partial.index([ir.reduction_var(0), *(loop_var(k) for k in range(len(ranges)))])
            return self.load_buffer(self._reduction_buffer(ranges, (split,), op, Load(partial.name, index, dtype),
                                                           dtype, tv.device))
        return self.load_buffer(self._reduction_buffer(ranges, reduced, op, ir.subs_index(tv.expr, mapping),
                                                       dtype, tv.device))

    def argmax_extent(self, buffer: str) -> sympy.Expr | None:
        """For a buffer an argmax/argmin wrote, the number of elements its values index (they lie in
        [0, extent)); else None. [Note: index bounds checks]"""
        return self.arg_extents.get(buffer)

    def _reduction_buffer(self, ranges, reduced, op, expr, dtype, device) -> ir.Buffer:
        buf = self.add_buffer(ir.Buffer(self.new_name(), ranges, ir.contiguous_strides(ranges), dtype, device))
        self.nodes.append(ir.ComputedBuffer(buf.name, ir.Reduction(ranges, reduced, op, expr)))
        if op in ("argmax", "argmin"):
            self.arg_extents[buf.name] = ir.product(reduced)
        return buf

    def _split_of(self, ranges, reduced, op) -> int | None:
        """[Note: split reductions] A GPU reduction with few outputs and long rows runs on few
        programs (a bias gradient: 768 outputs of 4096 rows each is 12 programs on 132 SMs), so
        it is split into partial reductions over chunks of its first reduced dim, enough of
        them for about 16384 partial outputs, each chunk still at least 256 elements long. Only for
        static sizes, ops that combine with themselves, and a chunk count that divides the dim
        (a masked tail would need a load that is never out of bounds)."""
        if not self.split_reductions or op not in SPLITTABLE_REDUCTIONS or not reduced:
            return None
        if not all(sympy.sympify(s).is_Integer for s in (*ranges, *reduced)):
            return None
        outputs, total, first = int(ir.product(ranges)), int(ir.product(reduced)), int(reduced[0])
        if outputs * total < 1 << 18 or outputs >= 4096:
            return None
        target = -(-16384 // outputs)
        options = [s for s in sympy.divisors(first) if s >= 4 and total // s >= 256]   # not a loop over `first`
        return min(options, key=lambda s: abs(s - target), default=None)

    def emit_scan(self, tv: TensorValue, dim: int, op: str) -> TensorValue:
        """Scan `tv` along `dim`; the result has `tv`'s shape."""
        others = [d for d in range(tv.ndim) if d != dim]
        mapping = {loop_var(d): loop_var(k) for k, d in enumerate(others)}
        mapping[loop_var(dim)] = ir.reduction_var(0)
        expr = ir.subs_index(tv.expr, mapping)
        ranges = tuple(tv.sizes[d] for d in others)
        # The scan's buffer has dims `others + (dim,)`; a view puts them back in tv's order.
        sizes = ranges + (tv.sizes[dim],)
        buf = self.add_buffer(ir.Buffer(self.new_name(), sizes, ir.contiguous_strides(sizes), tv.dtype, tv.device))
        self.nodes.append(ir.ComputedBuffer(buf.name, ir.Scan(ranges, tv.sizes[dim], op, expr)))
        loaded = self.load_buffer(buf)
        order = others + [dim]
        idx = [loop_var(d) for d in order]
        return dataclasses.replace(loaded, sizes=tuple(tv.sizes),
                                   expr=ir.subs_index(loaded.expr, {loop_var(k): idx[k] for k in range(len(idx))}))


SPLITTABLE_REDUCTIONS = frozenset({"sum", "prod", "max", "min", "any", "all"})
# op -> its value over no elements, by result dtype. Eager refuses max and min of no elements, but
# decompositions reach them from ops that do not: `any` of bools is a max, `all` a min (fuzz seed
# 2000550 on an H100: `x[:, :, :0].any()` printed `r // 0` into an index, and Triton's compiler failed)
EMPTY_REDUCTION: dict[str, Callable[[torch.dtype], Any]] = {
    "sum": lambda d: False if d == torch.bool else (0.0 if d.is_floating_point else 0),
    "prod": lambda d: True if d == torch.bool else (1.0 if d.is_floating_point else 1),
    "any": lambda d: False,
    "all": lambda d: True,
    "max": lambda d: False if d == torch.bool else (-math.inf if d.is_floating_point else torch.iinfo(d).min),
    "min": lambda d: True if d == torch.bool else (math.inf if d.is_floating_point else torch.iinfo(d).max),
}


# ---------------------------------------------------------------------------- expression helpers

def cast(e: ScalarExpr, dtype: torch.dtype) -> ScalarExpr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Constant):
        return Constant(_py_value(e.value, dtype), dtype)
    return Op("to_dtype", (e,), dtype)


def _py_value(v, dtype):
    if dtype == torch.bool:
        return bool(v)
    if dtype in (torch.float16, torch.bfloat16):
        # a constant of a narrow type holds its rounded value (double to float, then to the narrow
        # type, as c10 converts), so casting it on keeps eager's rounding (full(0.1, bf16) + x)
        return torch.tensor(float(v), dtype=torch.float32).to(dtype).item()
    if dtype.is_floating_point:
        return float(v)
    return int(v)


def constant(value, dtype: torch.dtype) -> Constant:
    return Constant(_py_value(value, dtype), dtype)


def size_scalar(size: sympy.Expr, dtype: torch.dtype) -> ScalarExpr:
    """A size (a number, or an expression over size symbols) as a scalar of `dtype`: a mean's
    count, a fill value or an offset computed from the inputs' sizes."""
    size = to_sympy(size)
    if size.is_Integer:
        return constant(int(size), dtype)
    return cast(ir.IndexValue(size), dtype)


def floordiv(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    if b == 1:
        return a
    return sympy.floor(a / b)


def modulo(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    if b == 1:
        return sympy.Integer(0)
    return sympy.Mod(a, b)


def reindex(tv: TensorValue, new_sizes: Sequence[Any], old_index: Sequence[sympy.Expr]) -> TensorValue:
    """A view: element x of the result is element `old_index(x)` of `tv`."""
    mapping = {loop_var(k): e for k, e in enumerate(old_index)}
    return dataclasses.replace(tv, sizes=tuple(map(to_sympy, new_sizes)), expr=ir.subs_index(tv.expr, mapping))


def broadcast_to(tv: TensorValue, sizes: Sequence[sympy.Expr]) -> TensorValue:
    sizes = tuple(map(to_sympy, sizes))
    if tuple(tv.sizes) == sizes:
        return tv
    lead = len(sizes) - tv.ndim
    if lead < 0:
        raise LoweringError(f"cannot broadcast {tv.sizes} to {sizes}")
    idx = []
    for d, s in enumerate(tv.sizes):
        idx.append(sympy.Integer(0) if (s == 1 and sizes[lead + d] != 1) else loop_var(lead + d))
    return reindex(tv, sizes, idx)


def reshape_index(old_sizes: Sequence[sympy.Expr], new_sizes: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Old per-dim indices of a contiguous reshape, in terms of the new loop variables.

    Dims are matched in groups of equal products, so merges and splits need div/mod only where
    a group merges dims; a fully general reshape falls back to the flat index."""
    old, new = list(old_sizes), list(new_sizes)
    if any(s == 0 for s in old + new):
        return [sympy.Integer(0)] * len(old)      # nothing is read from an empty tensor
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj = [i] if i < len(old) else [], [j] if j < len(new) else []
        po = old[i] if i < len(old) else sympy.Integer(1)
        pn = new[j] if j < len(new) else sympy.Integer(1)
        i, j = i + bool(gi), j + bool(gj)
        while po != pn:
            if (po.is_number and pn.is_number and po < pn) or (not (po.is_number and pn.is_number) and i < len(old)
                                                               and (j >= len(new) or len(gi) <= len(gj))):
                if i >= len(old):
                    return _flat_reshape(old, new)
                gi.append(i); po = po * old[i]; i += 1
            else:
                if j >= len(new):
                    return _flat_reshape(old, new)
                gj.append(j); pn = pn * new[j]; j += 1
            if len(gi) + len(gj) > 64:
                return _flat_reshape(old, new)
        groups.append((gi, gj))
    out: list[sympy.Expr] = [sympy.Integer(0)] * len(old)
    for gi, gj in groups:
        flat = sympy.Integer(0)
        for k in gj:
            flat = flat * new[k] + loop_var(k)
        stride = sympy.Integer(1)
        for k in reversed(gi):
            out[k] = modulo(floordiv(flat, stride), old[k]) if k != gi[0] else floordiv(flat, stride)
            stride = stride * old[k]
    return out


def _flat_reshape(old, new):
    flat = sympy.Integer(0)
    for k, s in enumerate(new):
        flat = flat * s + loop_var(k)
    out, stride = [], sympy.Integer(1)
    for s in reversed(old):
        out.append(modulo(floordiv(flat, stride), s))
        stride = stride * s
    return list(reversed(out))


# Ops that cost tens of cycles: a value using them is computed once and stored, not recomputed
# in each consumer.
EXPENSIVE_OPS = frozenset("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh "
                          "acosh atanh erf erfc erfinv lgamma digamma sigmoid pow atan2 hypot".split())
EXPENSIVE_WEIGHT = 8


def cost(e: ScalarExpr) -> int:
    return sum(EXPENSIVE_WEIGHT if x.name in EXPENSIVE_OPS else 1 for x in ir.walk(e) if isinstance(x, Op))


def is_cheap(tv: TensorValue) -> bool:
    return cost(tv.expr) <= REALIZE_OPCOUNT and len(ir.loads_of(tv.expr)) <= 4


def unwrap_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


# ---------------------------------------------------------------------------- the graph driver

def _node_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[torch.fx.Node, Any]:
    """Each node's output value (meta tensors suffice). With symbolic sizes, from `node.meta['val']`
    (only the trace knows the symbols); with static sizes, by running the graph on meta copies of the
    inputs, falling back to `node.meta['val']`, else to running it once on the real inputs."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("output",)]
    # a call recorded with val None (an ATen op an earlier stage left unannotated) does not mean the
    # op returns None: its extern would get no output buffer, so such a record is not trusted
    recorded = all("val" in n.meta and (n.meta["val"] is not None or n.op != "call_function"
                                        or n.target is torch.ops.aten._assert_scalar.default) for n in nodes)
    if recorded and any(_has_symbols(n.meta["val"]) for n in nodes):
        return {n: n.meta["val"] for n in nodes}
    if not recorded and any(_has_symbols(x) for x in example_inputs):
        missing = [n.format_node() for n in nodes if n.meta.get("val") is None and n.op == "call_function"]
        raise NotYetImplemented("kiln codegen: a graph with symbolic sizes needs every node's traced value "
                                f"(meta['val']); these have none: {missing[:3]}")
    # With static sizes the values are recomputed: a recorded value can be stale. aot keeps a fake
    # tensor itself as its node's value, so a later in-place view of it (at::matmul's squeeze_ for
    # vector @ matrix) reshapes an earlier node's value and its extern would get a wrong buffer.

    def to_meta(x):
        # storage offsets kept: an `as_strided` in the graph addresses its input's storage as the
        # trace saw it (see [Note: as_strided positions])
        if isinstance(x, torch.Tensor):
            extent = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) if all(x.shape) else 0
            base = torch.empty(x.storage_offset() + extent, dtype=x.dtype, device="meta")
            return base.as_strided(x.shape, x.stride(), x.storage_offset())
        return x

    class Recorder(torch.fx.Interpreter):
        def __init__(self, module, values, on_meta=False):
            super().__init__(module)
            self.values = values
            self.on_meta = on_meta

        def run_node(self, n):
            out = super().run_node(n)
            self.values[n] = out
            return out

        # on meta, factories (`full(..., device=cpu)`) and constants must be meta too: prims refuse
        # operands on mixed devices
        def call_function(self, target, args, kwargs):
            if self.on_meta and "device" in kwargs:
                kwargs = {**kwargs, "device": torch.device("meta")}
            return super().call_function(target, args, kwargs)

        def get_attr(self, target, args, kwargs):
            value = super().get_attr(target, args, kwargs)
            return to_meta(value) if self.on_meta else value

    values: dict = {}
    try:
        Recorder(gm, values, on_meta=True).run(*[to_meta(x) for x in example_inputs])
        return values
    except Exception:  # an op without a meta kernel: the record, else run for real, once, on copies
        if recorded:
            return {n: n.meta["val"] for n in nodes}
        values = {}
        with torch.no_grad():
            Recorder(gm, values).run(*[x.clone() if isinstance(x, torch.Tensor) else x for x in example_inputs])
        return values


def _has_symbols(value) -> bool:
    """Whether a recorded value (tensor, number or nested tuple of them) has a symbolic size."""
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(leaf, torch.Tensor) and any(isinstance(d, torch.SymInt)
                                                  for d in (*leaf.shape, *leaf.stride())):
            return True
    return False


# [Note: a CUDA program holds everything on its device] Eager lets a CUDA op read a 0-dim CPU
# tensor, and models lean on it: transformers' StaticCache keeps its length as a CPU scalar until
# the prefill moves it, DeBERTa-v2 scales attention by `torch.sqrt(torch.tensor(d))` made on the
# CPU. Kernels of a CUDA program cannot read CPU memory (Triton: "Pointer argument cannot be
# accessed from Triton (cpu tensor?)"; under a CUDA graph, an illegal address). So a program with
# any CUDA tensor computes every value on CUDA: CPU inputs are moved at entry (`Graph.moved_inputs`),
# CPU constants when lowered, CPU factories and externs' `device=` arguments are placed on CUDA,
# and outputs eager returns on the CPU are moved back (`Graph.cpu_outputs`). The copies are of
# scalars in practice: eager allows no bigger CPU operand of a CUDA op.
def program_device(values) -> str:
    """The device a graph's program runs on: an accelerator if any tensor among `values` (a
    pytree) is on one, else the CPU ([Note: a CUDA program holds everything on its device])."""
    for v in torch.utils._pytree.tree_leaves(values):
        if isinstance(v, torch.Tensor) and v.device.type not in ("cpu", "meta"):
            return v.device.type
    return "cpu"


def _is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some permutation of dims has contiguous strides. Not known over
    sizes read from data (`x.view(n.item(), -1)`: is 12 // u0 one?): False, a layout of our own."""
    from kiln.symbolic import DataDependentGuard
    try:
        dims = sorted(range(t.dim()), key=lambda d: (t.stride()[d], t.shape[d]))
        expected = 1
        for d in dims:
            if t.shape[d] != 1 and t.stride()[d] != expected:
                return False
            expected *= t.shape[d]
    except DataDependentGuard:
        return False
    return True


def lower_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                kernel_dtypes: frozenset = KERNEL_DTYPES,
                split_reductions: bool = False) -> tuple[ir.Graph, dict[str, torch.Tensor]]:
    """Lower `gm` to the loop IR; also return the constants (get_attr tensors) by buffer name.
    Ops on dtypes outside `kernel_dtypes` (the target printer's) run as externs; `split_reductions`
    (the target's too) splits reductions with few outputs ([Note: split reductions])."""
    from kiln.codegen import lowering_rules, lowering_scatter  # noqa: F401  (register the rules)
    from kiln.codegen.lowering_reduce import extern_fallback, strided_view

    values = _node_values(gm, example_inputs)
    device = program_device((list(example_inputs), [n.meta.get("val") for n in gm.graph.nodes]))
    ctx = LoweringContext(device, split_reductions, kernel_dtypes)
    from kiln.codegen import check
    track_origins = check.enabled()    # hashing every node's value costs lowering time: only to check
    env: dict[torch.fx.Node, Any] = {}
    inputs: list[str | None] = []
    moved_inputs: list[str] = []      # CPU inputs of a CUDA program: moved at entry
    constants: dict[str, torch.Tensor] = {}
    size_inputs: list[tuple[int, sympy.Symbol]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, example in zip(placeholders, example_inputs):
        if isinstance(example, torch.Tensor):
            buf = ctx.add_buffer(ir.Buffer(f"arg{len(inputs)}", tuple(map(to_sympy, example.shape)),
                                           tuple(map(to_sympy, example.stride())), example.dtype,
                                           example.device.type))
            if buf.device != example.device.type:
                moved_inputs.append(buf.name)
            env[node] = ctx.load_buffer(buf)
            inputs.append(buf.name)
        elif isinstance(example, torch.SymInt) and to_sympy(example).is_Symbol:
            env[node] = to_sympy(example)
            size_inputs.append((len(inputs), env[node]))
            inputs.append(None)
        elif isinstance(example, torch.SymFloat):
            # a float computed from sizes, saved by the forward (var's 2.0 / (s0 - 1.0)): a host
            # value bound to the parameter ([Note: host values] in lowering_reduce.py), never the
            # traced call's number
            from kiln.codegen.lowering_reduce import host_value
            env[node] = host_value(ctx.new_name("val"))
            size_inputs.append((len(inputs), env[node].expr))
            inputs.append(None)
        else:
            env[node] = example
            inputs.append(None)

    def arg(a):
        return torch.fx.node.map_arg(a, lambda n: env[n])

    output_node = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            output_node = node
            break
        if node.op == "get_attr":
            value = getattr(gm, node.target) if "." not in node.target else _get_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                buf = ctx.add_buffer(ir.Buffer(f"const{len(constants)}", tuple(map(to_sympy, value.shape)),
                                               tuple(map(to_sympy, value.stride())), value.dtype,
                                               value.device.type))
                constants[buf.name] = value.to(buf.device)
                env[node] = ctx.load_buffer(buf)
            else:
                env[node] = value
            continue
        if node.op != "call_function":
            raise LoweringError(f"kiln codegen lowers call_function nodes, got {node.op} {node.target}")
        args, kwargs = arg(node.args), arg(node.kwargs)
        if node.target is operator.getitem:
            env[node] = args[0][args[1]]
            continue
        meta = values.get(node)
        ctx.arg_metas = tuple(values.get(a) for a in node.args if isinstance(a, torch.fx.Node))
        origin = node.meta.get("kiln_origin")
        ctx.check_origin = ir.CheckOrigin(*origin) if origin else None
        if node.target in _NUMBER_OPS and type(meta) in (int, float, bool):
            # size arithmetic the trace specialized (`8 * 8` of two sizes guarded static): its
            # number, not an extern run by the host program, whose value no lowering rule sees
            # (an as_strided with such a stride fell back to a copy of its input at the input's
            # offsets: fuzz seed 1001817)
            env[node] = meta
            continue
        if isinstance(meta, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if _reads_data(node) or isinstance(meta, torch.SymFloat):
                # a number read from a tensor (`.item()`): the extern computes it at run time and the
                # host program binds its symbol ([Note: sizes bound by externs] in host.py). A float
                # computed from sizes (var's backward scales by 2.0 / (s0 - 1.0)) is no index
                # expression either: the host program computes it too, a value ([Note: host values])
                env[node] = extern_fallback(ctx, node.target, args, kwargs, meta)
                continue
            # a size computed from the inputs' sizes (`sym_size`, `operator.mul` of sizes): its
            # recorded expression is what consumers index with; the host binds the symbols
            env[node] = _size_expr(node, meta)
            continue
        rule = LOWERINGS.get(op_name(node.target))
        result = None
        if rule is not None and _kernel_dtypes_ok(args, kwargs, meta, kernel_dtypes):
            try:
                result = rule(ctx, meta, **bind_arguments(node.target, args, kwargs))
            except LoweringError:
                result = None
        if result is None:
            result = extern_fallback(ctx, node.target, args, kwargs, meta)
        if isinstance(result, TensorValue) and _should_realize(node, result, device):
            result = ctx.load_buffer(ctx.realize(result))
        env[node] = result
        if track_origins and isinstance(result, TensorValue):   # for `ir.Graph.origins` (KILN_CHECK)
            ctx.node_of.setdefault(result, node.name)
            holder = ctx.buffer_of(result)
            if holder is not None:
                ctx.origins.setdefault(holder.name, node.name)

    computed = len(ctx.nodes)
    outputs = []
    returned_by: dict[str, Any] = {}     # a user output's buffer -> the FX node it returns
    # a forward's outputs past its user outputs are values saved for its backward (aot's partition):
    # those may be the inputs themselves (a weight), never copied
    user_outputs = gm.meta.get("kiln_user_outputs")
    cpu_outputs = []
    for position, (out_node, value) in enumerate(zip(_flat_outputs(output_node.args[0]),
                                                     arg(_flat_outputs(output_node.args[0])))):
        if isinstance(value, TensorValue):
            meta = values.get(out_node) if isinstance(out_node, torch.fx.Node) else None
            example = out_node.meta.get("val") if isinstance(out_node, torch.fx.Node) else None
            if device != "cpu" and isinstance(example, torch.Tensor) and example.device.type == "cpu":
                cpu_outputs.append(position)
            # a strided view of a computed buffer (an extern's result reshaped) returns as a view,
            # not a copy; views of inputs and constants are copied (aot owns input aliasing)
            strides = _dense_strides(meta)
            saved = user_outputs is not None and position >= user_outputs
            view = strided_view(ctx, value) if ctx.buffer_of(value) is None else None
            # ... in the output's own layout: a KV cache filled by `index_copy_` came back as a
            # dim-permuted view of the index_put's result where eager's is contiguous
            if (view is not None and view.name not in inputs and view.name not in constants
                    and (saved or strides is None or _same_layout(view.sizes, view.strides, strides))):
                outputs.append(view)
                continue
            # an output equal to an input (a roll by the whole length, a clone) is a tensor of its own:
            # the input may be mutated after (aot's epilogue) and the caller may write either
            holder = ctx.buffer_of(value)
            fresh = holder is not None and (holder.name in inputs or holder.name in constants) and not saved
            if saved and holder is None and value in ctx.realized_any:   # any layout does for the backward
                outputs.append(ctx.realized_any[value].name)
                continue
            name = ctx.realize(value, strides, fresh=fresh).name
            if not saved and returned_by.setdefault(name, out_node) is not out_node:
                # two outputs eager returns as distinct tensors (a zeros_like and a clone zeroed in
                # place, fuzz seed 5628) share no storage: the caller may write either, and autograd
                # marks one non-differentiable without touching the other
                name = ctx.realize(value, strides, fresh=True).name
                returned_by[name] = out_node
            outputs.append(name)
        else:
            outputs.append(value)
    graph = ir.Graph(tuple(ctx.buffers.values()), tuple(_outputs_where_computed(ctx, computed)),
                     tuple(inputs), tuple(outputs),
                     tuple(size_inputs), tuple(ctx.origins.items()), tuple(moved_inputs), tuple(cpu_outputs))
    return graph, constants


def _outputs_where_computed(ctx: LoweringContext, computed: int) -> list:
    """[Note: outputs realized where they are computed] A returned value that no node stored is
    stored by a node the output loop adds after the last one: T5's forward computed each layer's
    saved softmax output there, holding every layer's fp32 attention scores until its end (384 MB
    at the forward's peak, which set its training peak). Such a node moves up to just after the
    last node making what it reads, when it is no bigger than what it reads (those may die there);
    a bigger one (a gradient cast up to float32 from a bfloat16 matmul's result) stays at the end,
    the smaller values it reads held instead."""
    nodes = list(ctx.nodes[:computed])
    made_at = {b: i for i, n in enumerate(nodes) for b in (n.outputs if isinstance(n, ir.ExternKernel) else (n.buffer,))}
    made_late = {b for n in ctx.nodes[computed:] for b in (n.outputs if isinstance(n, ir.ExternKernel) else (n.buffer,))}
    moved: list[tuple[int, Any]] = []
    late = []
    for n in ctx.nodes[computed:]:
        reads = ({ld.buffer for ld in ir.loads_of(n.body.expr)}
                 if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Pointwise) else None)
        if not reads or not reads <= ctx.buffers.keys() or reads & made_late:
            late.append(n)
            continue
        held = sum((ctx.buffers[b].numel * ctx.buffers[b].dtype.itemsize for b in reads), sympy.Integer(0))
        out = ctx.buffers[n.buffer]
        if not sympy.sympify(out.numel * out.dtype.itemsize - held).is_nonpositive:
            late.append(n)
            continue
        at = max((made_at.get(b, -1) for b in reads), default=-1) + 1
        if at == 0:          # it reads only inputs (a weight's cast): nothing it reads dies earlier
            late.append(n)
            continue
        moved.append((at, n))
    for at, n in sorted(moved, key=lambda m: m[0], reverse=True):   # later positions first: indices hold
        nodes.insert(at, n)
    return nodes + late


def _same_layout(sizes, strides, wanted) -> bool:
    """Whether `strides` over `sizes` are `wanted` (dims of size 1 take any stride)."""
    return all(n == 1 or sympy.expand(to_sympy(a) - to_sympy(b)) == 0 for n, a, b in zip(sizes, strides, wanted))


def _dense_strides(meta) -> tuple | None:
    """An output's strides: its example's when dense, else the printer's choice (None)."""
    return meta.stride() if isinstance(meta, torch.Tensor) and _is_dense(meta) else None


_NUMBER_OPS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
                         operator.mod, operator.pow, operator.neg, max, min})


def _reads_data(node: torch.fx.Node) -> bool:
    """Whether a node with a SymInt value reads it from a tensor's data (`_local_scalar_dense`:
    an op with a data-dependent fake rule), rather than computing it from sizes."""
    from kiln.symbolic.data_dependent import RULES
    return isinstance(node.target, torch._ops.OpOverload) and node.target in RULES


def _size_expr(node: torch.fx.Node, value) -> sympy.Expr:
    if not isinstance(value, (torch.SymInt, torch.SymBool)):   # a SymBool: a run-time check's condition
        raise NotYetImplemented(f"kiln codegen: {node.format_node()} computes a symbolic "
                                f"{type(value).__name__}; only integer sizes lower to index expressions")
    return to_sympy(value)


def _get_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _flat_outputs(out) -> list:
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def _kernel_dtypes_ok(args, kwargs, meta, kernel_dtypes: frozenset) -> bool:
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    if any(isinstance(v, ir.SizeArg) for v in leaves):  # a value an extern returns at run time
        return False
    tensors = [v for v in leaves if isinstance(v, TensorValue)]
    metas = [v for v in torch.utils._pytree.tree_leaves(meta) if isinstance(v, torch.Tensor)]
    return all(t.dtype in kernel_dtypes for t in tensors) and all(m.dtype in kernel_dtypes for m in metas)


def _should_realize(node: torch.fx.Node, tv: TensorValue, device: str = "cpu") -> bool:
    users = len(node.users)
    if users <= 1 or isinstance(tv.expr, (Load, Constant)) and not getattr(tv.expr, "indirect", ()):
        return False
    if device == "cpu" and any(isinstance(x, Op) and x.name in EXPENSIVE_OPS for x in ir.walk(tv.expr)):
        # a CPU core computes a float exp in about the time it stores and reloads it (a GPU
        # recomputes it for free): softmax's exp is computed once, and kept in its output's
        # buffer between the sum and the normalization (scheduler [Note: inner values ...])
        return True
    return not is_cheap(tv) or (users >= REALIZE_USERS and ir.op_count(tv.expr) > 2)
