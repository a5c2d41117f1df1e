"""The Triton convolution template: a template kernel whose product is an `ir.ConvProduct` (a 2-D
convolution as an implicit GEMM) to Triton source.

A program computes one `BLOCK_M x BLOCK_N` tile of the GEMM, rows m the output pixels
(n, ho, wo) and columns the output channels, walking K tap by tap and `BLOCK_K` input channels at a
time in one flat loop, each A tile gathered from the image at the tap's window ([Note: convolution
templates] in kiln/codegen/conv_templates.py has the index math and what is refused). The programs,
their grouped order, the launch and the `tl.dot` are the matmul template's (triton/matmul.py:
[Note: a template launches as a kernel of its programs]); so is the epilogue, printed on the tile
by `TilePrinter` with the tile's rows standing for the result's (n, ho, wo) and its columns for co.

Hands on: `print_template(kernel, buffers, interpret) -> str`, `programs(kernel) -> int`.
"""
from __future__ import annotations

from typing import Mapping

import sympy

from kiln.codegen import ir
from kiln.codegen.triton.matmul import (TilePrinter, plus_terms, dot_operands, on_tile, template_decorator, tile_lines,
                                        tiling_constants)
from kiln.codegen.triton.printer import assemble


def _shape(kernel: ir.Kernel) -> tuple[int, int, int, int]:
    """The result's (N, Cout, Hout, Wout)."""
    batch, cout, hout, wout = (int(r) for r in kernel.ranges)
    return batch, cout, hout, wout


def _grid(kernel: ir.Kernel) -> tuple[int, int]:
    """(row tiles, column tiles) of the GEMM: M = N*Hout*Wout rows, Cout columns."""
    config = kernel.template.config
    batch, cout, hout, wout = _shape(kernel)
    return -(-(batch * hout * wout) // config.BLOCK_M), -(-cout // config.BLOCK_N)


def programs(kernel: ir.Kernel) -> int:
    rows, columns = _grid(kernel)
    return rows * columns


def _bounds(first: int, last: int, size: int, name: str) -> list[str]:
    """The tests an image row (column) index `name` needs, its value running from `first` (the
    first output's first tap) to `last` (the last output's last tap): only those it can fail."""
    return ([f"({name} >= 0)"] if first < 0 else []) + ([f"({name} < {size})"] if last >= size else [])


def _sum_lines(kernel: ir.Kernel, tile: TilePrinter, buffers: Mapping[str, ir.Buffer], interpret: bool) -> list[str]:
    """The tile's sum over K: [Note: convolution templates]'s implicit GEMM, `tl.dot`s of image
    tiles gathered at each tap's window and weight tiles."""
    product: ir.ConvProduct = kernel.template
    batch, cout, hout, wout = _shape(kernel)
    m = batch * hout * wout
    rows, columns = _grid(kernel)
    _, cin, height, width = (int(s) for s in product.a.sizes)
    x_n, x_c, x_h, x_w = (int(s) for s in product.a.strides)
    w_o, w_c, w_h, w_w = (int(s) for s in product.b.strides)
    kh, kw = (int(s) for s in product.b.sizes[2:])
    (sh, sw), (ph, pw) = product.stride, product.padding
    block_k = product.config.BLOCK_K
    blocks = -(-cin // block_k)           # K steps a tap
    widen, precision = dot_operands(product, buffers, interpret)
    x, w = tile.ptr(product.a.name), tile.ptr(product.b.name)
    lines = tile_lines(rows, columns, m, cout) + [
        "# [Note: convolution templates] row m is the output pixel (n, ho, wo); rows past M (columns",
        "# past Cout) are read at m % M (co % Cout) and never stored",
        f"pixel = xindex % {m}",
        f"h0 = ((pixel // {wout}) % {hout}) * {sh} - {ph}",
        f"w0 = (pixel % {wout}) * {sw} - {pw}",
        f"a_image = {x} + ({plus_terms(int(product.a.offset))}(pixel // {hout * wout}) * {x_n})",
        f"b_columns = {w} + ({plus_terms(int(product.b.offset))}(rindex % {cout}) * {w_o})",
        f"{ir.ACCUMULATOR} = tl.full([BLOCK_M, BLOCK_N], 0, tl.float32)",
        f"# K: {kh}x{kw} taps of {cin} channels, {blocks} steps of BLOCK_K channels a tap",
        f"for step in range(0, {kh * kw * blocks}):",
    ]
    body = []
    if kh * kw > 1:
        body += [f"tap = step // {blocks}" if blocks > 1 else "tap = step", f"i = tap // {kw}", f"j = tap % {kw}"]
        i, j = "i", "j"
    else:
        i = j = "0"
    body += [f"kindex = (step % {blocks}) * BLOCK_K + tl.arange(0, BLOCK_K).to(INDEX_DTYPE)" if blocks > 1
             else "kindex = tl.arange(0, BLOCK_K).to(INDEX_DTYPE)"]
    h = "h0" if i == "0" else f"(h0 + {i})"
    v = "w0" if j == "0" else f"(w0 + {j})"
    inside = _bounds(-ph, (hout - 1) * sh - ph + kh - 1, height, h) + _bounds(-pw, (wout - 1) * sw - pw + kw - 1, width, v)
    a_mask = inside + ([f"(kindex[None, :] < {cin})"] if cin % block_k else [])
    b_mask = f", kindex[:, None] < {cin}, other=0" if cin % block_k else ""
    a_mask_text = f", {' & '.join(a_mask)}, other=0" if a_mask else ""
    tap_w = "" if i == "0" and j == "0" else f" + {i} * {w_h} + {j} * {w_w}"
    body += [
        f"a_tile = tl.load(a_image + ({h} * {x_h} + {v} * {x_w}) + kindex[None, :] * {x_c}{a_mask_text}){widen}",
        f"b_tile = tl.load(b_columns{tap_w} + kindex[:, None] * {w_c}{b_mask}){widen}",
        f"{ir.ACCUMULATOR} = tl.dot(a_tile, b_tile, {ir.ACCUMULATOR}{precision})",
    ]
    return lines + ["    " + line for line in body]


def _print_function(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    batch, cout, hout, wout = _shape(kernel)
    rows = tuple(sympy.Integer(s) for s in (batch, hout, wout))
    tile = TilePrinter(kernel, buffers, interpret, dims=(rows, (sympy.Integer(cout),)))
    # the result's (n, co, ho, wo) -> the tile's row dims (x0, x1, x2) = (n, ho, wo) and its column r0 = co
    rename = {ir.loop_var(0): ir.loop_var(0), ir.loop_var(1): ir.reduction_var(0),
              ir.loop_var(2): ir.loop_var(1), ir.loop_var(3): ir.loop_var(2)}
    epilogue = tile.epilogue(on_tile(kernel, rename))
    lines = ["tile = tl.program_id(0)"] + _sum_lines(kernel, tile, buffers, interpret)
    params = [tile.ptr(name) for name in kernel.buffer_args]
    params += ["xnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "INDEX_DTYPE: tl.constexpr"]
    body = "\n".join("    " + line for line in lines) + "\n" + "\n".join(epilogue)
    return f"{template_decorator(kernel, interpret)}\ndef {kernel.name}({', '.join(params)}):\n{body}\n"


def print_template(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], interpret: bool) -> str:
    """The module source of a convolution template kernel (`printer.print_canonical` of one)."""
    return assemble(kernel, [_print_function(kernel, buffers, interpret)], tiling_constants(kernel.template.config), interpret)
