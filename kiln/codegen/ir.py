"""The loop IR: what lowering produces, what the scheduler fuses, what every printer reads.

Everything here is a plain frozen dataclass: no closures, no strings of code. Each prints
(`str(node)`) and is compared and hashed by value, so passes are tested without running anything.

Vocabulary
----------
- Index expressions are sympy expressions over *loop variables* and *size symbols*:
  `x0, x1, ...` iterate a node's (or a kernel's) `ranges`; `r0, r1, ...` iterate `reduction_ranges`
  (or a scan's axis); any other free symbol (`s0`, `s1`, ...) is a symbolic size, passed to kernels
  as an int64 argument, so one kernel serves every size of a dynamic dim. `loop_var`/`reduction_var`
  make the variables; `is_loop_var` tells them from sizes.
- A `Buffer` is a named strided allocation (sizes, strides, offset, dtype, device). `Buffer.index`
  turns per-dim indices into the flat element offset that `Load`/`Store` carry.
- Scalar expressions (`ScalarExpr`): `Load`, `Constant`, `IndexValue` (an index expression used as
  a number: iota, masks), `Op` (a scalar op from the closed set `SCALAR_OPS`, keyed by name) and
  `Var` (a value local to one kernel: an assigned temporary, a finished reduction, a running scan).
  A `Load` may index indirectly (gather, embedding): its `indirect` pairs bind symbols `t0, t1, ...`
  that occur in `index` to scalar expressions computed first (already cast to int64, wrapped);
  its `bounds` pair each symbol with the size of the dim it indexes, for the symbols that may
  fall outside it (an index from the program's inputs; lowering leaves out the ones it proves in
  range), and its `origin` (a `CheckOrigin`) names the user's op and line an error blames.
  [Note: index bounds checks]

Graph-level nodes (lowering's output, the scheduler's input)
------------------------------------------------------------
- `Pointwise(ranges, expr)`: element `x` of the output is `expr` at `x0..x{n-1}`.
- `Reduction(ranges, reduction_ranges, op, expr)`: element `x` reduces `expr` over `r...` with
  `op` in `REDUCTION_OPS` (sum, prod, max, min, any, argmax, argmin, welford_mean, welford_m2:
  the latter two are the two halves of one Welford pass; printers compute them together when both
  reduce the same `expr`).
- `Scan(ranges, scan_range, op, expr)`: the output has dims `ranges + (scan_range,)` in that order
  (`r0` walks the scan axis); `op` in `SCAN_OPS` (inclusive).
- `Scatter(ranges, into, index, indirect, bounds, expr, accumulate, origin)`: element `x` of `expr` is
  written (or, `accumulate`, atomically added) at the flat offset `index` of the buffer named
  `into`, whose indirect symbols `t0, t1, ...` `indirect` binds as a `Load`'s does (the values
  of an index tensor, wrapped, cast to int64); `bounds` pairs each with the size of the dim it
  indexes, and an index outside `[0, size)` is an error ([Note: index bounds checks]). Only the indexed elements change:
  `into` holds every other element already (an input written in place, or a copy of the
  operand made for the write). [Note: scatters write in place]
- `ComputedBuffer(buffer, body)`: fills `buffer` from a `Pointwise`/`Reduction`/`Scan`; element at
  loop index `x` (and `r0` for scans) is stored at `buffer.index(x...)`. With a `Scatter` body,
  `buffer` names `into` after the write: the same storage and layout (the host binds it to
  `into`), so readers of the written value depend on the write by name, as on any producer.
- `ExternKernel(buffer, op, args, kwargs)`: an ATen (or any eager) call on whole tensors (mm, conv,
  sdpa, sort, or a node no printer handles). Args are `BufferArg`, `ViewArg` (a strided view of a
  buffer, so a transposed weight reaches mm without a copy), `SizeArg` or plain constants.
- `MatmulTemplate(buffer, body, product)`: a matrix product computed by a kernel of kiln's own
  (a tiled template, max-autotune's alternative to the extern): `product` names the operands
  (`ViewArg`s of `[.., M, K]` and `[.., K, N]`) and how to tile them; `body` is a `Pointwise` over
  the result's sizes whose expression reads the float32 sum over K as `Var(ACCUMULATOR)` (rounded
  to the result's dtype, or a bias added first, as addmm rounds once). The scheduler treats it as a
  pointwise producer whose consumers may join its kernel as an epilogue.
  Its `product` may be a `ConvProduct` instead: a 2-D convolution computed as an implicit GEMM
  ([Note: convolution templates] in kiln/codegen/conv_templates.py), `body` a `Pointwise` over the
  convolution's `[N, Cout, Hout, Wout]` result reading its float32 sum as `Var(ACCUMULATOR)`.
- `SiblingGemvTemplate(members, product)`: products of one A (decoding's q/k/v, or gate/up) computed
  by one GEMV template kernel ([Note: sibling GEMVs] in matmul_templates.py): each member a
  `ComputedBuffer` whose pointwise body reads its own sum over K as
  `Var(SiblingGemvs.accumulator(j))`; `product` (a `SiblingGemvs`) names A, each member's B and
  the tiling. The scheduler places the members as pointwise nodes of one group.
- `AttentionTemplate(buffer, query, mask, product)`: a decoding step's attention (`Lq <= 4` query
  rows) computed by a kernel of kiln's own instead of an SDPA extern, one program a (batch, query
  head): `query` is the value of q at `(x0, x1, x2, x3) = (b, h, i, d)` and `mask` (or None) the
  additive float mask at `(b, h, i, n)` (`x3` a key's position), each an expression
  (a load of the operand, or its pointwise producer inlined: a prologue); `product` (an
  `AttentionProduct`) names the keys and values as strided views of the buffers read (a grouped
  query's kv head is `h // group`) and the scale. [Note: decode attention] in
  kiln/codegen/attention_templates.py.
- `Graph`: the lowered program: buffers, nodes in execution order, inputs, outputs.

Kernel-level IR (the scheduler's output, a printer's input)
-----------------------------------------------------------
A `Kernel` is one fused loop nest: an outer loop over `ranges` (`x...`), and in its body a sequence
of `Stage`s run in order for each outer index. A stage with `reduction_ranges == ()` runs its body
once per outer index; otherwise it loops `r...` over them. Statements:
- `Assign(name, expr)`: a local value, readable as `Var(name)` later in the same stage iteration.
- `Store(buffer, index, expr, indirect, bounds, accumulate, origin)`: write memory; a scatter's
  store binds indirect symbols in `index` as a `Load` does, checks them against `bounds` as a
  `Load` does, and adds atomically where `accumulate`.
- `Accumulate(name, op, expr)`: fold `expr` into accumulator `name` (a reduction op); after the
  stage, `Var(name)` holds the result for this outer index. argmax/argmin track the flat `r` index.
- `ScanAccumulate(name, op, expr)`: running inclusive scan; `Var(name)` is the value so far, inside
  the same stage iteration. A stage holding one must run its inner loop in order.
`Kernel.buffer_args` lists the buffers it touches (in argument order), `Kernel.size_args` the size
symbols; callers pass tensors then ints in that order. A kernel with a `template` (a
`MatmulProduct`) is a template kernel: its one stage runs once per element of the product's result
(`ranges`), after the product's sum over K, which the stage reads as `Var(ACCUMULATOR)`; a printer
tiles it as the template says, or refuses it. A kernel whose `template` is a `SiblingGemvs` has
one stage per segment of it (members of one N), stage i over segment i's `[M, N_i]`. A kernel
whose template is an `AttentionProduct` is an attention template's: its one stage holds `Assign(QUERY, ...)`, optionally `Assign(MASK,
...)` and the `Store` of the output reading the normalized float32 sum as `Var(ACCUMULATOR)`; the
printer places them (q before the walk over the keys, the mask inside it, the store after it).
A GEMV template whose product has `prologue` set computes A instead of loading it: its stages
begin with stages over K (`Kernel.prologue`: the row statistics, then `Assign(a.name)`, A's
element at (row x0, k r0)), before the stages above ([Note: norm prologues] in prologues.py).

The printer interface (C++ here, Triton in `kiln.codegen.triton`)
-----------------------------------------------------------------
A printer module exposes
    print_kernel(kernel: Kernel, buffers: Mapping[str, Buffer]) -> str      # source text
    build(kernels: Sequence[Kernel], buffers: Mapping[str, Buffer]) -> dict[str, Callable]
    saved(kernels, buffers, hints=None) -> dict; restore(entry: dict) -> dict[str, Callable]
where each callable runs one kernel: `fn(*tensors_for(kernel.buffer_args), *ints_for(kernel.size_args))`.
The host program (`kiln.codegen.host`) only needs `build`; `saved` is `build` split in two at what
the warm-start cache keeps (JSON data), and `hints` (size symbol name -> its value in the call being
compiled) lets a printer compile for that call's sizes ahead of it.

Change log (keep this stable; note every change here)
- v1: first version.
- v2: `ViewArg` (extern arguments may be strided views of buffers; so may `Graph.outputs`).
- v3: `Graph.size_inputs`: graph inputs that are symbolic ints, each bound to its size symbol.
- v4: `Graph.origins` (which graph node's value a buffer holds, for `kiln.codegen.check`);
  `canonical_kernel`: a kernel with positional buffer names, so equal loop nests print equal text.
- v5: `saved` / `restore` listed, and `saved`'s `hints`.
- v6: `MatmulTemplate` (graph node), `MatmulProduct` / `MatmulConfig` and `Kernel.template`.
- v7: `Scatter` (a body writing into an existing buffer at loaded indices); `Store.indirect`,
  `Store.bounds`, `Store.accumulate`; `body_exprs` / `map_body` / `stmt_exprs` / `map_stmt`.
- v8: `Load.bounds`; an indirect index outside its bounds is an error, not a masked write
  (`index_checks`, [Note: index bounds checks]).
- v9: `CheckOrigin` on `Load`, `Store`, `Scatter` and `ExternKernel` (`origin`): the user's op and
  line a failed bounds check names; `index_checks` entries are `IndexCheck`s.
- v10: `MatmulConfig.form`: "dot" (tiles of `tl.dot`) or "gemv" (a product of a few rows: each
  program a block of columns over all of K, multiplies and row sums).
- v11: `SiblingGemvs` (a `Kernel.template` computing several products of one A) and
  `SiblingGemvTemplate` (its graph node); `MatmulProduct.operands` / `.sums` / `.renamed`.
- v12: `AttentionTemplate` (decoding's attention as a kernel of kiln's: [Note: decode attention]),
  its `AttentionProduct` as a `Kernel.template`, and `AttentionConfig`.
- v13: `MatmulProduct.prologue` / `SiblingGemvs.prologue` and `Kernel.prologue` / `.epilogue`: a
  GEMV template computing its A from A's producer ([Note: norm prologues]).
- v14: `ConvProduct`: a `MatmulTemplate`'s (and a `Kernel.template`'s) product may be a 2-D
  convolution as an implicit GEMM ([Note: convolution templates]).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Sequence, Union

import sympy
import torch

IR_VERSION = 11


# ---------------------------------------------------------------------------- index variables

@functools.lru_cache(maxsize=None)      # sympy re-checks the assumptions each call
def loop_var(k: int) -> sympy.Symbol:
    """The k-th outer loop variable `xk` (integer, non-negative)."""
    return sympy.Symbol(f"x{k}", integer=True, nonnegative=True)


@functools.lru_cache(maxsize=None)
def reduction_var(k: int) -> sympy.Symbol:
    """The k-th inner (reduction or scan) loop variable `rk`."""
    return sympy.Symbol(f"r{k}", integer=True, nonnegative=True)


@functools.lru_cache(maxsize=None)
def indirect_var(k: int) -> sympy.Symbol:
    """The k-th indirect-index symbol `tk`, bound by a `Load.indirect` pair."""
    return sympy.Symbol(f"t{k}", integer=True)


def size_var(name: str) -> sympy.Symbol:
    """A symbolic size (a dynamic dim), positive."""
    return sympy.Symbol(name, integer=True, positive=True)


def is_loop_var(sym: sympy.Symbol) -> bool:
    return sym.name[:1] in ("x", "r", "t") and sym.name[1:].isdigit()


def as_expr(value: Any) -> sympy.Expr:
    return sympy.sympify(value) if not isinstance(value, sympy.Basic) else value


def product(values: Sequence[Any]) -> sympy.Expr:
    out = sympy.Integer(1)
    for v in values:
        out = out * as_expr(v)
    return out


def contiguous_strides(sizes: Sequence[Any]) -> tuple[sympy.Expr, ...]:
    strides, running = [], sympy.Integer(1)
    for s in reversed(sizes):
        strides.append(running)
        running = running * as_expr(s)
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------- buffers

@dataclass(frozen=True)
class Buffer:
    """A named strided allocation; `index` maps per-dim indices to the flat element offset."""

    name: str
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    device: str = "cpu"
    offset: sympy.Expr = sympy.Integer(0)

    def index(self, indices: Sequence[Any]) -> sympy.Expr:
        assert len(indices) == len(self.strides), (self.name, indices, self.strides)
        out = as_expr(self.offset)
        for i, s in zip(indices, self.strides):
            out = out + as_expr(i) * as_expr(s)
        return out

    @property
    def numel(self) -> sympy.Expr:
        return product(self.sizes)

    def __str__(self):
        sizes = ", ".join(map(str, self.sizes))
        strides = ", ".join(map(str, self.strides))
        off = f", offset={self.offset}" if self.offset != 0 else ""
        return f"{self.name}: {str(self.dtype).replace('torch.', '')}[{sizes}] strides=({strides}){off} on {self.device}"


# ---------------------------------------------------------------------------- scalar expressions

@dataclass(frozen=True)
class ScalarOpInfo:
    arity: int
    doc: str


def _ops(arity: int, names: str, doc: str) -> dict[str, ScalarOpInfo]:
    return {n: ScalarOpInfo(arity, doc) for n in names.split()}


# The closed set of scalar ops. `Op.dtype` is the result dtype; arguments arrive already promoted
# (lowering inserts `to_dtype`), except comparisons/logicals (bool result) and `where`.
SCALAR_OPS: dict[str, ScalarOpInfo] = {
    **_ops(1, "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan "
              "sinh cosh tanh asinh acosh atanh erf erfc erfinv lgamma digamma sigmoid reciprocal floor ceil "
              "round trunc sign signbit isnan isinf isfinite logical_not bitwise_not relu frac",
           "elementwise math on one value"),
    **_ops(1, "to_dtype", "convert the argument to Op.dtype (C semantics for float->int: truncate)"),
    **_ops(1, "bitcast", "reinterpret the bits of the argument as Op.dtype (same width)"),
    **_ops(2, "add sub mul truediv floordiv remainder fmod pow atan2 maximum minimum hypot copysign "
              "nextafter bitwise_and bitwise_or bitwise_xor left_shift right_shift",
           "binary arithmetic (floordiv/remainder: Python semantics, rounding toward -inf)"),
    **_ops(2, "eq ne lt le gt ge logical_and logical_or logical_xor", "comparison / logic, bool result"),
    **_ops(3, "where", "where(cond, a, b)"),
    **_ops(2, "rand randn", "philox random from (seed: int64, offset: int64): uniform [0,1) / normal"),
}

REDUCTION_OPS = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin", "welford_mean", "welford_m2")
SCAN_OPS = ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")


@dataclass(frozen=True)
class CheckOrigin:
    """Whose index a bounds check guards: the user's op as ATen names it ("index_select",
    "embedding", "index_put_" for `x[i] = v`) and "file:line in function" of its call, or ""
    ([Note: an op's origin] in kiln/aot/trace.py). A failed check's error names it ([Note: index
    bounds checks] in lowering_reduce): the C++ host program raises it, a Triton kernel's
    `tl.device_assert` carries it as its message."""
    op: str = ""
    where: str = ""


@dataclass(frozen=True)
class Load:
    buffer: str
    index: sympy.Expr
    dtype: torch.dtype
    indirect: tuple[tuple[sympy.Symbol, "ScalarExpr"], ...] = ()
    bounds: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()
    origin: CheckOrigin | None = None        # with `bounds`: whose index they check

    def __str__(self):
        ind = "".join(f", {s}={e}" for s, e in self.indirect)
        ind += "".join(f", 0<={s}<{n}" for s, n in self.bounds)
        return f"load({self.buffer}, {self.index}{ind})"


@dataclass(frozen=True)
class Constant:
    value: Union[int, float, bool]
    dtype: torch.dtype

    def __str__(self):
        return repr(self.value)


@dataclass(frozen=True)
class IndexValue:
    """An index expression used as a number (iota, masks, position ids)."""

    index: sympy.Expr
    dtype: torch.dtype = torch.int64

    def __str__(self):
        return f"index({self.index})"


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple["ScalarExpr", ...]
    dtype: torch.dtype

    def __post_init__(self):
        info = SCALAR_OPS.get(self.name)
        if info is None:
            raise ValueError(f"unknown scalar op {self.name!r}; the closed set is kiln.codegen.ir.SCALAR_OPS")
        if len(self.args) != info.arity:
            raise ValueError(f"scalar op {self.name} takes {info.arity} arguments, got {len(self.args)}")

    def __str__(self):
        suffix = f"[{str(self.dtype).replace('torch.', '')}]" if self.name in ("to_dtype", "bitcast") else ""
        return f"{self.name}{suffix}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class Var:
    """A value local to one kernel: an `Assign`ed temporary, a finished reduction, a running scan."""

    name: str
    dtype: torch.dtype

    def __str__(self):
        return self.name


ScalarExpr = Union[Load, Constant, IndexValue, Op, Var]


def expr_dtype(e: ScalarExpr) -> torch.dtype:
    return e.dtype


def children(e: ScalarExpr) -> tuple:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Load):
        return tuple(x for _, x in e.indirect)
    return ()


def walk(e: ScalarExpr):
    """Every sub-expression of `e`, `e` first."""
    stack = [e]
    while stack:
        cur = stack.pop()
        yield cur
        stack.extend(children(cur))


def loads_of(e: ScalarExpr) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load)]


def map_expr(e: ScalarExpr, fn) -> ScalarExpr:
    """Rebuild `e` bottom-up, applying `fn` to each rebuilt node (fn returns the node or a replacement)."""
    if isinstance(e, Op):
        e = dataclasses.replace(e, args=tuple(map_expr(a, fn) for a in e.args))
    elif isinstance(e, Load) and e.indirect:
        e = dataclasses.replace(e, indirect=tuple((s, map_expr(x, fn)) for s, x in e.indirect))
    return fn(e)


def subs_index(e: ScalarExpr, mapping: dict) -> ScalarExpr:
    """Substitute index symbols in every index expression inside `e`."""
    if not mapping:
        return e
    mapping_key = frozenset(mapping.items())

    def replaced(index):                           # [Note: index memo] in kiln/codegen/indexing.py
        key = (index, mapping_key)
        done = _SUBSTITUTED.get(key)
        if done is None:
            if len(_SUBSTITUTED) >= 200_000:
                _SUBSTITUTED.clear()
            done = _SUBSTITUTED[key] = sympy.sympify(index).xreplace(mapping)
        return done

    def fn(node):
        if isinstance(node, (Load, IndexValue)):
            return dataclasses.replace(node, index=replaced(node.index))
        return node
    return map_expr(e, fn)


_SUBSTITUTED: dict = {}


def op_count(e: ScalarExpr) -> int:
    return sum(1 for x in walk(e) if isinstance(x, Op))


# ---------------------------------------------------------------------------- graph-level nodes

def _fmt_ranges(ranges) -> str:
    return "[" + ", ".join(map(str, ranges)) + "]"


@dataclass(frozen=True)
class Pointwise:
    ranges: tuple[sympy.Expr, ...]
    expr: ScalarExpr

    def __str__(self):
        return f"pointwise{_fmt_ranges(self.ranges)}: {self.expr}"


@dataclass(frozen=True)
class Reduction:
    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    op: str
    expr: ScalarExpr

    def __post_init__(self):
        if self.op not in REDUCTION_OPS:
            raise ValueError(f"unknown reduction {self.op!r}; kiln reduces with {REDUCTION_OPS}")

    def __str__(self):
        return (f"reduction{_fmt_ranges(self.ranges)} over {_fmt_ranges(self.reduction_ranges)} "
                f"{self.op}: {self.expr}")


@dataclass(frozen=True)
class Scan:
    ranges: tuple[sympy.Expr, ...]
    scan_range: sympy.Expr
    op: str
    expr: ScalarExpr

    def __post_init__(self):
        if self.op not in SCAN_OPS:
            raise ValueError(f"unknown scan {self.op!r}; kiln scans with {SCAN_OPS}")

    def __str__(self):
        return f"scan{_fmt_ranges(self.ranges)} along [{self.scan_range}] {self.op}: {self.expr}"


# [Note: scatters write in place] The loop IR is otherwise functional: each buffer is written by one
# node, once. A scatter (index_put / index_copy with tensor indices: a static KV cache's write at
# `cache_position`) changes a few elements of a buffer that exists already, so it writes that
# buffer's storage (`into`) and names the result as a buffer of its own that shares it: a copy of
# the whole buffer per write (2 GB of a KV cache to write one token) is what this avoids.
# Lowering makes `into` either a graph input aot writes back (`index_put_`, [Note: writes into
# inputs in place]) or a fresh copy of the operand that nothing else reads; the scheduler never
# puts a scatter in the kernel that computes `into`, nor a reader of its result in its own kernel.
@dataclass(frozen=True)
class Scatter:
    ranges: tuple[sympy.Expr, ...]
    into: str
    index: sympy.Expr
    indirect: tuple[tuple[sympy.Symbol, "ScalarExpr"], ...]
    bounds: tuple[tuple[sympy.Symbol, sympy.Expr], ...]
    expr: ScalarExpr
    accumulate: bool = False
    origin: CheckOrigin | None = None

    def __str__(self):
        ind = "".join(f", {s}={e}" for s, e in self.indirect)
        ind += "".join(f", 0<={s}<{n}" for s, n in self.bounds)
        how = "add" if self.accumulate else "store"
        return f"scatter{_fmt_ranges(self.ranges)} into {self.into}[{self.index}{ind}] {how}: {self.expr}"


Body = Union[Pointwise, Reduction, Scan, Scatter]


def body_exprs(body) -> tuple:
    """Every scalar expression a body evaluates: its value, and a scatter's index values."""
    return (body.expr, *(x for _, x in getattr(body, "indirect", ())))


def body_loads(body) -> list[Load]:
    return [ld for e in body_exprs(body) for ld in loads_of(e)]


def map_body(body, fn):
    """`body` with `map_expr(e, fn)` applied to each expression `body_exprs` lists."""
    if isinstance(body, Scatter):
        return dataclasses.replace(body, expr=map_expr(body.expr, fn),
                                   indirect=tuple((s, map_expr(x, fn)) for s, x in body.indirect))
    return dataclasses.replace(body, expr=map_expr(body.expr, fn))


@dataclass(frozen=True)
class ComputedBuffer:
    buffer: str
    body: Body

    def __str__(self):
        return f"{self.buffer} = {self.body}"


@dataclass(frozen=True)
class BufferArg:
    name: str

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class ViewArg:
    """`buffer` seen through (sizes, strides, offset) in elements, relative to the buffer's start."""

    name: str
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    offset: sympy.Expr = sympy.Integer(0)

    def __str__(self):
        return f"view({self.name}, {list(self.sizes)}, {list(self.strides)}, {self.offset})"


@dataclass(frozen=True)
class SizeArg:
    expr: sympy.Expr

    def __str__(self):
        return f"size({self.expr})"


@dataclass(frozen=True)
class ExternKernel:
    """`buffers = op(*args, **kwargs)` on whole tensors. `args` nest tuples/lists of BufferArg,
    SizeArg and constants; `outputs` names one buffer per tensor the call returns (a flat tuple),
    `None` where the result is not used."""

    outputs: tuple[str | None, ...]
    op: Any
    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()
    # an indexing extern's (scatter, scatter_reduce, ...): the user's op and line, which the host
    # program adds as a note to the error ATen raises for an index out of range
    origin: CheckOrigin | None = None

    def __str__(self):
        kw = "".join(f", {k}={v}" for k, v in self.kwargs)
        args = ", ".join(map(str, self.args))
        return f"{', '.join(map(str, self.outputs))} = extern {self.op}({args}{kw})"


# The name under which a matmul template's body reads the product's float32 sum over K.
ACCUMULATOR = "acc"


@dataclass(frozen=True)
class MatmulConfig:
    """How a template tiles a product: a `BLOCK_M x BLOCK_N` tile of the result a program, K walked
    `BLOCK_K` at a time, programs ordered `GROUP_M` row tiles at a time (neighbouring programs then
    share tiles of both operands in cache), and the launch's warps and software-pipeline stages.
    `form`: "dot", tiles multiplied by the tensor cores; or "gemv", for a product of a few rows
    (decoding's): `BLOCK_M` covers every row, each program a block of `BLOCK_N` columns over all
    of K, as multiplies and row sums in float32, so B (the weight) is read once
    ([Note: the GEMV form] in kiln/codegen/triton/matmul.py)."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 2
    form: str = "dot"

    def __post_init__(self):
        if self.form not in ("dot", "gemv"):
            raise ValueError(f"matmul form {self.form!r}; kiln's templates are 'dot' or 'gemv'")

    def __str__(self):
        return (("gemv " if self.form == "gemv" else "")
                + f"BLOCK_M={self.BLOCK_M} BLOCK_N={self.BLOCK_N} BLOCK_K={self.BLOCK_K} GROUP_M={self.GROUP_M} "
                f"warps={self.num_warps} stages={self.num_stages}")


class _ProductOfTwo:
    """What a template's product of two operands `a` and `b` (a matrix product, a convolution) has
    besides its fields: one float32 sum, and its operands renamed with the kernel's buffers."""

    @property
    def sums(self) -> tuple[str, ...]:
        """The names under which a kernel's stage reads the sums over K."""
        return (ACCUMULATOR,)

    def renamed(self, names: dict[str, str]):
        return dataclasses.replace(self, a=dataclasses.replace(self.a, name=names[self.a.name]),
                                   b=dataclasses.replace(self.b, name=names[self.b.name]))


@dataclass(frozen=True)
class MatmulProduct(_ProductOfTwo):
    """`sum_k a[.., m, k] * b[.., k, n]` in float32: `a` is `[.., M, K]`, `b` is `[.., K, N]` (the same
    leading batch dim, or none), each any strided view of a buffer. `precision`: "ieee" (every
    float32 product exact, as eager's float32 matmul) or "tf32" (eager's under `allow_tf32`).
    `prologue`: A is not loaded but computed by the kernel's prologue (`Kernel.prologue`)."""

    a: ViewArg
    b: ViewArg
    precision: str
    config: MatmulConfig
    prologue: bool = False

    def __post_init__(self):
        if self.precision not in ("ieee", "tf32"):
            raise ValueError(f"matmul precision {self.precision!r}; kiln's templates compute 'ieee' or 'tf32'")

    @property
    def k(self) -> sympy.Expr:
        return as_expr(self.a.sizes[-1])

    @property
    def operands(self) -> tuple[ViewArg, ...]:
        return (self.b,) if self.prologue else (self.a, self.b)

    def __str__(self):
        a = f"{self.a} from the prologue" if self.prologue else str(self.a)
        return f"matmul({a}, {self.b}, {self.precision}, {self.config})"


@dataclass(frozen=True)
class ConvProduct(_ProductOfTwo):
    """A 2-D convolution (groups 1, not transposed, dilation 1) as a sum over K in float32: `a` is the
    image `[N, Cin, H, W]`, `b` the weight `[Cout, Cin, KH, KW]`, each any strided view of a buffer
    (NCHW or channels-last alike); element `(n, co, ho, wo)` of the result is
    `sum_{ci, i, j} a[n, ci, ho*stride_h - pad_h + i, wo*stride_w - pad_w + j] * b[co, ci, i, j]`,
    an image element outside `[0, H) x [0, W)` counting as 0. As a GEMM: M = N*Hout*Wout rows,
    Cout columns, K = Cin*KH*KW ([Note: convolution templates] in kiln/codegen/conv_templates.py).
    `precision` and `config` as `MatmulProduct`'s."""

    a: ViewArg
    b: ViewArg
    stride: tuple[int, int]
    padding: tuple[int, int]
    precision: str
    config: MatmulConfig
    prologue: bool = False          # never set: a convolution's image is loaded

    def __post_init__(self):
        if self.precision not in ("ieee", "tf32"):
            raise ValueError(f"convolution precision {self.precision!r}; kiln's templates compute 'ieee' or 'tf32'")
        if self.config.form != "dot":
            raise ValueError(f"a convolution template tiles tl.dot products, not the {self.config.form!r} form")

    @property
    def k(self) -> sympy.Expr:
        cin, kh, kw = (as_expr(s) for s in self.b.sizes[1:])
        return cin * kh * kw

    @property
    def operands(self) -> tuple[ViewArg, ...]:
        return (self.a, self.b)

    def __str__(self):
        return (f"conv2d({self.a}, {self.b}, stride={list(self.stride)}, padding={list(self.padding)}, "
                f"{self.precision}, {self.config})")


@dataclass(frozen=True)
class SiblingGemvs:
    """Products that read the same A (`[M, K]`, a few rows), computed by one GEMV kernel ([Note: sibling
    GEMVs] in kiln/codegen/matmul_templates.py): member j's B is `bs[j]` (`[K, N_j]`, contiguous along
    K) and its body reads its float32 sum over K as `Var(accumulator(j))`. `segments` groups the
    members by N, in order: a program works on `BLOCK_N` columns of one segment and computes every
    member of that segment over them (A's slice loaded once a K step for all); the kernel's programs
    are the segments' column blocks, stacked. `prologue`: as `MatmulProduct`'s."""

    a: ViewArg
    bs: tuple[ViewArg, ...]
    segments: tuple[tuple[int, ...], ...]
    precision: str
    config: MatmulConfig
    prologue: bool = False

    def __post_init__(self):
        if self.config.form != "gemv":
            raise ValueError(f"sibling products are computed in the GEMV form, not {self.config.form!r}")
        if sorted(j for seg in self.segments for j in seg) != list(range(len(self.bs))):
            raise ValueError(f"segments {self.segments} must hold each of the {len(self.bs)} members once")

    @staticmethod
    def accumulator(j: int) -> str:
        return f"{ACCUMULATOR}{j}"

    @property
    def k(self) -> sympy.Expr:
        return as_expr(self.a.sizes[-1])

    def n(self, segment: int) -> int:
        return int(self.bs[self.segments[segment][0]].sizes[-1])

    @property
    def operands(self) -> tuple[ViewArg, ...]:
        return self.bs if self.prologue else (self.a, *self.bs)

    @property
    def sums(self) -> tuple[str, ...]:
        return tuple(self.accumulator(j) for j in range(len(self.bs)))

    def renamed(self, names: dict[str, str]) -> "SiblingGemvs":
        return dataclasses.replace(self, a=dataclasses.replace(self.a, name=names[self.a.name]),
                                   bs=tuple(dataclasses.replace(b, name=names[b.name]) for b in self.bs))

    def __str__(self):
        members = ", ".join(f"{self.accumulator(j)}: {b}" for j, b in enumerate(self.bs))
        a = f"{self.a} from the prologue" if self.prologue else str(self.a)
        return f"sibling gemvs({a}; {members}; segments {list(map(list, self.segments))}, " \
               f"{self.precision}, {self.config})"


@dataclass(frozen=True)
class MatmulTemplate:
    """`buffer = body` where `body.expr` reads `product`'s sum over K as `Var(ACCUMULATOR)`."""

    buffer: str
    body: Pointwise
    product: MatmulProduct | ConvProduct

    def __str__(self):
        return f"{self.buffer} = {self.body} with {ACCUMULATOR} = {self.product}"


@dataclass(frozen=True)
class SiblingGemvTemplate:
    """Products of one A as one template kernel: member j fills its buffer from its pointwise body,
    which reads its sum over K as `Var(product.accumulator(j))`."""

    members: tuple[ComputedBuffer, ...]
    product: SiblingGemvs

    def __str__(self):
        return "\n  ".join([f"siblings with {self.product}:"] + [f"  {m}" for m in self.members])


# [Note: decode attention] in kiln/codegen/attention_templates.py
QUERY = "query"      # the name under which an attention template's stage gives q's value
MASK = "mask"        # ... and its mask's


@dataclass(frozen=True)
class AttentionConfig:
    """How the attention template walks the keys: `BLOCK_N` keys a step, the head dim padded to
    `BLOCK_D` (a power of two), and the launch's warps and pipeline stages."""

    BLOCK_N: int
    BLOCK_D: int
    num_warps: int = 4
    num_stages: int = 2

    def __str__(self):
        return f"BLOCK_N={self.BLOCK_N} BLOCK_D={self.BLOCK_D} warps={self.num_warps} stages={self.num_stages}"


@dataclass(frozen=True)
class AttentionProduct:
    """`softmax(q k^T * scale + mask) v` over the keys, in float32, for each query row of one (batch,
    query head). `key` and `value` are static strided views `[B, H / group, Lk, D]` of the buffers
    read (the source of a `repeat_kv` copy, not the copy), whose kv head for query head h is
    `h // key_group` (`h // value_group`); their offsets count from the storage's start, as a
    `Load`'s index does (the buffer's own offset included), as a matmul template's operands'."""

    key: ViewArg
    value: ViewArg
    key_group: int
    value_group: int
    scale: float
    config: AttentionConfig

    @property
    def operands(self) -> tuple[ViewArg, ...]:
        return (self.key, self.value)

    @property
    def sums(self) -> tuple[str, ...]:
        """The name under which the kernel's stage reads the normalized float32 sum."""
        return (ACCUMULATOR,)

    def renamed(self, names: dict) -> "AttentionProduct":
        return dataclasses.replace(self, key=dataclasses.replace(self.key, name=names[self.key.name]),
                                   value=dataclasses.replace(self.value, name=names[self.value.name]))

    def __str__(self):
        return (f"attention(key={self.key} / {self.key_group}, value={self.value} / {self.value_group}, "
                f"scale={self.scale}, {self.config})")


@dataclass(frozen=True)
class AttentionTemplate:
    """`buffer[b, h, i, :] = attention of query row i` (see the module docstring)."""

    buffer: str
    query: ScalarExpr
    mask: ScalarExpr | None
    product: AttentionProduct

    def __str__(self):
        mask = f", mask = {self.mask}" if self.mask is not None else ""
        return f"{self.buffer} = {self.product} with {QUERY} = {self.query}{mask}"


Node = Union[ComputedBuffer, ExternKernel, MatmulTemplate, SiblingGemvTemplate, AttentionTemplate]


@dataclass(frozen=True)
class Graph:
    """A lowered program. `inputs` are buffer names bound to the graph's tensor inputs in order
    (None for a non-tensor input); `outputs` are buffer names, `ViewArg`s (a view of a computed
    buffer), or constants for non-tensor outputs. `size_inputs` maps the position of each input
    that is a symbolic int (a size the trace saved for the backward) to its size symbol.
    `moved_inputs` (CPU inputs the program moves to its device at entry) and `cpu_outputs` (the
    positions of outputs it moves back): [Note: a CUDA program holds everything on its device] in
    lowering.py."""

    buffers: tuple[Buffer, ...]
    nodes: tuple[Node, ...]
    inputs: tuple[str | None, ...]
    outputs: tuple[Any, ...]
    size_inputs: tuple[tuple[int, sympy.Symbol], ...] = ()
    origins: tuple[tuple[str, str], ...] = ()   # (buffer, FX node name): the buffer holds that node's value
    moved_inputs: tuple[str, ...] = ()
    cpu_outputs: tuple[int, ...] = ()

    def buffer_map(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    def __str__(self):
        lines = [f"graph(inputs=({', '.join(map(str, self.inputs))}))"]
        lines += [f"  buffer {b}" for b in self.buffers]
        lines += [f"  {n}" for n in self.nodes]
        lines.append(f"  return ({', '.join(map(str, self.outputs))})")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- kernel-level IR

@dataclass(frozen=True)
class Assign:
    name: str
    expr: ScalarExpr

    def __str__(self):
        return f"{self.name} = {self.expr}"


@dataclass(frozen=True)
class Store:
    buffer: str
    index: sympy.Expr
    expr: ScalarExpr
    indirect: tuple[tuple[sympy.Symbol, "ScalarExpr"], ...] = ()
    bounds: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()
    accumulate: bool = False
    origin: CheckOrigin | None = None

    def __str__(self):
        ind = "".join(f", {s}={e}" for s, e in self.indirect)
        ind += "".join(f", 0<={s}<{n}" for s, n in self.bounds)
        return f"{'atomic_add' if self.accumulate else 'store'}({self.buffer}, {self.index}{ind}, {self.expr})"


@dataclass(frozen=True)
class Accumulate:
    name: str
    op: str
    expr: ScalarExpr

    def __str__(self):
        return f"{self.name} <- {self.op}({self.expr})"


@dataclass(frozen=True)
class ScanAccumulate:
    name: str
    op: str
    expr: ScalarExpr

    def __str__(self):
        return f"{self.name} <- {self.op}-scan({self.expr})"


Stmt = Union[Assign, Store, Accumulate, ScanAccumulate]


def stmt_exprs(s: Stmt) -> tuple:
    """Every scalar expression a statement evaluates: its value, and a store's index values."""
    return (s.expr, *(x for _, x in getattr(s, "indirect", ())))


def map_stmt(s: Stmt, fn_expr) -> Stmt:
    """`s` with `fn_expr` (ScalarExpr -> ScalarExpr) applied to each expression `stmt_exprs` lists."""
    if isinstance(s, Store) and s.indirect:
        return dataclasses.replace(s, expr=fn_expr(s.expr), indirect=tuple((t, fn_expr(x)) for t, x in s.indirect))
    return dataclasses.replace(s, expr=fn_expr(s.expr))


@dataclass(frozen=True)
class Stage:
    reduction_ranges: tuple[sympy.Expr, ...]
    body: tuple[Stmt, ...]

    @property
    def is_scan(self) -> bool:
        return any(isinstance(s, ScanAccumulate) for s in self.body)

    def __str__(self):
        head = f"  for r in {_fmt_ranges(self.reduction_ranges)}:" if self.reduction_ranges else "  once:"
        return "\n".join([head] + [f"    {s}" for s in self.body])


@dataclass(frozen=True)
class Kernel:
    name: str
    ranges: tuple[sympy.Expr, ...]
    stages: tuple[Stage, ...]
    buffer_args: tuple[str, ...]
    size_args: tuple[sympy.Symbol, ...] = ()
    origins: tuple[str, ...] = ()       # the graph nodes fused here, for logs and reports
    template: MatmulProduct | ConvProduct | SiblingGemvs | AttentionProduct | None = None   # a template kernel: its stage follows the product

    @property
    def prologue(self) -> tuple[Stage, ...]:
        """A GEMV template's leading stages over K, which compute its A ([Note: norm prologues] in
        kiln/codegen/prologues.py): the row statistics (`Accumulate`s over `(x0, r0)` = (row, k)),
        then A's element (`Assign(template.a.name)`); its epilogue stages run once per element."""
        return tuple(st for st in self.stages if st.reduction_ranges) if self.template is not None else ()

    @property
    def epilogue(self) -> tuple[Stage, ...]:
        """A template's stages after its product: the product's bodies and what joined them."""
        return tuple(st for st in self.stages if not st.reduction_ranges)

    def __str__(self):
        sizes = f" sizes({', '.join(map(str, self.size_args))})" if self.size_args else ""
        head = f"kernel {self.name}({', '.join(self.buffer_args)}{sizes}) for x in {_fmt_ranges(self.ranges)}:"
        template = [f"  after {', '.join(self.template.sums)} = {self.template}"] if self.template is not None else []
        return "\n".join([head] + template + [str(s) for s in self.stages])


# ATen ops whose CPU kernels raise RuntimeError, not IndexError, for an index outside its dim
# (embedding, index_select, x[i], index_copy, index_fill, index_put, take and put raise IndexError)
RUNTIME_ERROR_OPS = frozenset({"gather", "index_add", "index_add_", "scatter", "scatter_", "scatter_add",
                               "scatter_add_", "scatter_reduce", "scatter_reduce_"})


@dataclass(frozen=True)
class IndexCheck:
    """One distinct check of a kernel: a gather's read or a scatter's write (`kind`) at an index
    that must lie in [0, size), for the user's op `origin`."""
    kind: str                      # "gather" | "scatter"
    size: sympy.Expr
    origin: CheckOrigin | None = None

    def message(self, size=None) -> str:
        """What failed, for the user: the op, their line, the dim's size (`size`: its value)."""
        o = self.origin or CheckOrigin()
        op = o.op or ("a gather (embedding, x[idx], index_select, gather)" if self.kind == "gather"
                      else "a scatter (x[idx] = v, index_put, index_copy, index_add)")
        where = f" at {o.where}" if o.where else ""
        what = "read" if self.kind == "gather" else "write"
        return f"index out of range in {op}{where}: an index {what} outside a dim of size {self.size if size is None else size}"

    @staticmethod
    def error_type(op: str) -> type:
        return RuntimeError if op in RUNTIME_ERROR_OPS else IndexError

    def error(self, kernel: str, size=None) -> Exception:
        """The exception the program raises when this check failed: eager's type for the op."""
        cls = self.error_type(self.origin.op if self.origin else "")
        return cls(f"{self.message(size)} (kiln kernel {kernel}); eager raises {cls.__name__} here too")


def index_checks(kernel: Kernel) -> tuple[IndexCheck, ...]:
    """The distinct index checks of `kernel`: one for each bound of an indirect load ("gather") or
    store ("scatter") with its origin, in a fixed order. A C++ kernel reports a check it failed
    (the last in this order, if several) by its position + 1 ([Note: index bounds checks] in
    lowering_reduce)."""
    out: dict = {}
    for stage in kernel.stages:
        for s in stage.body:
            if isinstance(s, Store):
                out.update(dict.fromkeys(IndexCheck("scatter", sympy.sympify(n), s.origin) for _, n in s.bounds))
            for e in stmt_exprs(s):
                for ld in loads_of(e):
                    out.update(dict.fromkeys(IndexCheck("gather", sympy.sympify(n), ld.origin) for _, n in ld.bounds))
    return tuple(out)


def rename_buffers(kernel: Kernel, names: dict[str, str], name: str) -> Kernel:
    """`kernel` with every buffer (and the kernel-local value named after a buffer) renamed by
    `names`, and called `name`; origins are dropped with the old names."""
    def expr(e: ScalarExpr) -> ScalarExpr:
        def fn(node):
            if isinstance(node, Load):
                return dataclasses.replace(node, buffer=names[node.buffer])
            if isinstance(node, Var):
                return dataclasses.replace(node, name=names.get(node.name, node.name))
            return node
        return map_expr(e, fn)

    def stmt(s: Stmt) -> Stmt:
        if isinstance(s, Store):
            return dataclasses.replace(map_stmt(s, expr), buffer=names[s.buffer])
        return dataclasses.replace(s, name=names.get(s.name, s.name), expr=expr(s.expr))

    stages = tuple(Stage(st.reduction_ranges, tuple(stmt(s) for s in st.body)) for st in kernel.stages)
    template = kernel.template.renamed(names) if kernel.template is not None else None
    return Kernel(name, kernel.ranges, stages, tuple(names[b] for b in kernel.buffer_args), kernel.size_args,
                  template=template)


def canonical_kernel(kernel: Kernel, name: str = "kernel") -> tuple[Kernel, dict[str, str]]:
    """`kernel` with its buffers named by position (`in0, in1, ...` in argument order, `t0, t1, ...`
    for kernel-local values), and the renaming. Two kernels that do the same work on buffers of the
    same layouts are then equal and print the same source: a model's repeated layers compile each
    kernel once."""
    names = {b: f"in{i}" for i, b in enumerate(kernel.buffer_args)}
    for stage in kernel.stages:
        for s in stage.body:
            if not isinstance(s, Store) and s.name not in names:
                names[s.name] = f"t{len(names) - len(kernel.buffer_args)}"
    return rename_buffers(kernel, names, name), names
