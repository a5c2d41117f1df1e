"""The layout pass: channels-last activations around CPU convolutions, and buffers computed
elementwise from a permuted input laid out in that input's order (all devices).

oneDNN (ATen's CPU convolution) computes in a channels-last layout; given an NCHW input it reorders
the input and the output on every call, which costs as much as the convolution itself on small
images. Given a channels-last (NHWC) input, it reads it in place and returns a channels-last output.
So, on CPU, a 4-d buffer that kiln computes and a convolution reads gets NHWC strides, and so does
that convolution's output: chains conv -> (batch norm, activation, residual add, pooling) -> conv
then never leave NHWC, and the fused pointwise kernels between them (whose loop-order pass puts the
channel dim innermost) read and write it at unit stride.

The pass runs on the loop IR between lowering and scheduling and changes only buffer strides: a
ComputedBuffer's store follows its buffer's strides (the scheduler computes it), and every load of a
relaid buffer is rewritten from the old flat offset to the new one (per-dim indices recovered by
div/mod, which the loop bounds then simplify away). Graph inputs, outputs, constants and buffers
read through a strided view (`ViewArg`) or by an extern other than a convolution keep their
layout: their strides are a contract with code outside the kernels. A convolution reading a buffer
kiln does not compute (a graph's image input) reads a channels-last copy of it (one cheap pass).
Upstream of a relaid buffer, a 4-d buffer of the same batch and channels computed elementwise
(pooling's input, an activation) follows it.

[Note: layouts that follow their input] `linear` under autocast casts its float32 weight to
bfloat16 and multiplies by its transpose: `mm(x, convert(permute(W)))`. Laid out contiguously in
the permuted order, that cast reads W down its columns, one element per 2 KB row: on the H200 it
ran at a fifth of the copy bandwidth, 3.9 ms of LLaMA-1.1B's 26 ms inference step. Eager's `_to_copy`
keeps the input's strides instead (preserve_format), and cuBLAS takes either a row-major or a
column-major operand at the same speed. So a buffer computed elementwise, of static sizes, whose
main input (the load of as many elements as it has) is read in another dim order takes that order:
its kernel reads and writes at unit stride. Consumers see only its strides: kernels re-index their
loads; a matmul operand may take a transposed matrix, no other extern reads it (they are pinned).
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.indexing import simplify_index
from kiln.codegen.ir import loop_var, reduction_var


def channels_last_strides(sizes) -> tuple[sympy.Expr, ...]:
    """NHWC strides of an (N, C, H, W) buffer, as torch.channels_last computes them."""
    n, c, h, w = (sympy.sympify(s) for s in sizes)
    return (h * w * c, sympy.Integer(1), w * c, c)


def _is_convolution(node) -> bool:
    return isinstance(node, ir.ExternKernel) and getattr(node.op, "__name__", "").split(".")[0] == "convolution"


def _view_names(value) -> set[str]:
    leaves = torch.utils._pytree.tree_leaves(value)
    return {a.name for a in leaves if isinstance(a, ir.ViewArg)}


def plan_channels_last(graph: ir.Graph) -> dict[str, tuple]:
    """Buffer name -> new (NHWC) strides, for the buffers the convolutions read and write."""
    buffers = graph.buffer_map()
    producer = {}
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            producer[node.buffer] = node
        else:
            for o in node.outputs:
                if o is not None:
                    producer[o] = node
    pinned = {b for b in graph.inputs if b is not None} | {b.name for b in graph.buffers if b.name.startswith("const")}
    pinned |= {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel):
            pinned |= _view_names((node.args, [v for _, v in node.kwargs]))
            if not _is_convolution(node):     # an eager op may care about its input's strides
                pinned |= {a.name for a in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs]))
                           if isinstance(a, ir.BufferArg)}

    def relayable(name: str) -> bool:
        buf = buffers[name]
        return (name not in pinned and len(buf.sizes) == 4 and all(sympy.sympify(s).is_number for s in buf.sizes)
                and buf.strides == ir.contiguous_strides(buf.sizes) and buf.offset == 0)

    plan: dict[str, tuple] = {}
    for node in graph.nodes:
        if not _is_convolution(node) or not node.args or not isinstance(node.args[0], ir.BufferArg):
            continue
        x = node.args[0].name
        out = node.outputs[0] if node.outputs else None
        if out is None or len(buffers[x].sizes) != 4:
            continue
        source = producer.get(x)
        if x not in plan and relayable(x) and isinstance(source, ir.ComputedBuffer) \
                and isinstance(source.body, (ir.Pointwise, ir.Reduction)):
            plan[x] = channels_last_strides(buffers[x].sizes)
        if (x in plan or buffers[x].strides == channels_last_strides(buffers[x].sizes)) and relayable(out):
            plan[out] = channels_last_strides(buffers[out].sizes)
    # upstream: a 4-d buffer computed elementwise (activation, pooling) from another of the same
    # batch and channels goes channels-last with its source, so the kernel between them reads
    # and writes both at unit stride along the channels
    for node in reversed(graph.nodes):
        if not isinstance(node, ir.ComputedBuffer) or node.buffer not in plan or \
                not isinstance(node.body, ir.Pointwise):
            continue
        for ld in ir.loads_of(node.body.expr):
            a = ld.buffer
            if a in plan or not relayable(a) or buffers[a].sizes[:2] != buffers[node.buffer].sizes[:2]:
                continue
            source = producer.get(a)
            if isinstance(source, ir.ComputedBuffer) and isinstance(source.body, ir.Pointwise):
                plan[a] = channels_last_strides(buffers[a].sizes)
    return plan


def _channels_last_inputs(graph: ir.Graph) -> ir.Graph:
    """A convolution reading a buffer kiln does not compute (a graph input, an extern's result)
    reads a channels-last copy of it instead, so its output can be channels-last too."""
    buffers = graph.buffer_map()
    computed = {n.buffer for n in graph.nodes if isinstance(n, ir.ComputedBuffer)}
    new_buffers, nodes, copies = list(graph.buffers), [], {}
    for node in graph.nodes:
        if _is_convolution(node) and node.args and isinstance(node.args[0], ir.BufferArg):
            x = buffers[node.args[0].name]
            if x.name not in computed and len(x.sizes) == 4 and all(sympy.sympify(s).is_number for s in x.sizes) \
                    and x.strides != channels_last_strides(x.sizes) and node.outputs and node.outputs[0]:
                name = _channels_last_copy(x, copies, new_buffers, nodes)
                node = dataclasses.replace(node, args=(ir.BufferArg(name),) + tuple(node.args[1:]))
        nodes.append(node)
    if not copies:
        return graph
    return dataclasses.replace(graph, buffers=tuple(new_buffers), nodes=tuple(nodes))


def _relaid_index(index, old: ir.Buffer, new_strides, upper: dict) -> sympy.Expr:
    """The flat offset of the element at contiguous offset `index`, in the new strides."""
    index = sympy.sympify(index)
    out = sympy.Integer(0)
    for d, (size, old_stride, new_stride) in enumerate(zip(old.sizes, old.strides, new_strides)):
        i = sympy.floor(index / old_stride) if old_stride != 1 else index
        if d > 0:
            i = sympy.Mod(i, size)
        out = out + i * new_stride
    return simplify_index(out, upper)


def _node_bounds(body) -> dict:
    upper = {loop_var(k): sympy.sympify(r) for k, r in enumerate(body.ranges)}
    if isinstance(body, ir.Reduction):
        upper.update({reduction_var(k): sympy.sympify(r) for k, r in enumerate(body.reduction_ranges)})
    elif isinstance(body, ir.Scan):
        upper[reduction_var(0)] = sympy.sympify(body.scan_range)
    return upper


def apply_layouts(graph: ir.Graph, plan: dict[str, tuple]) -> ir.Graph:
    """`graph` with the planned buffers restrided and every load of them re-indexed."""
    if not plan:
        return graph
    old = graph.buffer_map()
    buffers = tuple(dataclasses.replace(b, strides=tuple(plan[b.name])) if b.name in plan else b
                    for b in graph.buffers)
    nodes = []
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            upper = _node_bounds(node.body)

            def fix(e, upper=upper):
                if isinstance(e, ir.Load) and e.buffer in plan:
                    return dataclasses.replace(e, index=_relaid_index(e.index, old[e.buffer], plan[e.buffer], upper))
                return e
            node = dataclasses.replace(node, body=dataclasses.replace(node.body, expr=ir.map_expr(node.body.expr, fix)))
        nodes.append(node)
    return dataclasses.replace(graph, buffers=buffers, nodes=tuple(nodes))


def _is_channels_last(buf: ir.Buffer) -> bool:
    """Whether `buf` is laid out as NHWC, ignoring the strides of size-1 dims (as torch does)."""
    want = channels_last_strides(buf.sizes)
    return all(sympy.sympify(size) == 1 or sympy.sympify(a) == sympy.sympify(b)
               for size, a, b in zip(buf.sizes, buf.strides, want))


def _channels_last_weights(graph: ir.Graph) -> ir.Graph:
    """A convolution whose input is channels-last reads a channels-last copy of its weight.

    ATen's CPU convolution converts an NCHW weight to the input's layout on every call (a clone
    through the dispatcher); a fused copy kernel of kiln's does the same work for less."""
    buffers = graph.buffer_map()
    computed = {n.buffer for n in graph.nodes if isinstance(n, ir.ComputedBuffer)}
    new_buffers, nodes, copies = list(graph.buffers), [], {}
    for node in graph.nodes:
        if _is_convolution(node) and len(node.args) > 1 and all(isinstance(a, ir.BufferArg) for a in node.args[:2]):
            x, w = buffers[node.args[0].name], buffers[node.args[1].name]
            if len(x.sizes) == 4 and _is_channels_last(x) and len(w.sizes) == 4 and w.name not in computed \
                    and all(sympy.sympify(s).is_number for s in w.sizes) and not _is_channels_last(w):
                name = _channels_last_copy(w, copies, new_buffers, nodes)
                node = dataclasses.replace(node, args=(node.args[0], ir.BufferArg(name)) + tuple(node.args[2:]))
        nodes.append(node)
    if not copies:
        return graph
    return dataclasses.replace(graph, buffers=tuple(new_buffers), nodes=tuple(nodes))


# Matrix products and the argument positions of their matrix operands: each takes a row-major or a
# column-major matrix (the last two dims) as it comes.
_MATMUL_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}


def _extern_name(node) -> str:
    return getattr(node.op, "__name__", "").split(".")[0]


def _source_order(body: ir.Pointwise, buf: ir.Buffer, buffers: dict) -> tuple[int, ...] | None:
    """The order (outermost first) in which `body`'s main input holds the output's dims, when every
    dim of size > 1 steps by its own constant stride in it; None when there is no such input."""
    dims = [k for k, size in enumerate(buf.sizes) if sympy.sympify(size) != 1]
    for ld in ir.loads_of(body.expr):
        source = buffers.get(ld.buffer)
        if ld.indirect or source is None or sympy.sympify(source.numel) != sympy.sympify(buf.numel):
            continue
        index = sympy.expand(simplify_index(sympy.sympify(ld.index), _node_bounds(body)))
        steps = {k: index.coeff(loop_var(k)) for k in dims}
        if not all(c.is_number and c > 0 for c in steps.values()) or len(set(steps.values())) < len(dims):
            continue
        if (index - sum(c * loop_var(k) for k, c in steps.items())).free_symbols:
            continue       # not linear in the loop vars (a gather, a wrapped index)
        inner = sorted(dims, key=lambda k: -steps[k])
        # dims of size 1 keep their place (their stride is free); only the order of the rest matters
        order, rest = [], iter(inner)
        for k in range(len(buf.sizes)):
            order.append(next(rest) if k in dims else k)
        return tuple(order)
    return None


def _strides_in_order(sizes, order: tuple[int, ...]) -> tuple[sympy.Expr, ...]:
    strides = [sympy.Integer(0)] * len(sizes)
    running = sympy.Integer(1)
    for k in reversed(order):
        strides[k] = running
        running = running * sympy.sympify(sizes[k])
    return tuple(strides)


def _dense(buf: ir.Buffer) -> bool:
    """Whether `buf`'s strides are a permutation of some order's contiguous strides."""
    dims = sorted(range(len(buf.sizes)), key=lambda k: -int(buf.strides[k]))
    return _strides_in_order(buf.sizes, tuple(dims)) == tuple(sympy.sympify(x) for x in buf.strides) or any(
        int(s) == 1 for s in buf.sizes)


def plan_input_order(graph: ir.Graph) -> dict[str, tuple]:
    """Buffer name -> strides in its main input's dim order ([Note: layouts that follow their input])."""
    buffers = graph.buffer_map()
    pinned = {b for b in graph.inputs if b is not None} | {b.name for b in graph.buffers if b.name.startswith("const")}
    pinned |= {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    operands: set[str] = set()
    for node in graph.nodes:
        if not isinstance(node, ir.ExternKernel):
            continue
        positions = _MATMUL_OPERANDS.get(_extern_name(node), ())
        for i, arg in enumerate(node.args):
            if i in positions and isinstance(arg, ir.BufferArg):
                operands.add(arg.name)
            else:
                pinned |= {a.name for a in torch.utils._pytree.tree_leaves(arg) if isinstance(a, (ir.BufferArg, ir.ViewArg))}
        pinned |= {a.name for a in torch.utils._pytree.tree_leaves([v for _, v in node.kwargs])
                   if isinstance(a, (ir.BufferArg, ir.ViewArg))}
    plan: dict[str, tuple] = {}
    for node in graph.nodes:
        if not isinstance(node, ir.ComputedBuffer) or not isinstance(node.body, ir.Pointwise) or node.buffer in pinned:
            continue
        buf = buffers[node.buffer]
        if len(buf.sizes) < 2 or not all(sympy.sympify(s).is_number for s in buf.sizes) or buf.offset != 0 \
                or not _dense(buf):
            continue
        order = _source_order(node.body, buf, buffers)
        if order is None:
            continue
        n = len(buf.sizes)
        if node.buffer in operands and order not in (tuple(range(n)), tuple(range(n - 2)) + (n - 1, n - 2)):
            continue        # a matmul takes a matrix as it is or transposed, not any permutation
        strides = _strides_in_order(buf.sizes, order)
        if strides != tuple(sympy.sympify(x) for x in buf.strides):
            plan[node.buffer] = strides
    return plan


# [Note: aligned matmuls] cuBLAS's fast kernels need every matrix's rows to start on 16 bytes. GPT-2's
# logits are 50,257 wide: eager's and kiln's lm_head ran cuBLAS's 16-bit `align1` fallback, 2.5 ms of a
# 7.3 ms inference step where the aligned kernel takes 0.45 ms, and its two backward products 4.9 ms.
# So on CUDA a large product whose operand or result has a misaligned row pitch gets a buffer padded
# to 16 bytes a row: a result kiln computes is simply laid out padded (its readers follow its
# strides; the host hands the padded view to `out=`), and an operand it does not compute (an input,
# a view, an extern's result) or a graph output is copied once through a padded buffer, a pass over
# its bytes for a product that does M*N*K multiply-adds.
_ALIGN_BYTES = 16
_PAD_MIN_MACS = 1 << 27


def _row_pitch(buf_sizes, strides) -> tuple[int, int] | None:
    """(dim whose stride is the row pitch, that pitch) of a matrix laid out row- or column-major in
    its last two dims; None for any other layout."""
    sizes, strides = [int(x) for x in buf_sizes[-2:]], [int(x) for x in strides[-2:]]
    if strides[1] == 1 and strides[0] >= sizes[1]:
        return len(buf_sizes) - 2, strides[0]
    if strides[0] == 1 and strides[1] >= sizes[0]:
        return len(buf_sizes) - 1, strides[1]
    return None


def _padded_strides(sizes, strides, itemsize: int) -> tuple | None:
    """`strides` with the matrix's row pitch rounded up to _ALIGN_BYTES (outer dims scaled with it);
    None when it is aligned already or not a plain matrix layout."""
    sizes, strides = [int(x) for x in sizes], [int(x) for x in strides]
    found = _row_pitch(sizes, strides)
    if found is None or (found[1] * itemsize) % _ALIGN_BYTES == 0:
        return None
    pitch_dim, pitch = found
    unit = _ALIGN_BYTES // itemsize
    padded = -(-pitch // unit) * unit
    inner = len(sizes) - 1 if pitch_dim == len(sizes) - 2 else len(sizes) - 2
    out = list(strides)
    out[inner], out[pitch_dim] = 1, padded
    running = padded * sizes[inner]
    for k in reversed(range(len(sizes) - 2)):
        out[k] = running
        running *= sizes[k]
    return tuple(sympy.Integer(x) for x in out)


def _macs(node: ir.ExternKernel, buffers: dict) -> int:
    def sizes(arg):
        name = arg.name
        return [int(x) for x in (arg.sizes if isinstance(arg, ir.ViewArg) else buffers[name].sizes)]
    positions = _MATMUL_OPERANDS[_extern_name(node)]
    a, b = (sizes(node.args[i]) for i in positions)
    batch = a[0] if len(a) == 3 else 1
    return batch * a[-2] * a[-1] * b[-1]


def align_matmuls(graph: ir.Graph) -> ir.Graph:
    """[Note: aligned matmuls]: padded row pitches for the large CUDA products that lack them."""
    buffers = graph.buffer_map()
    if not any(str(b.device).startswith("cuda") for b in buffers.values()):
        return graph
    computed = {n.buffer: n for n in graph.nodes if isinstance(n, ir.ComputedBuffer)}
    pinned = {b for b in graph.inputs if b is not None} | {b.name for b in graph.buffers if b.name.startswith("const")}
    outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    readers: dict[str, int] = {}      # externs and views reading each buffer
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel):
            for a in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs])):
                if isinstance(a, (ir.BufferArg, ir.ViewArg)):
                    readers[a.name] = readers.get(a.name, 0) + 1
    plan: dict[str, tuple] = {}
    new_buffers, nodes = list(graph.buffers), []

    def static(sizes) -> bool:
        return all(sympy.sympify(x).is_number for x in sizes)

    for node in graph.nodes:
        name = _extern_name(node) if isinstance(node, ir.ExternKernel) else None
        if name not in _MATMUL_OPERANDS or not all(
                isinstance(node.args[i], (ir.BufferArg, ir.ViewArg)) for i in _MATMUL_OPERANDS[name]):
            nodes.append(node)
            continue
        operand_sizes = [node.args[i].sizes if isinstance(node.args[i], ir.ViewArg) else buffers[node.args[i].name].sizes
                         for i in _MATMUL_OPERANDS[name]]
        on_cuda = all(str(buffers[node.args[i].name].device).startswith("cuda") for i in _MATMUL_OPERANDS[name])
        if not on_cuda or not all(static(x) for x in operand_sizes) or _macs(node, buffers) < _PAD_MIN_MACS:
            nodes.append(node)
            continue
        args = list(node.args)
        for i in _MATMUL_OPERANDS[name]:
            arg = args[i]
            src = buffers[arg.name]
            sizes, strides = (arg.sizes, arg.strides) if isinstance(arg, ir.ViewArg) else (src.sizes, src.strides)
            itemsize = torch.empty((), dtype=src.dtype).element_size()
            padded = _padded_strides(sizes, strides, itemsize)
            if padded is None:
                continue
            if isinstance(arg, ir.BufferArg) and arg.name in computed and arg.name not in pinned | outputs \
                    and readers.get(arg.name) == 1 and isinstance(computed[arg.name].body, ir.Pointwise) \
                    and src.offset == 0 and arg.name not in plan:
                plan[arg.name] = padded           # computed by a kernel of ours: lay it out padded
                continue
            copy = f"{arg.name}_a{i}_{len(nodes)}"   # an input, a view, an extern's result: copy it once
            new_buffers.append(ir.Buffer(copy, tuple(sizes), padded, src.dtype, src.device))
            lv = [loop_var(k) for k in range(len(sizes))]
            index = (ir.as_expr(arg.offset) + sum(v * ir.as_expr(st) for v, st in zip(lv, arg.strides))
                     if isinstance(arg, ir.ViewArg) else src.index(lv))
            nodes.append(ir.ComputedBuffer(copy, ir.Pointwise(tuple(sizes), ir.Load(arg.name, index, src.dtype))))
            args[i] = ir.BufferArg(copy)
        out = node.outputs[0] if len(node.outputs) == 1 else None
        node = dataclasses.replace(node, args=tuple(args))
        if out is not None:
            buf = buffers[out]
            padded = _padded_strides(buf.sizes, buf.strides, torch.empty((), dtype=buf.dtype).element_size())
            if padded is not None and out not in pinned and buf.offset == 0:
                if out in outputs or readers.get(out):    # its layout is a contract: compute padded, copy out
                    wide = f"{out}_aligned"
                    new_buffers.append(ir.Buffer(wide, buf.sizes, padded, buf.dtype, buf.device))
                    nodes.append(dataclasses.replace(node, outputs=(wide,)))
                    lv = [loop_var(k) for k in range(len(buf.sizes))]
                    node = ir.ComputedBuffer(out, ir.Pointwise(buf.sizes, ir.Load(
                        wide, sum(v * st for v, st in zip(lv, padded)), buf.dtype)))
                else:
                    plan[out] = padded
        nodes.append(node)
    graph = dataclasses.replace(graph, buffers=tuple(new_buffers), nodes=tuple(nodes))
    return apply_layouts(graph, plan)


def optimize_layouts(graph: ir.Graph) -> ir.Graph:
    """The pass: channels-last around convolutions on CPU, then buffers that follow their input's
    order on every device (see the module docstring)."""
    if not graph.buffers:
        return graph
    if all(b.device == "cpu" for b in graph.buffers):   # CUDA graphs keep ATen's layouts around convolutions
        graph = _channels_last_inputs(graph)
        graph = apply_layouts(graph, plan_channels_last(graph))
        graph = _channels_last_weights(graph)
    graph = apply_layouts(graph, plan_input_order(graph))
    return align_matmuls(graph)


def _channels_last_copy(x: ir.Buffer, copies: dict, new_buffers: list, nodes: list) -> str:
    """The name of a channels-last copy of `x`, adding the copy (once per buffer) to the graph."""
    name = copies.get(x.name)
    if name is None:
        name = copies[x.name] = f"{x.name}_nhwc"
        new_buffers.append(ir.Buffer(name, x.sizes, channels_last_strides(x.sizes), x.dtype, x.device))
        index = x.index([loop_var(k) for k in range(4)])
        nodes.append(ir.ComputedBuffer(name, ir.Pointwise(x.sizes, ir.Load(x.name, index, x.dtype))))
    return name
