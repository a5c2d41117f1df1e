"""The Triton matmul template: a template kernel (`ir.Kernel.template`) to Triton source.

A program computes one `BLOCK_M x BLOCK_N` tile of the product (of one batch element): it walks K
`BLOCK_K` at a time, loading a `[BLOCK_M, BLOCK_K]` tile of A and a `[BLOCK_K, BLOCK_N]` tile of
B, and accumulates `tl.dot` of them in float32. M, N and K need not be multiples of the blocks
([Note: unmasked operand loads]): the last K step loads under a mask (masked elements load as 0,
which adds nothing), and is the only masked load; rows past M and columns past N are read at
their index modulo M (N), a valid element whose sums are never stored. So where K is a multiple
of BLOCK_K the loop's loads carry no mask, and pipeline as Triton's own matmul tutorial's do. Then the kernel's stage (the product's
body and its fused epilogue, [Note: matmul template epilogues] in the scheduler) runs on the tile,
printed by the same statement printer as every kernel, with the tile's rows as its `x` dim and its
columns as its `r` dim: a load indexed by n only (a bias) is a `[1, BLOCK_N]` row, a store is
masked by `xmask & rmask0`. The batch index is one number a program.

[Note: a template launches as a kernel of its programs] The launcher runs every kernel as
`fn[ceil(xnumel / XBLOCK)](*buffers, xnumel, XBLOCK=, RBLOCK=, INDEX_DTYPE=)`, and a template's
function takes the same arguments: its `xnumel` is its number of programs (batch x row tiles x
column tiles, grouped `GROUP_M` row tiles at a time, as `ir.MatmulConfig` says) and it is launched
with `XBLOCK = 1`. Its tiling is fixed in its source (`BLOCK_M`, ... as module constants, and
`MATMUL_CONFIG`, which the launcher reads for the warps and stages and records in the launch's
`LaunchConfig.template`), so compiled binaries, warm starts and direct launches work for it as for
any kernel. Sizes and strides are static (`kiln.codegen.matmul_templates` makes templates of
static products only) and printed as numbers.

That is the "dot" form of `ir.MatmulConfig`; a product of a few rows (decoding's) has a "gemv" form
too, with no `tl.dot`: each program all of A's rows and a block of columns over all of K, its
weight tile read once ([Note: the GEMV form]), and the same epilogue. Sibling products (several
products of one A, `ir.SiblingGemvs`: [Note: sibling GEMVs] in matmul_templates.py) print as that
loop over every member of a segment, the segments' column blocks stacked in one launch. A GEMV
whose A has a prologue ([Note: norm prologues] in kiln/codegen/prologues.py) computes A's rows in
its loop instead of loading them, after loops of its own for A's row statistics (`_RowPrologue`).

Under Triton's interpreter `tl.dot` of bfloat16 tiles computes garbage (Triton 3.6 multiplies
their bits), so there the half tiles are widened to float32 first: exact, since a product of two
half values fits a float32, and summed in float32 as on a GPU.

Hands on: `print_template(kernel, buffers, interpret) -> str`, `programs(kernel) -> int`.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.triton import ops
from kiln.codegen.triton.heuristics import next_power_of_2
from kiln.codegen.triton.index import IndexPrinter, LoopSpace
from kiln.codegen.triton.ops import Value
from kiln.codegen.triton.printer import KernelPrinter, assemble

BATCH = sympy.Symbol("batch", integer=True, nonnegative=True)   # the epilogue's batch index


def _grid(kernel: ir.Kernel) -> tuple[int, int, int]:
    """(batch, row tiles, column tiles)."""
    config = kernel.template.config
    *batch, m, n = (int(r) for r in kernel.ranges)
    return (batch[0] if batch else 1), -(-m // config.BLOCK_M), -(-n // config.BLOCK_N)


def _segment_blocks(kernel: ir.Kernel) -> list[int]:
    """Sibling products' column blocks, segment by segment ([Note: sibling GEMVs])."""
    group = kernel.template
    return [-(-group.n(i) // group.config.BLOCK_N) for i in range(len(group.segments))]


def programs(kernel: ir.Kernel) -> int:
    if isinstance(kernel.template, ir.SiblingGemvs):
        return sum(_segment_blocks(kernel))
    batch, rows, columns = _grid(kernel)
    return batch * rows * columns


class TilePrinter(KernelPrinter):
    """The statement printer on one tile: `x` is the tile's rows (`xindex`, a `[BLOCK_M, 1]`
    column), `r` its columns (`rindex`, a `[1, BLOCK_N]` row), and `Var(ACCUMULATOR)` the tile's
    float32 sum over K (sibling products: each member's `Var(accumulator)`, `accumulators`)."""

    def __init__(self, kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool,
                 accumulators: tuple[str, ...] = (ir.ACCUMULATOR,), dims: tuple[tuple, tuple] | None = None):
        super().__init__(kernel, buffers, interpret, persistent=True, tile=("BLOCK_M", "BLOCK_N"))
        m, n = kernel.ranges[-2:]
        # `dims`: the result's dims a row of the tile stands for, outermost first, and a column's (a
        # convolution's (n, ho, wo) and (co,): [Note: convolution templates]); a product's: (M,), (N,)
        rows, columns = dims or ((m,), (n,))
        self.x_space = LoopSpace("x", rows, "xindex")
        self.index = IndexPrinter([self.x_space, LoopSpace("r", columns, "rindex")], {})
        for name in accumulators:
            self.vars[name] = Value(name, frozenset("xr"), torch.float32)

    def epilogue(self, stage: ir.Stage) -> list[str]:
        self.print_statements(stage.body)
        defs = [f"{self.index.spaces[prefix].per_dim_name(d)} = {self.index.spaces[prefix].per_dim_text(d, self.index)}"
                for prefix, d in sorted(self.index.used_dims)]
        return ["    " + line for line in defs] + self.out.lines


def on_tile(kernel: ir.Kernel, rename: dict | None = None) -> ir.Stage:
    """The kernel's stage with its loop variables renamed to the tile's (`rename`): a product's
    m -> x0, n -> r0, and the batch dim (a 3-D product's x0) -> `batch`."""
    nd = len(kernel.ranges)
    if rename is None:
        rename = {ir.loop_var(nd - 2): ir.loop_var(0), ir.loop_var(nd - 1): ir.reduction_var(0)}
        if nd == 3:
            rename[ir.loop_var(0)] = BATCH

    def stmt(s):
        if isinstance(s, ir.Store):
            return ir.Store(s.buffer, sympy.sympify(s.index).xreplace(rename), ir.subs_index(s.expr, rename))
        return dataclasses.replace(s, expr=ir.subs_index(s.expr, rename))
    (stage,) = kernel.epilogue
    return ir.Stage((), tuple(stmt(s) for s in stage.body))


def plus_terms(*terms) -> str:
    """`terms` (text or ints) as the start of a sum, zeros left out: `plus_terms("0", 300)` is `"300 + "`."""
    return "".join(f"{t} + " for t in terms if str(t) != "0")


def _pointer_terms(view: ir.ViewArg) -> tuple[str, str, str]:
    """The start of a matrix operand's batch element, and its row and column strides (as text)."""
    *batch, row_stride, column_stride = (int(s) for s in view.strides)
    start = str(int(view.offset)) + (f" + batch * {batch[0]}" if batch else "")
    return start, str(row_stride), str(column_stride)


def _operands(kernel: ir.Kernel, tile: TilePrinter) -> tuple:
    """The product's M, N and K, and for A and B: the pointer, the batch element's start and the
    row and column strides (as text)."""
    product = kernel.template
    m, n = (int(r) for r in kernel.ranges[-2:])
    return (m, n, int(product.k), (tile.ptr(product.a.name), *_pointer_terms(product.a)),
            (tile.ptr(product.b.name), *_pointer_terms(product.b)))


def _print_function(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    if isinstance(kernel.template, ir.SiblingGemvs):
        return _print_siblings(kernel, buffers, interpret)
    product = kernel.template
    batch, grid_m, grid_n = _grid(kernel)
    tile = TilePrinter(kernel, buffers, interpret)
    epilogue = tile.epilogue(on_tile(kernel))
    tiles = grid_m * grid_n
    lines = ["pid = tl.program_id(0)"]
    if batch > 1:
        lines += [f"batch = (pid // {tiles}).to(INDEX_DTYPE)", f"tile = pid % {tiles}"]
    else:
        lines += ["batch = 0", "tile = pid"]
    form = _gemv_lines if product.config.form == "gemv" else _dot_lines
    lines += form(kernel, tile, buffers, interpret)
    params = [tile.ptr(name) for name in kernel.buffer_args]
    params += ["xnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "INDEX_DTYPE: tl.constexpr"]
    body = "\n".join("    " + line for line in lines) + "\n" + "\n".join(epilogue)
    return f"{template_decorator(kernel, interpret)}\ndef {kernel.name}({', '.join(params)}):\n{body}\n"


def template_decorator(kernel: ir.Kernel, interpret: bool) -> str:
    """`device_assert`s compile in where a prologue gathers (an embedding read by the first norm)."""
    return "@triton.jit(debug=True)" if ir.index_checks(kernel) and not interpret else "@triton.jit"


def dot_operands(product, buffers: Mapping[str, ir.Buffer], interpret: bool) -> tuple[str, str]:
    """What a `tl.dot` of the product's tiles needs: the widening of half tiles under the
    interpreter (module docstring), and float32's `input_precision` argument."""
    dtype = buffers[product.a.name].dtype
    widen = ".to(tl.float32)" if interpret and dtype in ops.HALF_DTYPES else ""
    return widen, (f', input_precision="{product.precision}"' if dtype == torch.float32 else "")


def tile_lines(grid_m: int, grid_n: int, m: int, n: int) -> list[str]:
    """Program `tile`'s row and column tile (`pid_m`, `pid_n`), in the grouped order, and the tile's
    row indices (`xindex`, `[BLOCK_M, 1]`) and column indices (`rindex`, `[1, BLOCK_N]`), masked by
    M and N."""
    return [
        f"# programs in groups of GROUP_M row tiles, column tile by column tile: a group's programs share",
        f"# tiles of A and B in cache",
        f"group_first = (tile // (GROUP_M * {grid_n})) * GROUP_M",
        f"group_rows = tl.minimum({grid_m} - group_first, GROUP_M)",
        "pid_m = group_first + tile % group_rows",
        f"pid_n = (tile % (GROUP_M * {grid_n})) // group_rows",
        "xindex = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(INDEX_DTYPE)[:, None]",
        "rindex = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(INDEX_DTYPE)[None, :]",
        f"xmask = xindex < {m}",
        f"rmask0 = rindex < {n}",
    ]


def _dot_lines(kernel: ir.Kernel, tile: TilePrinter, buffers: Mapping[str, ir.Buffer], interpret: bool) -> list[str]:
    """The tile's sum over K as `tl.dot`s of `[BLOCK_M, BLOCK_K]` and `[BLOCK_K, BLOCK_N]` tiles."""
    product = kernel.template
    _, grid_m, grid_n = _grid(kernel)
    m, n, k, (a, a_start, a_m, a_k), (b, b_start, b_k, b_n) = _operands(kernel, tile)
    widen, precision = dot_operands(product, buffers, interpret)
    lines = tile_lines(grid_m, grid_n, m, n) + [
        "# [Note: unmasked operand loads] a partial tile's rows (columns) past M (N) load row M - 1's",
        "# neighbours again (index modulo M), and are never stored",
        f"a_rows = {a} + ({a_start} + (xindex % {m}) * {a_m})",
        f"b_columns = {b} + ({b_start} + (rindex % {n}) * {b_n})",
        f"{ir.ACCUMULATOR} = tl.full([BLOCK_M, BLOCK_N], 0, tl.float32)",
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    kindex = k0 + tl.arange(0, BLOCK_K).to(INDEX_DTYPE)",
    ]
    if k % product.config.BLOCK_K == 0:    # every K step is whole: no mask at all
        lines += [f"    a_tile = tl.load(a_rows + kindex[None, :] * {a_k}){widen}",
                  f"    b_tile = tl.load(b_columns + kindex[:, None] * {b_k}){widen}"]
    else:
        lines += [f"    a_tile = tl.load(a_rows + kindex[None, :] * {a_k}, kindex[None, :] < {k}, other=0){widen}",
                  f"    b_tile = tl.load(b_columns + kindex[:, None] * {b_k}, kindex[:, None] < {k}, other=0){widen}"]
    lines += [
        f"    {ir.ACCUMULATOR} = tl.dot(a_tile, b_tile, {ir.ACCUMULATOR}{precision})",
    ]
    return lines


def _gemv_lines(kernel: ir.Kernel, tile: TilePrinter, buffers: Mapping[str, ir.Buffer], interpret: bool) -> list[str]:
    """[Note: the GEMV form] A product of a few rows (decoding's `x @ w.t()` at one token) moves
    the weight and little else, so its time is the weight's bytes over the memory bandwidth, if
    the weight is read once, in long runs, by enough programs. The GEMV form gives a program
    `BLOCK_N` columns of B (rows of the weight) and all of A's M rows (`BLOCK_M >= M`, one row
    tile): it walks K `BLOCK_K` at a time, loads a `[BLOCK_N, BLOCK_K]` tile of B (contiguous along
    K in the `F.linear` layout, which `matmul_templates.candidates` asks of it) and, for each row
    m of A, adds the row sums of the tile times that row's `[BLOCK_K]` slice into a float32
    `[BLOCK_N]` sum of its own. Each tile of B is loaded once and used for all M rows, from
    registers; no `tl.dot` (whose blocks are 16 rows at least), no split-K pass. After the loop
    the rows' sums are placed in the `[BLOCK_M, BLOCK_N]` accumulator that the epilogue reads, as
    the dot form's: the epilogue is the same. Rows of B past N are read at their index modulo N,
    as the dot form reads them ([Note: unmasked operand loads]); only a last partial K step is
    masked. bench/gemv_probe.py measured this loop at M = 1 (its `_gemv`, reading B once per row
    of A) against cuBLAS on an H100. Sibling products of one A and one N ([Note: sibling GEMVs] in
    matmul_templates.py) are the same loop over several Bs: each K step loads every member's tile
    of B and A's slice once, and keeps a sum per member and row."""
    product = kernel.template
    m, n, k = (int(r) for r in (*kernel.ranges[-2:], product.k))
    rows = _rows(kernel, tile, buffers, interpret)
    b = (tile.ptr(product.b.name), *_pointer_terms(product.b))
    return ["pid_n = tile"] + _gemv_sums(m, n, k, rows, [(ir.ACCUMULATOR, b)], product.config)


def _rows(kernel: ir.Kernel, tile: TilePrinter, buffers: Mapping[str, ir.Buffer], interpret: bool):
    """How the GEMV loop gets A's rows: loaded, or computed by the kernel's prologue."""
    product = kernel.template
    if product.prologue:
        return _RowPrologue(kernel, buffers, interpret, tile.out.counter + 1000)
    return _LoadedRows(tile.ptr(product.a.name), *_pointer_terms(product.a), int(product.k),
                       int(product.k) % product.config.BLOCK_K == 0)


@dataclasses.dataclass
class _LoadedRows:
    """A's rows loaded from memory, a `[BLOCK_K]` slice a K step (the last step masked)."""

    pointer: str
    start: str
    row_stride: str
    k_stride: str
    k: int
    whole: bool

    def before(self, m: int) -> list[str]:
        return []

    def row(self, i: int) -> tuple[list[str], str]:
        mask = "" if self.whole else f", kindex < {self.k}, other=0"
        start = plus_terms(self.start, i * int(self.row_stride))
        return [f"    a_{i} = tl.load({self.pointer} + ({start}kindex * {self.k_stride}){mask}).to(tl.float32)"], f"a_{i}[None, :]"


STATISTICS_BLOCK = 4096


class _RowPrologue:
    """[Note: norm prologues]'s stages (`ir.Kernel.prologue`) on the GEMV form's unrolled rows, with
    K as the statement printer's `r` (`r0_`, a `[1, BLOCK_K]` row; row i's `x0` is i). Each
    statistics stage is a loop over K of its own before the product's: per row, a float32 lane
    sum of its `Accumulate`s, summed across the lanes after it. A's row i is its `Assign`'s value,
    computed in the product's loop; the parts of it that do not vary along K (the statistics'
    rsqrt, a gathered row's index) are computed once, before that loop, and reused by name."""

    def __init__(self, kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool, counter: int):
        *self.statistics, last = kernel.prologue
        (assign,) = last.body
        self.value = assign.expr
        self.k = int(last.reduction_ranges[0])
        self.whole = self.k % kernel.template.config.BLOCK_K == 0
        # the statistics' loop walks the row in blocks as wide as the row, up to STATISTICS_BLOCK:
        # one load a row where it fits, not a latency-bound walk of K / BLOCK_K dependent steps that
        # every program waits on before its product's loop (the 00:27 profile: +10 us a GEMV at
        # BLOCK_K 256 over LLaMA-1.1B's K of 2048)
        self.statistics_block = min(next_power_of_2(self.k), max(STATISTICS_BLOCK, kernel.template.config.BLOCK_K))
        p = KernelPrinter(kernel, buffers, interpret, persistent=True, tile=("1", "BLOCK_K"))
        p.index = IndexPrinter([LoopSpace("r", (sympy.Integer(self.k),), "r0_")], {})
        p.rmask = "kmask"                    # r's mask: `kmask0`; `rmask0` is the epilogue's, along N
        p.out.indent = 0
        p.out.counter = counter              # the epilogue's temporaries are named already
        self.p = p
        self.rows: list[dict[str, Value]] = []

    def _at_row(self, e: ir.ScalarExpr, i: int) -> ir.ScalarExpr:
        self.p.vars = dict(self.rows[i])
        return ir.subs_index(e, {ir.loop_var(0): sympy.Integer(i)})

    def before(self, m: int) -> list[str]:
        p, out = self.p, self.p.out
        self.rows = [{} for _ in range(m)]
        for stage in self.statistics:
            sums = [(s, i, f"{s.name}_lanes{i}") for s in stage.body for i in range(m)]
            for s, i, lanes in sums:
                for e in _along_k_free(self._at_row(s.expr, i)):
                    p.value(e)
                out.line(f"{lanes} = tl.full([1, {self.statistics_block}], 0, tl.float32)")
            outer = out.cse
            out.cse = dict(outer)
            block = self.statistics_block
            out.line(f"for k0 in range(0, {self.k}, {block}):")
            out.indent += 1
            out.line(f"r0_ = (k0 + tl.arange(0, {block})).to(INDEX_DTYPE)[None, :]")
            out.line(f"kmask0 = r0_ < {self.k}")
            for s, i, lanes in sums:
                v = p.value(self._at_row(s.expr, i))
                out.line(f"{lanes} += tl.where(kmask0, {ops.float32_block(v, f'[1, {block}]')}, 0.0)")
            out.indent -= 1
            out.cse = outer
            for s, i, lanes in sums:
                out.line(f"{s.name}_{i} = tl.reduce({lanes}, 1, tl.standard._sum_combine)[:, None]")
                self.rows[i][s.name] = Value(f"{s.name}_{i}", frozenset(), torch.float32)
        for i in range(m):      # what does not vary along K, once
            for e in _along_k_free(self._at_row(self.value, i)):
                p.value(e)
        lines, out.lines = out.lines, []
        return lines

    def row(self, i: int) -> tuple[list[str], str]:
        p, out = self.p, self.p.out
        if i == 0:         # the loop's scope: what it computes is shared by its rows, not after it
            out.cse = dict(out.cse)
            out.indent = 1
            out.line("r0_ = kindex[None, :]")
            out.line(f"kmask0 = r0_ < {self.k}")
        v = p.value(self._at_row(self.value, i))
        value = ops.float32_block(v, "[1, BLOCK_K]")
        out.line(f"a_{i} = {value if self.whole else f'tl.where(kmask0, {value}, 0.0)'}")
        lines, out.lines = out.lines, []
        return lines, f"a_{i}"


def _along_k_free(e: ir.ScalarExpr) -> list[ir.ScalarExpr]:
    """The largest sub-expressions of `e` that read nothing along K (`r0`) and compute something."""
    def free(x) -> bool:
        return all(ir.reduction_var(0) not in sympy.sympify(y.index).free_symbols
                   for y in ir.walk(x) if isinstance(y, (ir.Load, ir.IndexValue)))
    if free(e):
        return [] if isinstance(e, (ir.Constant, ir.Var)) else [e]
    return [x for c in ir.children(e) for x in _along_k_free(c)]


def _gemv_sums(m: int, n: int, k: int, rows, members: list[tuple[str, tuple]], config: ir.MatmulConfig) -> list[str]:
    """[Note: the GEMV form]'s loop for column block `pid_n`: for each member (its accumulator's name,
    and B's pointer, start and strides) the `[BLOCK_M, BLOCK_N]` float32 sum over K of A's rows
    (`rows`: `_LoadedRows` or `_RowPrologue`) times its B."""
    if config.BLOCK_M < m:
        raise ValueError(f"a GEMV tiling covers every row of A: BLOCK_M={config.BLOCK_M} < M={m}")
    whole = k % config.BLOCK_K == 0
    mask_b = "" if whole else f", kindex[None, :] < {k}, other=0"
    lines = [
        "# [Note: the GEMV form] one program: BLOCK_N columns over all of K, for every row of A",
        "xindex = tl.arange(0, BLOCK_M).to(INDEX_DTYPE)[:, None]",
        "nindex = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(INDEX_DTYPE)",
        "rindex = nindex[None, :]",
        f"xmask = xindex < {m}",
        f"rmask0 = rindex < {n}",
    ]
    tags = [acc[len(ir.ACCUMULATOR):] for acc, _ in members]     # "" for a lone product: `b_rows`
    lines += [f"b{tag}_rows = {b} + ({plus_terms(b_start)}(nindex % {n})[:, None] * {b_n})"
              for tag, (_, (b, b_start, b_k, b_n)) in zip(tags, members)]
    lines += [f"{acc}_{i} = tl.full([BLOCK_N], 0, tl.float32)" for acc, _ in members for i in range(m)]
    lines += rows.before(m)
    lines += [
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    kindex = k0 + tl.arange(0, BLOCK_K).to(INDEX_DTYPE)",
    ]
    lines += [f"    b{tag}_tile = tl.load(b{tag}_rows + kindex[None, :] * {b_k}{mask_b}).to(tl.float32)"
              for tag, (_, (_, _, b_k, _)) in zip(tags, members)]
    for i in range(m):
        row, a_i = rows.row(i)
        lines += row
        lines += [f"    {acc}_{i} += tl.reduce(b{tag}_tile * {a_i}, 1, tl.standard._sum_combine)"
                  for tag, (acc, _) in zip(tags, members)]
    for acc, _ in members:
        if config.BLOCK_M == 1:
            lines.append(f"{acc} = {acc}_0[None, :]")
        else:
            lines.append(f"{acc} = tl.full([BLOCK_M, BLOCK_N], 0, tl.float32)")
            lines += [f"{acc} = tl.where(xindex == {i}, {acc}_{i}[None, :], {acc})" for i in range(m)]
    return lines


def _print_siblings(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    """Sibling products ([Note: sibling GEMVs] in matmul_templates.py) as one kernel: a segment (the
    members of one N) is [Note: the GEMV form]'s loop over its members and its stage, on column
    block `tile` of its own. One segment is the kernel's body; several are each a function of
    their own, and the kernel calls the one its program id falls in (the segments' blocks stacked
    in order), so no name is defined in two branches with two types."""
    group = kernel.template
    m, k = (int(s) for s in group.a.sizes)
    pointers, segments = [], []
    for i, (members, stage) in enumerate(zip(group.segments, kernel.epilogue)):
        part = dataclasses.replace(kernel, ranges=(sympy.Integer(m), sympy.Integer(group.n(i))),
                                   stages=kernel.prologue + (stage,))
        tile = TilePrinter(part, buffers, interpret, tuple(group.accumulator(j) for j in members))
        pointers = [tile.ptr(name) for name in kernel.buffer_args]
        epilogue = tile.epilogue(on_tile(part))
        sums = [(group.accumulator(j), (tile.ptr(group.bs[j].name), *_pointer_terms(group.bs[j]))) for j in members]
        lines = ["pid_n = tile"] + _gemv_sums(m, group.n(i), k, _rows(part, tile, buffers, interpret), sums, group.config)
        segments.append("\n".join("    " + line for line in lines) + "\n" + "\n".join(epilogue))
    params = ", ".join(pointers + ["xnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "INDEX_DTYPE: tl.constexpr"])
    head = f"{template_decorator(kernel, interpret)}\ndef {kernel.name}({params}):\n    pid = tl.program_id(0)\n"
    if len(segments) == 1:
        return head + "    tile = pid\n" + segments[0] + "\n"
    functions, calls, start = [], [], 0
    for i, (body, blocks) in enumerate(zip(segments, _segment_blocks(kernel))):
        name = f"{kernel.name}_segment{i}"
        functions.append(f"{template_decorator(kernel, interpret)}\ndef {name}({', '.join(pointers)}, tile, INDEX_DTYPE: tl.constexpr):\n{body}\n")
        test = "else:" if i == len(segments) - 1 else f"{'if' if i == 0 else 'elif'} pid < {start + blocks}:"
        calls += [f"    {test}", f"        {name}({', '.join(pointers)}, {f'pid - {start}' if start else 'pid'}, INDEX_DTYPE)"]
        start += blocks
    return "\n\n".join(functions + [head + "\n".join(calls) + "\n"])


def tiling_constants(config: ir.MatmulConfig) -> list[str]:
    """A template module's tiling: its blocks as constants, and `MATMUL_CONFIG` for the launcher."""
    constants = [f"{name} = tl.constexpr({getattr(config, name)})" for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
    constants.append(f"MATMUL_CONFIG = {dataclasses.asdict(config)!r}  # the launch: one tile a program")
    return constants


def print_template(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    """The module source of a template kernel (`printer.print_canonical` of one)."""
    return assemble(kernel, [_print_function(kernel, buffers, interpret)], tiling_constants(kernel.template.config), interpret)
