"""The Triton attention template: an attention template's kernel (`ir.Kernel.template` an
`ir.AttentionProduct`) to Triton source ([Note: decode attention] in
kiln/codegen/attention_templates.py says when the pass makes one).

A program computes one (batch, query head): `pid = batch * H + head`. For each of its `Lq` query
rows (at most a few: decoding's; the rows are unrolled in the source) it keeps q's row
(`[1, BLOCK_D]`, float32), a running maximum and sum (`[1, 1]`) and a `[1, BLOCK_D]` sum of the
values. It walks the keys `BLOCK_N` at a time: loads a `[BLOCK_N, BLOCK_D]` tile of K and of V
once for all rows (kv head `head // group`: a grouped query reads its kv head's rows, never a
copy), and for each row: the scores as the row sums of the K tile times q's row, scaled, plus the
mask; keys past Lk at -inf; then the
online softmax (Milakov and Gimelshein): the new maximum, the old sums scaled by
`exp(old - new)`, and the V tile's rows weighted by `exp(score - new)` added. After the walk each
row is the sum of values over the sum of weights (0 where every key is masked, as ATen's fused
kernels give) and is stored at the output's layout. The head dim is padded to `BLOCK_D` (a power
of two) and masked: GPT-NeoX's 80 reads 128 lanes, 48 of them masked.

q's value and the mask's are the kernel's `Assign(QUERY)` and `Assign(MASK)`, printed by the
statement printer of every kernel (`KernelPrinter`): a load of the operand, or its producer's
expression (a prologue: the rotary embedding of q). q's is printed once per row before the walk
on a `[1, BLOCK_D]` row (its `r` the head dim, `dindex`), the mask's inside it on a `[BLOCK_N, 1]`
column (its `x` the key position, `nindex`), and the output's `Store` after it on q's row; the
loop variables (b, h, i, d or n) are the program's `batch` and `head`, the row's number, and the
block's index. Sizes and strides are static, printed as numbers.

The launch: as a matmul template's ([Note: a template launches as a kernel of its programs] in
matmul.py), `xnumel` programs with `XBLOCK = 1`; `ATTENTION_CONFIG` in the source gives the warps
and stages.

Hands on: `print_template(kernel, buffers, interpret) -> str`, `programs(kernel) -> int`,
`attention_configs(lq, lk, d, dtype)` (what the printer offers the pass), `launch(config)`.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.triton import ops
from kiln.codegen.triton.index import IndexPrinter, LoopSpace
from kiln.codegen.triton.ops import Value
from kiln.codegen.triton.printer import KernelPrinter, assemble

# Triton's `@jit` library functions (`tl.sum`, `tl.zeros`) do not run under the interpreter as kiln
# loads sources (ops.py's docstring): the reductions are `tl.reduce` with Triton's own combines
_REDUCE, _ADD, _MAX = "tl.reduce", "tl.standard._sum_combine", "tl.standard._elementwise_max"
TILE_ELEMENTS = 8192
# One program a (batch, head) walks all the keys; without the split of the keys over programs
# (flash-decoding, not built) a long cache would be read by B x H programs only (32 for a batch-1
# LLaMA-1.1B, a quarter of an H100's SMs), so past this many keys the extern's kernel is kept.
# Untimed: a bound that covers the decoding benchmark's caches (58 and 768 keys) and chat lengths.
MAX_KEYS = 2048
BATCH = sympy.Symbol("batch", integer=True, nonnegative=True)
HEAD = sympy.Symbol("head", integer=True, nonnegative=True)


def attention_configs(lq: int, lk: int, d: int, dtype) -> list[ir.AttentionConfig]:
    """The config for an attention of `lq` query rows over `lk` keys of head dim `d`: the head dim
    padded to a power of two, and blocks of keys whose K and V tiles hold `TILE_ELEMENTS` each (half
    as many for several rows, whose products and weights are live at once), at 8 warps. Untimed:
    chosen by compiling for sm_90 offline (`offline.compile_for_gpu`), the largest tiles without
    register spills at LLaMA-1.1B's (d 64) and dolly's (d 80) shapes, 1 and 4 rows. None past
    `MAX_KEYS` keys."""
    if lk > MAX_KEYS:
        return []
    block_d = max(16, 1 << (d - 1).bit_length())
    elements = TILE_ELEMENTS if lq == 1 else TILE_ELEMENTS // 2
    block_n = max(16, min(elements // block_d, 1 << (lk - 1).bit_length()))
    return [ir.AttentionConfig(BLOCK_N=block_n, BLOCK_D=block_d, num_warps=8, num_stages=2)]


def programs(kernel: ir.Kernel) -> int:
    b, h = (int(r) for r in kernel.ranges[:2])
    return b * h


def launch(config: dict):
    """The launch of an attention template (`ATTENTION_CONFIG`): one (batch, head) a program."""
    from kiln.codegen.triton.heuristics import LaunchConfig
    tiling = ir.AttentionConfig(**config)
    return LaunchConfig(XBLOCK=1, num_warps=tiling.num_warps, num_stages=tiling.num_stages, template=f"attention {tiling}")


def _printer(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool, space: LoopSpace,
             tile: tuple[str, str], indent: int, counter: int) -> KernelPrinter:
    """A statement printer whose only loop is `space` (the head dim as `r`, or the keys as `x`)."""
    p = KernelPrinter(kernel, buffers, interpret, persistent=True, tile=tile)
    p.index = IndexPrinter([space], {})
    p.out.indent = indent
    p.out.counter = counter     # the printers share one function: their temporaries must differ
    return p


def _row(expr: ir.ScalarExpr, i: int, last) -> ir.ScalarExpr:
    """`expr` (at b, h, i, last) on row `i` of the program: b, h the program's, the last dim `last`."""
    return ir.subs_index(expr, {ir.loop_var(0): BATCH, ir.loop_var(1): HEAD, ir.loop_var(2): sympy.Integer(i),
                                ir.loop_var(3): last})


def _pointer(p: KernelPrinter, view: ir.ViewArg, group: int) -> str:
    """The start of the program's kv head in a `[B, Hkv, Lk, D]` view."""
    sb, sh = (int(s) for s in view.strides[:2])
    terms = [str(int(view.offset))] if int(view.offset) else []
    terms += [f"batch * {sb}"] if sb and int(view.sizes[0]) > 1 else []
    terms += [f"(head // {group}) * {sh}" if group > 1 else f"head * {sh}"] if sh and int(view.sizes[1]) > 1 else []
    return f"{p.ptr(view.name)} + ({' + '.join(terms) or '0'})"


def _print_function(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    product: ir.AttentionProduct = kernel.template
    config = product.config
    b, h, lq, d = (int(r) for r in kernel.ranges)
    lk = int(product.key.sizes[2])
    (stage,) = kernel.stages
    # q's Assign, the mask's if any, the output's Store, in that order (`canonical_kernel` renames
    # the Assigns: their order says which is which)
    query, *masks = (s.expr for s in stage.body if isinstance(s, ir.Assign))
    mask = masks[0] if masks else None
    store = next(s for s in stage.body if isinstance(s, ir.Store))
    r0, x0 = ir.reduction_var(0), ir.loop_var(0)

    rows = _printer(kernel, buffers, interpret, LoopSpace("r", (sympy.Integer(d),), "dindex"), ("1", "BLOCK_D"), 1, 0)
    lines = ["pid = tl.program_id(0).to(INDEX_DTYPE)",
             f"batch = pid // {h}" if b > 1 else "batch = 0",
             f"head = pid % {h}",
             "# [Note: decode attention] one program a (batch, query head), its rows' online softmax over the keys",
             "dindex = tl.arange(0, BLOCK_D).to(INDEX_DTYPE)[None, :]",
             f"rmask0 = dindex < {d}",
             "r0_ = dindex   # the head dim as the statement printer names it"]
    head = [l.strip() for l in lines]
    for i in range(lq):
        v = rows.value(_row(query, i, r0))
        rows.out.line(f"q_{i} = tl.where(rmask0, {ops.float32_block(v, '[1, BLOCK_D]')}, 0.0)")
        rows.out.line(f"m_{i} = tl.full([1, 1], float('-inf'), tl.float32)")
        rows.out.line(f"l_{i} = tl.full([1, 1], 0, tl.float32)")
        rows.out.line(f"acc_{i} = tl.full([1, BLOCK_D], 0, tl.float32)")
    keys = _printer(kernel, buffers, interpret, LoopSpace("x", (sympy.Integer(lk),), "nindex"), ("BLOCK_N", "1"), 2,
                    rows.out.counter + 1000)
    body = [
        "nindex = (n0 + tl.arange(0, BLOCK_N)).to(INDEX_DTYPE)[:, None]",
        f"xmask = nindex < {lk}",
        "x0_ = nindex",
        f"k_tile = tl.load(k_rows + nindex * {int(product.key.strides[2])} + dindex * {int(product.key.strides[3])}, "
        f"xmask & rmask0, other=0).to(tl.float32)",
        f"v_tile = tl.load(v_rows + nindex * {int(product.value.strides[2])} + dindex * {int(product.value.strides[3])}, "
        f"xmask & rmask0, other=0).to(tl.float32)",
    ]
    keys.out.lines += ["        " + line for line in body]
    for i in range(lq):
        score = f"{_REDUCE}(k_tile * q_{i}, 1, {_ADD})[:, None] * {product.scale!r}"
        keys.out.line(f"s_{i} = {score}")
        if mask is not None:
            keys.out.line(f"s_{i} = s_{i} + {ops.float32_block(keys.value(_row(mask, i, x0)), '[BLOCK_N, 1]')}")
        keys.out.line(f"s_{i} = tl.where(xmask, s_{i}, float('-inf'))")
        keys.out.line(f"m_new = tl.maximum(m_{i}, {_REDUCE}(s_{i}, 0, {_MAX})[None, :])")
        keys.out.line("m_use = tl.where(m_new == float('-inf'), 0.0, m_new)   # every key so far masked")
        keys.out.line(f"alpha = tl.exp(m_{i} - m_use)")
        keys.out.line(f"p = tl.exp(s_{i} - m_use)")
        keys.out.line(f"l_{i} = l_{i} * alpha + {_REDUCE}(p, 0, {_ADD})[None, :]")
        keys.out.line(f"acc_{i} = acc_{i} * alpha + {_REDUCE}(p * v_tile, 0, {_ADD})[None, :]")
        keys.out.line(f"m_{i} = m_new")
    rows.out.line(f"k_rows = {_pointer(rows, product.key, product.key_group)}")
    rows.out.line(f"v_rows = {_pointer(rows, product.value, product.value_group)}")
    loop = [f"    for n0 in range(0, {lk}, BLOCK_N):"] + keys.out.lines
    after = _printer(kernel, buffers, interpret, LoopSpace("r", (sympy.Integer(d),), "dindex"), ("1", "BLOCK_D"), 1,
                     keys.out.counter + 1000)
    after.out.line("xmask = tl.full([1, 1], 1, tl.int1)   # the output's row: one, unmasked")
    for i in range(lq):
        after.out.line(f"out_{i} = tl.where(l_{i} > 0, acc_{i} / l_{i}, 0.0)")
        after.vars[ir.ACCUMULATOR] = Value(f"out_{i}", frozenset("r"), torch.float32)
        after.store(dataclasses.replace(store, index=sympy.sympify(store.index).xreplace(
            {ir.loop_var(0): BATCH, ir.loop_var(1): HEAD, ir.loop_var(2): sympy.Integer(i), ir.loop_var(3): r0})))
    params = [rows.ptr(name) for name in kernel.buffer_args]
    params += ["xnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "INDEX_DTYPE: tl.constexpr"]
    text = "\n".join(["    " + line for line in head] + rows.out.lines + loop + after.out.lines)
    return f"@triton.jit\ndef {kernel.name}({', '.join(params)}):\n{text}\n"


def print_template(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    """The module source of an attention template's kernel (`printer.print_canonical` of one)."""
    config = kernel.template.config
    constants = [f"{name} = tl.constexpr({getattr(config, name)})" for name in ("BLOCK_N", "BLOCK_D")]
    constants.append(f"ATTENTION_CONFIG = {dataclasses.asdict(config)!r}  # the launch: one (batch, head) a program")
    return assemble(kernel, [_print_function(kernel, buffers, interpret)], constants, interpret)
