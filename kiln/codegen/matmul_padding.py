"""Zero-padded matrix products on CUDA: every dim of a large product a multiple of 16 bytes.

[Note: aligned matmuls] cuBLAS's fast kernels need each matrix's sizes and row pitches in multiples
of 16 bytes. GPT-2's logits are 50,257 wide: its lm_head ran cuBLAS's 16-bit `align1` fallback, 3.4
ms of a 10.8 ms inference step on the H200, where Inductor's padded product took 0.44 ms, and the two
backward products 5.9 ms. Giving the output a padded row pitch alone did not change cuBLAS's choice
(`bench/results/gpu-suite/20261201-211031_cuda_hf.md`): the odd size itself does. So, as Inductor's `pad_mm`,
the product is computed on zero-padded operands: for `A[.., M, K] @ B[.., K, N]` each misaligned
M, K, N rounds up, the padded K entries are zero in both operands (they add nothing), and the
result is read back in its [M, N] corner. An operand gets a padded copy (one pass over its bytes,
for a product of M*N*K multiply-adds; under autocast that copy replaces the weight's cast, which is
the kernel that computed it); the result is a padded buffer whose kernel readers load its corner
directly, or which is copied out once when it is a graph output or an extern reads it.
`addmm`'s bias pads with its product. Only products of at least `PAD_MIN_MACS` multiply-adds,
where the copies cost a fraction of the time they save.

[Note: padding products of symbolic sizes] Under dynamic=True the rows of a product are symbolic
(BERT's logits: `[16*s1, 768] @ [768, 30522]`), and products with a symbolic size were left
unpadded: the symbolic program multiplied by the 30522-wide weight where the static one, at every
length, multiplies by its 30528-wide padded copy. A static dim pads as before whatever the others
are; a symbolic dim is never padded (its alignment is known only at run time), so a plan that
would pad one, or copy an operand whose sizes or strides are symbolic, is dropped. The size rule
counts each symbol as `SYMBOLIC_DIM_GUESS`: the IR carries no hints, and the products this is for
(a vocabulary projection) are large at any length worth compiling for.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.indexing import Min
from kiln.codegen.ir import loop_var

ALIGN_BYTES = 16
PAD_MIN_MACS = 1 << 27
SYMBOLIC_DIM_GUESS = 128

# op -> (bias position or None, A position, B position)
_PRODUCTS = {"mm": (None, 0, 1), "bmm": (None, 0, 1), "addmm": (0, 1, 2), "baddbmm": (0, 1, 2)}


def extern_name(node) -> str:
    return getattr(node.op, "__name__", "").split(".")[0]


def _aligned(size, itemsize: int):
    """`size` rounded up to 16 bytes of `itemsize` elements; a symbolic size as it is."""
    if not size.is_number:
        return size
    unit = ALIGN_BYTES // itemsize
    return sympy.Integer(-(-int(size) // unit) * unit)


def _proven(rel) -> bool:
    """Whether a comparison of sizes holds for every value of their symbols."""
    return sympy.sympify(rel) is sympy.true


@dataclasses.dataclass(frozen=True)
class _Operand:
    """A buffer as an extern argument sees it: the whole buffer or a view of it."""

    name: str
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    offset: sympy.Expr

    @staticmethod
    def of(arg, buffers: dict) -> "_Operand":
        view = arg if isinstance(arg, ir.ViewArg) else buffers[arg.name]
        return _Operand(arg.name, tuple(map(ir.as_expr, view.sizes)), tuple(map(ir.as_expr, view.strides)),
                        ir.as_expr(view.offset))

    @property
    def static(self) -> bool:
        return all(e.is_number for e in (*self.sizes, *self.strides, self.offset))

    def pitch_aligned(self, itemsize: int) -> bool:
        """Whether the matrix (last two dims) is row- or column-major with a 16-byte pitch (proven
        for every value of a symbolic size)."""
        (rows, cols), (rs, cs) = self.sizes[-2:], self.strides[-2:]
        if cs == 1 and _proven(rs >= cols):
            return sympy.Mod(rs * itemsize, ALIGN_BYTES) == 0
        if rs == 1 and _proven(cs >= rows):
            return sympy.Mod(cs * itemsize, ALIGN_BYTES) == 0
        return rows == 1 or cols == 1


def _padded_copy(src: _Operand, target: tuple[int, ...], dtype, device, name: str) -> tuple[ir.Buffer, ir.ComputedBuffer]:
    """A buffer of sizes `target` holding `src` in its leading corner and zeros elsewhere, laid out in
    `src`'s own dim order. Loads are clamped into `src` (a GPU load is evaluated under the `where`)."""
    order = sorted(range(len(target)), key=lambda k: (-src.strides[k] if src.sizes[k] > 1 else -float("inf"), k))
    strides = [0] * len(target)
    running = 1
    for k in reversed(order):
        strides[k] = running
        running *= target[k]
    index, inside = sympy.Integer(src.offset), []
    for k, (size, stride) in enumerate(zip(src.sizes, src.strides)):
        v = loop_var(k)
        if target[k] != size:
            inside.append(ir.Op("lt", (ir.IndexValue(v), ir.IndexValue(sympy.Integer(size))), torch.bool))
            v = Min(v, size - 1)          # [Note: clamps that do not compare]
        index = index + v * stride
    expr = ir.Load(src.name, index, dtype)
    if inside:
        cond = inside[0]
        for c in inside[1:]:
            cond = ir.Op("logical_and", (cond, c), torch.bool)
        expr = ir.Op("where", (cond, expr, ir.Constant(0.0 if dtype.is_floating_point else 0, dtype)), dtype)
    buf = ir.Buffer(name, tuple(map(sympy.Integer, target)), tuple(map(sympy.Integer, strides)), dtype, device)
    return buf, ir.ComputedBuffer(name, ir.Pointwise(buf.sizes, expr))


def pad_matmuls(graph: ir.Graph, devices: tuple[str, ...] = ("cuda",)) -> ir.Graph:
    """[Note: aligned matmuls] for the products whose buffers live on `devices`."""
    buffers = graph.buffer_map()
    outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    extern_reads: set[str] = set()
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel):
            extern_reads |= {a.name for a in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs]))
                             if isinstance(a, (ir.BufferArg, ir.ViewArg))}
    new_buffers, nodes, corners = list(graph.buffers), [], {}   # corners: result -> its padded buffer
    for node in graph.nodes:
        name = extern_name(node) if isinstance(node, ir.ExternKernel) else None
        plan = _plan(node, name, buffers, devices) if name in _PRODUCTS else None
        if plan is None:
            nodes.append(node)
            continue
        targets, out_target = plan
        args = list(node.args)
        for i, target in targets.items():
            src = _Operand.of(args[i], buffers)
            dtype, device = buffers[src.name].dtype, buffers[src.name].device
            buf, copy = _padded_copy(src, target, dtype, device, f"{src.name}_pad{len(nodes)}_{i}")
            new_buffers.append(buf)
            nodes.append(copy)
            args[i] = ir.BufferArg(buf.name)
        out = node.outputs[0]
        node = dataclasses.replace(node, args=tuple(args))
        if out_target is None:
            nodes.append(node)
            continue
        wide = ir.Buffer(f"{out}_pad", tuple(out_target), ir.contiguous_strides(out_target),
                         buffers[out].dtype, buffers[out].device)
        new_buffers.append(wide)
        nodes.append(dataclasses.replace(node, outputs=(wide.name,)))
        corner = buffers[out]
        lv = [loop_var(k) for k in range(len(corner.sizes))]
        if out in outputs or out in extern_reads:      # its layout is a contract: copy the corner out
            nodes.append(ir.ComputedBuffer(out, ir.Pointwise(corner.sizes, ir.Load(wide.name, wide.index(lv), wide.dtype))))
        else:
            corners[out] = wide
    graph = dataclasses.replace(graph, buffers=tuple(new_buffers), nodes=tuple(nodes))
    return _read_corners(graph, corners) if corners else graph


def _plan(node: ir.ExternKernel, name: str, buffers: dict, devices) -> tuple[dict, tuple | None] | None:
    """(argument position -> padded sizes, padded result sizes or None), or None to leave it."""
    bias_at, a_at, b_at = _PRODUCTS[name]
    if len(node.outputs) != 1 or node.outputs[0] is None or not all(
            isinstance(node.args[i], (ir.BufferArg, ir.ViewArg)) for i in (a_at, b_at)):
        return None
    if not all(str(buffers[node.args[i].name].device).startswith(devices) for i in (a_at, b_at)):
        return None
    a, b = _Operand.of(node.args[a_at], buffers), _Operand.of(node.args[b_at], buffers)
    itemsize = torch.empty((), dtype=buffers[a.name].dtype).element_size()
    (m, k), n = a.sizes[-2:], b.sizes[-1]
    batch = a.sizes[0] if len(a.sizes) == 3 else sympy.Integer(1)
    macs = batch * m * k * n      # [Note: padding products of symbolic sizes]
    if macs.xreplace({s: SYMBOLIC_DIM_GUESS for s in macs.free_symbols}) < PAD_MIN_MACS:
        return None
    mp, kp, np_ = (_aligned(x, itemsize) for x in (m, k, n))
    targets = {}
    for i, op, want in ((a_at, a, (mp, kp)), (b_at, b, (kp, np_))):
        target = op.sizes[:-2] + want
        if target != op.sizes or not op.pitch_aligned(itemsize):
            if not op.static:
                return None       # a padded copy of symbolic sizes: not planned
            targets[i] = target
    if not targets:
        return None
    out_target = None
    if (mp, np_) != (m, n):
        out_target = a.sizes[:-2] + (mp, np_)
    if bias_at is not None and out_target is not None:
        bias = node.args[bias_at]
        if not isinstance(bias, (ir.BufferArg, ir.ViewArg)):
            return None
        src = _Operand.of(bias, buffers)
        if not src.static:
            return None
        if any(st == 0 and sz > 1 for sz, st in zip(src.sizes, src.strides)):
            return None        # a broadcast bias would pad into a full matrix
        full = out_target[-len(src.sizes):] if src.sizes else ()
        targets[bias_at] = tuple(1 if s == 1 else f for s, f in zip(src.sizes, full))
        if targets[bias_at] == src.sizes:
            del targets[bias_at]
    return targets, out_target


def _read_corners(graph: ir.Graph, corners: dict[str, ir.Buffer]) -> ir.Graph:
    """Kernels that read a padded result read its corner from the padded buffer itself: their loads
    re-indexed to its strides (`layout.apply_layouts`), then renamed to it."""
    from kiln.codegen.layout import apply_layouts
    graph = apply_layouts(graph, {name: wide.strides for name, wide in corners.items()})

    def rename(e):
        if isinstance(e, ir.Load) and e.buffer in corners:
            return dataclasses.replace(e, buffer=corners[e.buffer].name)
        return e
    nodes = tuple(dataclasses.replace(n, body=ir.map_body(n.body, rename))
                  if isinstance(n, ir.ComputedBuffer) else n for n in graph.nodes)
    buffers = tuple(b for b in graph.buffers if b.name not in corners)
    return dataclasses.replace(graph, buffers=buffers, nodes=nodes)
