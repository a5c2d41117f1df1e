"""The Triton printer: one `kiln.codegen.ir.Kernel` (a fused loop nest) to Triton source text.

A kernel whose stages all run once per outer index prints as a 1-D pointwise kernel over a flat
`xindex`. A kernel with reduction or scan stages prints as a 2-D kernel: `xindex` is a column
`[XBLOCK, 1]`, `rindex` a row `[1, RBLOCK]`, and it is printed twice into one source:

- `<name>`: persistent (see [Note: persistent and looped reductions] in `heuristics`): every stage
  sees its whole reduction row at once (`RBLOCK >= rnumel`), so a value loaded by one stage is
  reused by the next (loads and ops are shared across stages by their text) and softmax or
  layer_norm read their input once;
- `<name>_looped`: each reduction stage walks its row in `RBLOCK` chunks, with accumulators as wide
  as a chunk that are reduced across the chunk after the loop.

Stage statements print through `_STMT` (keyed by statement type), reductions through
`REDUCTIONS` (keyed by op), scalar ops through `ops.OPS`. Signatures: pointer per
`kernel.buffer_args`, int per `kernel.size_args`, then `xnumel`, one `rnumel<g>` per distinct
reduction-range group, then the constexprs `XBLOCK`, `RBLOCK`, `INDEX_DTYPE` (tl.int32 or tl.int64).

Hands on: `print_kernel(kernel, buffers, interpret=None) -> str`, `KernelLayout` (what the launcher
needs to call it); to the template printers (`matmul`), `KernelPrinter` and `assemble`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.triton import ops
from kiln.codegen.triton.index import IndexPrinter, LoopSpace
from kiln.codegen.triton.ops import Value
from kiln.codegen.triton.reductions import plan as _plan_stage

RESERVED = {"xindex", "xoffset", "xmask", "rindex", "rbase", "roffset", "tl", "triton", "libdevice",
            "XBLOCK", "RBLOCK", "INDEX_DTYPE", "xnumel"}


@dataclasses.dataclass(frozen=True)
class KernelLayout:
    """How to call a printed kernel: which function, and how numels follow from the size args."""

    name: str
    kind: str                                  # "pointwise" | "reduction" | "scan"
    xnumel: sympy.Expr
    rnumels: tuple[sympy.Expr, ...]            # one per reduction-range group, in argument order
    size_args: tuple[sympy.Symbol, ...]
    rows_contiguous: bool = False              # reduced dim strided, x contiguous (heuristics hint)


# A template kernel's printer module (in kiln.codegen.triton), and its layout's kind, by its product's type
TEMPLATE_PRINTERS = {ir.AttentionProduct: ("attention", "attention"), ir.MatmulProduct: ("matmul", "matmul"),
                     ir.SiblingGemvs: ("matmul", "matmul"), ir.ConvProduct: ("conv", "matmul")}


def template_printer(kernel: ir.Kernel):
    """The module that prints template kernel `kernel` (`print_template`, `programs`)."""
    import importlib
    return importlib.import_module(f"kiln.codegen.triton.{TEMPLATE_PRINTERS[type(kernel.template)][0]}")


def layout_of(kernel: ir.Kernel) -> KernelLayout:
    if kernel.template is not None:
        return KernelLayout(name=_ident(kernel.name), kind=TEMPLATE_PRINTERS[type(kernel.template)][1],
                            xnumel=sympy.Integer(template_printer(kernel).programs(kernel)),
                            rnumels=(), size_args=tuple(kernel.size_args))
    groups = _range_groups(kernel)
    kind = "pointwise"
    if groups:
        kind = "scan" if any(s.is_scan for s in kernel.stages) else "reduction"
    return KernelLayout(name=_ident(kernel.name), kind=kind, xnumel=ir.product(kernel.ranges),
                        rnumels=tuple(ir.product(g) for g in groups), size_args=tuple(kernel.size_args),
                        rows_contiguous=_rows_contiguous(kernel))


def _multiple_of_16(e) -> bool:
    """Whether a size expression is a multiple of 16 whatever its symbols' values (a number: any
    value, which Triton then specializes on as it sees it): each of its terms has an integer
    coefficient divisible by 16 (`768*s0`, `32*floor(s0/2)`). Read off the terms, not asked of
    sympy's assumptions (`(e / 16).is_integer`), which took ~1 ms a question: 2 s of printing a
    decode step's symbolic kernels on the H200."""
    e = sympy.sympify(e)
    if e.is_number:
        return True
    for term in (e.args if e.is_Add else (e,)):
        coefficient = term.as_coeff_Mul()[0]
        if not (coefficient.is_Integer and int(coefficient) % 16 == 0):
            return False
    return True


def _range_groups(kernel: ir.Kernel) -> list[tuple]:
    groups: list[tuple] = []
    for stage in kernel.stages:
        if stage.reduction_ranges and tuple(stage.reduction_ranges) not in groups:
            groups.append(tuple(stage.reduction_ranges))
    return groups


def _rows_contiguous(kernel: ir.Kernel) -> bool:
    """True when the first reduction's loads mostly step through memory along x, not r: a vote
    over its distinct loads that vary along both x's last dim and r's: a load that does not is the
    same for a whole tile of the other (RMSNorm's rstd in its weight gradient; layer norm's row
    statistics in convnext's weight gradients, which appear in every term and outvoted the
    activations: each (image, channel) was then reduced by one program reading at a stride of the
    channel count, 0.8 ms a kernel on the H200), so it has no vote."""
    for stage in kernel.stages:
        if not stage.reduction_ranges:
            continue
        r_last = ir.reduction_var(len(stage.reduction_ranges) - 1)
        x_last = ir.loop_var(len(kernel.ranges) - 1) if kernel.ranges else None
        along_x = along_r = 0
        seen = set()
        for stmt in stage.body:
            expr = getattr(stmt, "expr", None)
            for load in ir.loads_of(expr) if expr is not None else []:
                index = sympy.expand(sympy.sympify(load.index))
                if (load.buffer, index) in seen:
                    continue
                seen.add((load.buffer, index))
                if x_last is None or not {x_last, r_last} <= index.free_symbols:
                    continue
                if index.coeff(x_last) == 1:
                    along_x += 1
                elif index.coeff(r_last) == 1:
                    along_r += 1
        # a tie (one operand of each layout) goes to x: its tile reads the x-major one coalesced
        # and the other in runs along r, where a row program reads the x-major one a row at a time
        return along_x > 0 and along_x >= along_r
    return False


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name))
    if not out or out[0].isdigit():
        out = "k_" + out
    return out


class _Emitter:
    """Lines of one function body, with common subexpressions named once (`let`). `blocks` name the
    block's extents along x and r (a template's tile names its own)."""

    def __init__(self, two_d: bool, blocks: tuple[str, str] = ("XBLOCK", "RBLOCK")):
        self.two_d = two_d
        self.blocks = blocks
        self.lines: list[str] = []
        self.indent = 1
        self.cse: dict[str, str] = {}
        self.counter = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def fresh(self, prefix: str = "tmp") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def let(self, rhs: str, prefix: str = "tmp") -> str:
        name = self.cse.get(rhs)
        if name is None:
            name = self.fresh(prefix)
            self.line(f"{name} = {rhs}")
            self.cse[rhs] = name
        return name

    def shape(self, deps) -> str:
        x, r = self.blocks
        if not self.two_d:
            return f"[{x}]"
        return {frozenset(): "[1, 1]", frozenset("x"): f"[{x}, 1]", frozenset("r"): f"[1, {r}]",
                frozenset("xr"): f"[{x}, {r}]"}[frozenset(deps)]


class KernelPrinter:
    """Prints one function (persistent, looped or pointwise) of one kernel. A template's printer
    (`kiln.codegen.triton.matmul`) prints its stage with it on a 2-D tile whose extents `tile` names."""

    def __init__(self, kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool,
                 persistent: bool, tile: tuple[str, str] | None = None):
        self.kernel = kernel
        self.buffers = buffers
        self.interpret = interpret
        self.persistent = persistent
        self.groups = _range_groups(kernel)
        self.two_d = bool(self.groups) or tile is not None
        self.out = _Emitter(self.two_d, tile or ("XBLOCK", "RBLOCK"))
        names = {s.name: self.size_name(s) for s in kernel.size_args}
        self.x_space = LoopSpace("x", tuple(kernel.ranges), "xindex")
        self.index = IndexPrinter([self.x_space], names)
        self.vars: dict[str, Value] = {}
        self.group = 0                  # the reduction-range group of the stage being printed
        self.stores_to: dict[str, int] = {}
        # [Note: stored values are forwarded] A load of what this kernel stored at the same offset
        # (softmax's exp, stored, then read back to divide) takes the stored value from registers:
        # no second read, and no reliance on another thread of the program seeing the store, which
        # Triton does not promise without a barrier. (buffer, offset) -> (value as the buffer holds
        # it, its dims); a loop's values are not forwarded past it.
        self.stored: dict[tuple[str, str], tuple[str, frozenset]] = {}
        self.groups_opened: set[int] = set()
        self.rmask = "rmask"            # the reduction mask's name (`WelfordReducer.eager_order` renames it)
        # [Note: a select's loads are masked by its condition] (the condition's text, its dims) of
        # each `where` branch being printed
        self.guards: list[tuple[str, frozenset]] = []
        self.row_threads: int | None = None   # threads a row's reduction needs (`WelfordReducer.eager_order`)

    def size_name(self, s: sympy.Symbol) -> str:
        name = _ident(s.name)
        return f"ks_{name}" if name in RESERVED or name.startswith(("p_", "tmp", "v_", "rnumel")) else name

    def ptr(self, buffer: str) -> str:
        return f"p_{_ident(buffer)}"

    # -- masks
    def mask(self, deps) -> str | None:
        deps = frozenset(deps)
        parts = (["xmask"] if "x" in deps else []) + ([f"{self.rmask}{self.group}"] if "r" in deps else [])
        return " & ".join(parts) if parts else None

    # -- scalar expressions
    def value(self, e: ir.ScalarExpr) -> Value:
        return _EXPR[type(e)](self, e)

    def load(self, e: ir.Load) -> Value:
        deps = set()
        saved = dict(self.index.names)
        used = ir.as_expr(e.index).free_symbols
        inside = []
        for sym, sub in e.indirect:
            v = self.value(sub)
            if sym in used:      # an index value a stride of 0 multiplies away (a gather from an
                deps |= v.deps   # expanded input) leaves a scalar pointer, which a block mask may not guard
            self.index.names[sym.name] = v.text
            size = dict(e.bounds).get(sym)
            if size is not None:
                ok = self.check_index(v, size, ir.IndexCheck("gather", sympy.sympify(size), e.origin))
                if sym in used:
                    inside.append(ok)
        try:
            offset = self.index.offset(e.index)
        finally:
            self.index.names = saved
        deps |= self.index.dims(e.index)
        buf = self.buffers.get(e.buffer)
        if buf is not None and sympy.sympify(buf.numel) == 0 and not e.indirect:
            # an empty buffer has no element to read: the loops over it run zero times, or mask the
            # value off. Its index may have simplified to a constant (a size-0 dim's strides drop
            # out), and an unmasked load at that offset read unowned memory (SIGSEGV under the
            # interpreter: fuzz seed 510290, `x.isnan().flatten().any()` of a (2, 2, 1, 0) input)
            return Value(f"tl.full([1], 0, {ops.tl_dtype(ops.compute_dtype(e.dtype))})", frozenset(), e.dtype)
        dtype = buf.dtype if buf is not None else e.dtype
        forwarded = self.stored.get((e.buffer, offset)) if not e.indirect else None
        if forwarded is not None and forwarded[1] == frozenset(deps | {"x"}):
            text = forwarded[0]
            if dtype in ops.HALF_DTYPES or e.dtype == torch.float32:
                text = f"{text}.to(tl.float32)"
            return Value(self.out.let(text), frozenset(forwarded[1]), e.dtype)
        generation = self.stores_to.get(e.buffer, 0)

        def load_text(mask: str | None) -> str:
            if mask is None:
                text = f"tl.load({self.ptr(e.buffer)} + ({offset}))"
            else:
                text = f"tl.load({self.ptr(e.buffer)} + ({offset}), {mask}, other=0)"
            if dtype in ops.HALF_DTYPES or e.dtype == torch.float32:
                # widen half types to the float32 they are computed in; a no-op cast for float32 buffers, and
                # the right one where the buffer map lacks the buffer (its dtype then unknown here)
                text += ".to(tl.float32)"
            # A store to the buffer since an identical load was printed makes that load stale.
            return text + f"  # gen {generation}" if generation else text
        # an indirect index outside its dim is masked too (and asserted: `check_index`)
        mask = " & ".join(m for m in [self.mask(deps), *inside] if m) or None
        text = load_text(mask)
        # a guard's mask must broadcast to the pointer's block: only conditions along the load's dims
        guards = [g for g, g_deps in self.guards if g_deps <= deps]
        if guards and text not in self.out.cse:      # loaded unmasked already: that load serves
            text = load_text(" & ".join(m for m in [mask, *guards] if m))
        return Value(self.out.let(text), frozenset(deps), e.dtype)

    def constant(self, e: ir.Constant) -> Value:
        v = e.value
        if isinstance(v, bool) or e.dtype == torch.bool:
            return Value("True" if v else "False", frozenset(), torch.bool)
        if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
            text = f'float("{v}")'
        else:
            text = repr(float(v)) if e.dtype.is_floating_point else repr(int(v))
        dtype = ops.compute_dtype(e.dtype)
        if dtype in (torch.float64, torch.int64):
            # Python literals are 32-bit in Triton; a 64-bit constant is a typed block of one.
            text = f"tl.full([1], {text}, {ops.tl_dtype(dtype)})"
        return Value(text, frozenset(), e.dtype)

    def index_value(self, e: ir.IndexValue) -> Value:
        deps = self.index.dims(e.index)
        text = self.index.offset(e.index)
        dtype = ops.compute_dtype(e.dtype)
        if not deps:
            text = f"(tl.full([1], 0, {ops.tl_dtype(dtype)}) + ({text}))"
        else:
            text = f"({text}).to({ops.tl_dtype(dtype)})"
        return Value(self.out.let(text), frozenset(deps), e.dtype)

    def op(self, e: ir.Op) -> Value:
        if e.name == "where" and _guards_its_loads(e):
            return self.masked_where(e)
        if self.interpret and e.name in ops.LIBDEVICE_ONLY:
            raise NotImplementedError(f"scalar op {e.name!r} needs libdevice, which Triton's interpreter "
                                      f"lacks; run it on a CUDA device or through the C++ backend")
        if e.name not in ops.OPS:
            raise NotImplementedError(f"the Triton printer has no scalar op {e.name!r} (libdevice lacks it); "
                                      f"lowering should decompose it or run it as an extern kernel")
        args = [self.value(a) for a in e.args]
        text = ops.OPS[e.name]([a.text for a in args], [a.dtype for a in args], e.dtype)
        deps = frozenset().union(*(a.deps for a in args)) if args else frozenset()
        return Value(self.out.let(text), deps, e.dtype)

    def masked_where(self, e: ir.Op) -> Value:
        """`where(cond, a, b)` with `a`'s loads masked by `cond` and `b`'s by its negation
        ([Note: a select's loads are masked by its condition])."""
        cond = self.value(e.args[0])
        if not cond.deps:        # one value for the whole block: nothing to mask by
            branches = [self.value(b) for b in e.args[1:]]
        else:
            negated = self.out.let(f"({cond.text}) == 0")
            branches = []
            for guard, branch in ((cond.text, e.args[1]), (negated, e.args[2])):
                self.guards.append((guard, cond.deps))
                try:
                    branches.append(self.value(branch))
                finally:
                    self.guards.pop()
        args = [cond, *branches]
        text = ops.OPS["where"]([a.text for a in args], [a.dtype for a in args], e.dtype)
        return Value(self.out.let(text), frozenset().union(*(a.deps for a in args)), e.dtype)

    def var(self, e: ir.Var) -> Value:
        try:
            return self.vars[e.name]
        except KeyError:
            raise NotImplementedError(f"kernel {self.kernel.name}: Var {e.name!r} is read before any "
                                      f"statement of this kernel defines it") from None

    # -- statements
    def assign(self, s: ir.Assign) -> None:
        v = self.value(s.expr)
        self.vars[s.name] = v

    def store(self, s: ir.Store) -> None:
        v = self.value(s.expr)
        buf = self.buffers[s.buffer]
        saved, inside, index_deps = dict(self.index.names), [], frozenset()
        bounds = dict(s.bounds)
        for sym, sub in s.indirect:     # a scatter: the address's indices are loaded values
            iv = self.value(sub)
            index_deps |= iv.deps
            self.index.names[sym.name] = iv.text
            if sym in bounds:          # an index outside its dim asserts, and writes nothing
                inside.append(self.check_index(iv, bounds[sym], ir.IndexCheck("scatter", sympy.sympify(bounds[sym]), s.origin)))
        try:
            offset = self.index.offset(s.index)
        finally:
            self.index.names = saved
        index_deps |= self.index.dims(s.index)
        deps = index_deps | v.deps | {"x"}
        shape = self.out.shape(deps)
        pointer = f"{self.ptr(s.buffer)} + ({offset})"
        if index_deps != deps:   # an added block of zeros, not a broadcast view: the interpreter
            pointer = f"{pointer} + tl.full({shape}, 0, tl.int32)"   # refuses to store through a read-only one
        value = v.text
        compute = ops.compute_dtype(v.dtype)
        if v.deps != deps:
            value = f"tl.full({shape}, 0, {ops.tl_dtype(compute)}) + {value}" \
                if not v.deps else f"tl.broadcast_to({value}, {shape})"
        if buf.dtype in ops.HALF_DTYPES and compute != buf.dtype:
            value = ops.to_half(value, compute, buf.dtype)
        elif buf.dtype != compute:
            value = f"({value}).to({ops.tl_dtype(buf.dtype)})"
        value = self.out.let(value)
        mask = " & ".join(m for m in [self.mask(deps), *inside] if m) or None
        self.out.line(f"tl.{'atomic_add' if s.accumulate else 'store'}({pointer}, {value}, {mask})")
        self.stores_to[s.buffer] = self.stores_to.get(s.buffer, 0) + 1
        self.stored = {k: v for k, v in self.stored.items() if k[0] != s.buffer}
        if not s.indirect:
            self.stored[(s.buffer, offset)] = (value, frozenset(deps))

    def check_index(self, v: Value, size, check: ir.IndexCheck) -> str:
        """Assert that the index value `v` lies in [0, size) where its block is not masked off, and
        return the in-range condition's name, for the access's mask ([Note: index bounds checks]
        in lowering_reduce: `decorator` compiles the assert in)."""
        rhs = f"(0 <= {v.text}) & ({v.text} < {self.index.offset(size)})"
        if rhs in self.out.cse:      # asserted already
            return self.out.cse[rhs]
        ok = self.out.let(rhs)
        mask = self.mask(v.deps)
        self.out.line(f'tl.device_assert({ok}, {check.message()!r}{f", mask={mask}" if mask else ""})')
        return ok

    # -- structure
    def print_function(self, name: str) -> str:
        k = self.kernel
        params = [self.ptr(b) for b in k.buffer_args] + [self.size_name(s) for s in k.size_args]
        # Under the interpreter a runtime int is a one-element numpy array, which numpy >= 2.3
        # refuses as a `range` bound; there the loop bounds are constexprs (nothing compiles).
        rnumel_type = ": tl.constexpr" if self.interpret else ""
        params += ["xnumel"] + [f"rnumel{g}{rnumel_type}" for g in range(len(self.groups))]
        params += ["XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "INDEX_DTYPE: tl.constexpr"]
        o = self.out
        # int32 index math is faster; the launcher passes tl.int64 when a buffer spans >= 2**31 elements.
        o.line("xoffset = tl.program_id(0).to(INDEX_DTYPE) * XBLOCK")
        o.line("xindex = xoffset + tl.arange(0, XBLOCK)" + ("[:, None]" if self.two_d else ""))
        o.line("xmask = xindex < xnumel")
        if self.two_d:
            o.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        header_end = len(o.lines)
        for stage in k.stages:
            self.print_stage(stage)
        x_defs = ["    " + f"{self.x_space.per_dim_name(d)} = {self.x_space.per_dim_text(d, self.index)}"
                  for (p, d) in sorted(self.index.used_dims) if p == "x"]
        # after x_defs, which may name quotients too ([Note: one division per symbolic dim])
        o.lines[header_end:header_end] = ["    " + line for line in self.index.quotient_lines(self.x_space)] + x_defs
        body = "\n".join(o.lines)
        return f"{self.decorator()}\ndef {name}({', '.join(params)}):\n{body}\n"

    def decorator(self) -> str:
        """[Note: symbolic sizes are not specialized] Triton compiles a binary per "specialization"
        of a launch's int arguments: equal to 1, divisible by 16, or neither. A kernel over a
        symbolic dim would then compile again whenever a new size crosses a class (a decode step's
        cache length goes 16, 17, ..., 32: two binaries a kernel, each compiled serially at a
        launch), and no binary could be compiled ahead of the first launch for the sizes to come.
        So the int arguments a symbolic size decides are passed unspecialized, one binary serving
        every size, except those provably multiples of 16 (`xnumel` of a [s0, 768] pointwise
        kernel), whose divisibility is what lets the `x < xnumel` mask keep loads 128-bit wide."""
        debug = ["debug=True"] if ir.index_checks(self.kernel) else []   # device_assert compiles in
        if self.interpret:
            return "@triton.jit"     # the launcher turns the interpreter's asserts on
        k = self.kernel
        ints = [(self.size_name(s), s) for s in k.size_args] + [("xnumel", ir.product(k.ranges))]
        ints += [(f"rnumel{g}", ir.product(group)) for g, group in enumerate(self.groups)]
        loose = [name for name, e in ints if not _multiple_of_16(e)]
        args = debug + ([f"do_not_specialize={loose!r}"] if loose else [])
        return f"@triton.jit({', '.join(args)})" if args else "@triton.jit"

    def print_stage(self, stage: ir.Stage) -> None:
        if not stage.reduction_ranges:
            self.print_statements(stage.body)
            return
        self.group = self.groups.index(tuple(stage.reduction_ranges))
        g = self.group
        space = LoopSpace("r", tuple(stage.reduction_ranges), "rindex")
        space.per_dim_name = lambda d, g=g: f"r{d}_{g}"
        self.index.spaces["r"] = space
        self.index.used_dims = {u for u in self.index.used_dims if u[0] != "r"}
        o = self.out
        stage_plan = _plan_stage(stage)
        if self.persistent:
            if g not in self.groups_opened:
                # Every persistent stage sees the same whole row: one rindex, one mask per group.
                self.groups_opened.add(g)
                o.line("rindex = rbase")
                o.line(f"rmask{g} = rindex < rnumel{g}")
            start = len(o.lines)
            self.print_stage_body(stage, stage_plan)
            o.lines[start:start] = self._r_defs(space)
            return
        # Looped: accumulators before the loop, a fresh CSE scope inside it, finals after it.
        # Values stored by an earlier loop hold only its last chunk: none is forwarded across loops.
        self.stored = {}
        for acc in stage_plan:
            acc.init(self)
        outer_cse = o.cse
        o.cse = dict(outer_cse)
        o.line(f"for roffset in range(0, rnumel{g}, RBLOCK):")
        o.indent += 1
        o.line("rindex = roffset + rbase")
        o.line(f"rmask{g} = rindex < rnumel{g}")
        start = len(o.lines)
        self.print_stage_body(stage, stage_plan)
        o.lines[start:start] = ["    " * o.indent + line.strip() for line in self._r_defs(space)]
        o.indent -= 1
        o.cse = outer_cse
        self.stored = {}
        for acc in stage_plan:
            acc.finish(self)

    def _r_defs(self, space: LoopSpace) -> list[str]:
        return ["    " * self.out.indent + f"{space.per_dim_name(d)} = {space.per_dim_text(d, self.index)}"
                for (p, d) in sorted(self.index.used_dims) if p == "r"]

    def print_statements(self, statements) -> None:
        """Statements of a stage that runs once per outer index."""
        for stmt in statements:
            _STMT[type(stmt)](self, stmt)

    def print_stage_body(self, stage: ir.Stage, plan: list["_Reducer"]) -> None:
        by_stmt = {id(a.stmt): a for a in plan}
        for stmt in stage.body:
            reducer = by_stmt.get(id(stmt))
            if reducer is not None:
                reducer.update(self)
            elif isinstance(stmt, ir.Accumulate):
                continue        # the second half of a Welford pair, updated with its first half
            else:
                _STMT[type(stmt)](self, stmt)


_EXPR = {ir.Load: KernelPrinter.load, ir.Constant: KernelPrinter.constant,
         ir.IndexValue: KernelPrinter.index_value, ir.Op: KernelPrinter.op, ir.Var: KernelPrinter.var}


# [Note: a select's loads are masked by its condition] `cat` lowers to a select per piece,
# `where(lt(index(c), 58), load(a, ..Min(57, c)..), <b's values>(..Max(0, c - 58)..))`: each piece
# read at a clamped index, so both branches' loads are in bounds everywhere. Printed as a plain
# `tl.where`, both loads ran for every element: a cat read twice the bytes it writes (the
# channel shuffle of every ShuffleNet block, issue #35). A select whose condition is computed
# from indices alone prints each branch's loads masked by it (Inductor masks a cat's loads the
# same way): a warp whose lanes all take one branch issues no read for the other. A condition
# that itself loads is left alone: masking would make each branch's loads wait for it. A load
# already printed unmasked is reused, not loaded again under the mask.

def _guards_its_loads(e: ir.Op) -> bool:
    """A `where` whose condition loads nothing and at least one branch of which loads."""
    cond, *branches = e.args
    return not ir.loads_of(cond) and not any(isinstance(n, ir.Var) for n in ir.walk(cond)) \
        and any(ir.loads_of(b) for b in branches)


def _scan_stmt(p: KernelPrinter, s) -> None:  # ScanAccumulates are printed by their reducer
    raise AssertionError("ScanAccumulate outside a scan stage")


_STMT = {ir.Assign: KernelPrinter.assign, ir.Store: KernelPrinter.store, ir.ScanAccumulate: _scan_stmt}


def canonical(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> tuple[ir.Kernel, dict[str, ir.Buffer]]:
    """The kernel as printed (`ir.canonical_kernel`: buffers named by position), and the buffer map
    under those names. Its name, the printed function's (`<name>_looped`: the looped form), is made
    of what it computes: its kind, its first ops and a hash of its loop IR, so a profile tells
    kernels apart and equal kernels still print equal source."""
    import hashlib
    shape, names = ir.canonical_kernel(kernel)
    ops_used = list(dict.fromkeys(e.name for stage in shape.stages for stmt in stage.body
                                  for e in ir.walk(stmt.expr) if isinstance(e, ir.Op)))
    digest = hashlib.sha256(str(shape).encode()).hexdigest()[:8]
    name = "_".join(["kiln", layout_of(shape).kind[:3], *ops_used[:4], digest])
    shape = dataclasses.replace(shape, name=name)
    return shape, {new: buffers[old] for old, new in names.items() if old in buffers}


def print_kernel(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool | None = None) -> str:
    """Triton source for `kernel`. `interpret`: print for Triton's interpreter (CPU tensors); by
    default, when none of the kernel's buffers lives on a CUDA device.

    The source names nothing of the graph it came from (see `canonical`): a kernel repeated in every
    layer of a model prints, loads and compiles once, and a second process finds its binary in
    Triton's cache whatever the graph's buffers were called."""
    if interpret is None:
        interpret = not any(str(buffers[b].device).startswith("cuda") for b in kernel.buffer_args
                            if b in buffers)
    return print_canonical(*canonical(kernel, buffers), interpret)


def print_canonical(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    """`print_kernel` of a kernel `canonical` made already."""
    if kernel.template is not None:
        return template_printer(kernel).print_template(kernel, buffers, interpret)
    persistent = KernelPrinter(kernel, buffers, interpret, persistent=True)
    functions = [persistent.print_function(kernel.name)]
    if layout_of(kernel).kind != "pointwise":
        functions.append(KernelPrinter(kernel, buffers, interpret, persistent=False)
                         .print_function(f"{kernel.name}_looped"))
    constants = []
    if persistent.row_threads:
        constants.append(f"ROW_THREADS = {persistent.row_threads}  # the persistent form's launch: one row, this many threads")
    return assemble(kernel, functions, constants, interpret)


def assemble(kernel: ir.Kernel, functions: list[str], constants: list[str], interpret: bool) -> str:
    """A kernel's module source: its loop IR as a comment, imports, module `constants` (lines), the
    helpers its functions call, then the functions."""
    body = "\n\n".join(functions)
    helpers = ops.helper_source(ops.helpers_in(body), interpret)
    header = [f"# kiln Triton kernel, printed for {'the Triton interpreter' if interpret else 'CUDA'}; loop IR:"]
    header += ["# " + line for line in str(kernel).splitlines()]
    header += ["import triton", "import triton.language as tl"]
    if not interpret:
        header.append("from triton.language.extra import libdevice")
    header += constants
    parts = ["\n".join(header)]
    if helpers:
        parts.append(helpers)
    parts.append(body)
    return "\n\n\n".join(parts)


def print_module(kernels, buffers: Mapping[str, ir.Buffer]) -> str:
    """Every kernel's source under its graph name and what it fuses, one after another (for logs and
    reports; `build` loads each alone)."""
    return "\n\n\n".join(f"# ---- {k.name}" + (f" (fuses {', '.join(k.origins)})" if k.origins else "")
                            + "\n" + print_kernel(k, buffers) for k in kernels)
