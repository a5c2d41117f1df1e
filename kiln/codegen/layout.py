"""The layout pass: channels-last activations around convolutions, and buffers computed
elementwise from a permuted input laid out in that input's order.

oneDNN (ATen's CPU convolution) and cuDNN compute in a channels-last layout; given an NCHW input,
oneDNN reorders the input and the output on every call (as costly as the convolution itself on
small images), cuDNN runs transposing kernels around its NHWC engines (on the H200 resnet50's
inference spent 2 of its 4 ms of convolution in them) and ATen sends a depthwise convolution to
its slow native kernel (convnext_tiny: 4.9 ms against cuDNN's 1.3 ms in NHWC). Given channels-last
(NHWC) inputs, both read them in place and return channels-last outputs. So a 4-d buffer that
kiln computes and a convolution (or a convolution's gradient) reads gets NHWC strides, and so does
that convolution's output: chains conv -> (batch norm, activation, residual add, pooling) -> conv
then never leave NHWC, and the fused pointwise kernels between them (whose loop-order pass puts the
channel dim innermost) read and write it at unit stride.

The pass runs on the loop IR between lowering and scheduling and changes only buffer strides: a
ComputedBuffer's store follows its buffer's strides (the scheduler computes it), and every load of a
relaid buffer is rewritten from the old flat offset to the new one (per-dim indices recovered by
div/mod, which the loop bounds then simplify away). Graph inputs, outputs, constants and buffers
read by an extern other than a convolution (directly or through a strided view, `ViewArg`) keep
their layout: their strides are a contract with code outside the kernels. A buffer a convolution
reads through a view takes the strides that make the view channels-last, where some order of its
dims does ([Note: layouts through views]). A convolution reading a buffer
kiln does not compute (a graph's image input) reads a channels-last copy of it (one cheap pass).
Upstream of a relaid buffer, a 4-d buffer of the same batch and channels computed elementwise
(pooling's input, an activation) follows it. An extern's result whose strides are not the planned
ones is copied into them (the host program checks), so a plan that guesses a kernel's answer wrong
costs a copy, never a wrong result.

[Note: saved values in the layout of their producer] In training, the activations a convolution
reads are also what the forward saves for the backward: forward outputs, which would keep their
contiguous layout and keep the convolutions NCHW. The forward's outputs past its user outputs go
only to kiln's own backward, so they are the pass's to lay out (`free_outputs`). The forward
program reports the strides it returns (`output_strides`, kept in the program cache too), and
aot compiles the backward with its saved inputs in those strides (`_in_saved_layouts` in
kiln/aot/runtime.py): the backward's convolution gradients read NHWC activations and write NHWC
gradients. A backward compiled for other strides would still be right: its inputs are checked and
copied into the layout it was written for.

[Note: layouts through views] ShuffleNet's channel shuffle, `cat` then `view(b, 2, c/2, h, w)
.transpose(1, 2).contiguous().view(b, c, h, w)`, computes a 5-d buffer `[b, c/2, 2, h, w]` that the
next block's convolutions read through 4-d views: all its channels (a downsampling block), or one
half of them (`chunk`: a view at an offset). Left contiguous, every block ended in a kernel
writing NCHW from NHWC inputs (on a GPU: stores at a stride of C) and began with a convolution
of an NCHW input (cuDNN transposes around it); on the H100 shufflenet_v2 ran at 0.59x Inductor
(issue #35). The view's dims are groups of the buffer's (merged: the view's channel is `(c/2, 2)`),
so ordering the buffer's dims as their view dims go in NHWC, channels innermost, gives strides
`(c*h*w, 2, 1, w*c, c)` under which the full view reads `(c*h*w, 1, w*c, c)`: channels-last.
`_strides_for_view` finds them and checks the view they give; every view of the buffer is
re-strided with it (`_relaid_view`: the old view's offsets relaid and simplified, which must again
be affine), and the buffer's loads are re-indexed as any relaid buffer's. A half of the channels
reads `(c*h*w, 1, w*c, c)` at offset c/2: a channel range of an NHWC tensor, which ATen's
convolutions take as channels-last (they copy it dense: a coalesced copy, no transpose), and
answer channels-last, so the plan goes on through the block. A view that splits one of the
buffer's dims across view dims gets no such strides; its buffer keeps its layout.

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
from kiln.codegen.matmul_padding import extern_name, pad_matmuls


def channels_last_strides(sizes) -> tuple[sympy.Expr, ...]:
    """NHWC strides of an (N, C, H, W) buffer, as torch.channels_last computes them."""
    n, c, h, w = (sympy.sympify(s) for s in sizes)
    return (h * w * c, sympy.Integer(1), w * c, c)


def _contract_buffers(graph: ir.Graph, free_outputs: frozenset) -> set[str]:
    """Buffers whose strides are a contract with code outside the kernels: the graph's inputs,
    constants and outputs (but `free_outputs`, and every output read through a view)."""
    pinned = {b for b in graph.inputs if b is not None} | {b.name for b in graph.buffers if b.name.startswith("const")}
    pinned |= {o if isinstance(o, str) else o.name for o in graph.outputs
               if isinstance(o, ir.ViewArg) or (isinstance(o, str) and o not in free_outputs)}
    # a scatter's result shares the storage (and layout) of the buffer it writes into, and its
    # address is computed from index values the loop bounds do not know
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer) and isinstance(node.body, ir.Scatter):
            pinned |= {node.buffer, node.body.into} | {ld.buffer for ld in ir.body_loads(node.body)}
    return pinned


def _static_and_nonempty(sizes) -> bool:
    """Sizes known at compile time, none of them 0: a buffer with no elements has no layout to choose."""
    return all(sympy.sympify(s).is_number and sympy.sympify(s) != 0 for s in sizes)


def _op_name(node) -> str:
    return getattr(node.op, "__name__", "").split(".")[0] if isinstance(node, ir.ExternKernel) else ""


def _is_convolution(node) -> bool:
    return _op_name(node) == "convolution"


def _is_convolution_backward(node) -> bool:
    return _op_name(node) == "convolution_backward"


def _view_names(value) -> set[str]:
    leaves = torch.utils._pytree.tree_leaves(value)
    return {a.name for a in leaves if isinstance(a, ir.ViewArg)}


def plan_channels_last(graph: ir.Graph, free_outputs: frozenset = frozenset()) -> dict[str, tuple]:
    """Buffer name -> new (NHWC) strides, for the buffers the convolutions (and their gradients)
    read and write. `free_outputs`: graph outputs whose layout is no contract (a forward's values
    saved for its backward: [Note: saved values in the layout of their producer])."""
    buffers = graph.buffer_map()
    producer = {}
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            producer[node.buffer] = node
        else:
            for o in node.outputs:
                if o is not None:
                    producer[o] = node
    pinned = _contract_buffers(graph, free_outputs)
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel):
            if not (_is_convolution(node) or _is_convolution_backward(node)):   # an eager op may care
                pinned |= {a.name for a in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs]))
                           if isinstance(a, (ir.BufferArg, ir.ViewArg))}
            else:       # a convolution's view is re-strided with its buffer ([Note: layouts through views])
                pinned |= _view_names(node.args[1:] if _is_convolution(node) else node.args[2:])
                pinned |= _view_names([v for _, v in node.kwargs])
    views = _views_by_buffer(graph)

    def relayable(name: str, rank: int | None = 4) -> bool:
        buf = buffers[name]
        return (name not in pinned and (rank is None or len(buf.sizes) == rank) and _static_and_nonempty(buf.sizes)
                and buf.strides == ir.contiguous_strides(buf.sizes) and buf.offset == 0)

    def computed_elementwise(name: str) -> bool:
        source = producer.get(name)
        return isinstance(source, ir.ComputedBuffer) and isinstance(source.body, (ir.Pointwise, ir.Reduction))

    plan: dict[str, tuple] = {}

    def nhwc(arg) -> bool:
        if isinstance(arg, ir.ViewArg):
            return arg.name in plan and _channels_last_view(_relaid_view(arg, buffers[arg.name], plan[arg.name]))
        return arg.name in plan or _is_channels_last(buffers[arg.name])

    def restrides_views(name: str, strides) -> bool:
        """Whether every view a convolution reads of `name` is again a view under `strides`."""
        return all(_relaid_view(v, buffers[name], strides) is not None for v in views.get(name, ()))

    def relay(name: str) -> None:
        strides = channels_last_strides(buffers[name].sizes)
        if restrides_views(name, strides):
            plan[name] = strides

    def relay_through(view: ir.ViewArg) -> None:
        """Lay out `view`'s buffer so that the view reads it channels-last, if some order of the
        buffer's dims does that and its other views stay views ([Note: layouts through views])."""
        if view.name in plan or not relayable(view.name, rank=None) or not computed_elementwise(view.name):
            return
        buf = buffers[view.name]
        strides = _strides_for_view(buf, view)
        if strides is None or strides == tuple(buf.strides):
            return
        if restrides_views(view.name, strides):
            plan[view.name] = strides

    for node in graph.nodes:
        conv, grad = _is_convolution(node), _is_convolution_backward(node)
        if not (conv or grad) or not node.outputs:
            continue
        # convolution(x, w, ...) -> y; convolution_backward(dy, x, w, ...) -> (dx, dw, db)
        activations = [a for a in node.args[:2 if grad else 1] if isinstance(a, (ir.BufferArg, ir.ViewArg))]
        if not activations or any(len(a.sizes if isinstance(a, ir.ViewArg) else buffers[a.name].sizes) != 4
                                  for a in activations):
            continue
        for a in activations:
            if isinstance(a, ir.ViewArg):
                relay_through(a)
            elif a.name not in plan and relayable(a.name) and computed_elementwise(a.name):
                relay(a.name)
        weight = node.args[2 if grad else 1] if len(node.args) > (2 if grad else 1) else None
        if isinstance(weight, ir.BufferArg) and any(nhwc(a) for a in activations) and relayable(weight.name) \
                and computed_elementwise(weight.name):
            relay(weight.name)      # autocast's cast of the weight writes it channels-last
        # cuDNN and oneDNN answer in channels-last when an activation (or the weight) is channels-last
        out = node.outputs[0]
        if out and any(nhwc(a) for a in activations) and out not in plan and relayable(out):
            relay(out)
    # values saved for the backward (max pooling's window masks) go channels-last with the
    # activations: the backward reads them next to channels-last gradients
    if plan:
        for name in sorted(free_outputs):
            if name in buffers and name not in plan and relayable(name) and computed_elementwise(name):
                relay(name)
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
                relay(a)
    if plan:
        _relay_sideways(graph, buffers, producer, plan, relayable, nhwc, relay)
    return plan


def _relay_sideways(graph: ir.Graph, buffers: dict, producer: dict, plan: dict, relayable, nhwc, relay) -> None:
    """Sideways, to a fixed point: a 4-d buffer computed elementwise from buffers of its batch and
    channels whose layout is decided (inputs, planned buffers; the ones still undecided left out)
    and all channels-last goes channels-last too; one with no decided source (a pooling window's
    validity mask, computed from indices alone) follows its readers once every reader is planned. So the kernels beside channels-last gradients read
    every operand at unit stride along the channels (max pooling's gradient in a training step whose
    pool output was saved, [Note: values materialized on both sides] in kiln/aot/partition.py)."""
    readers: dict[str, list] = {}
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            for ld in ir.body_loads(node.body):
                readers.setdefault(ld.buffer, []).append(node)

    def undecided(name: str) -> bool:
        """A 4-d elementwise buffer this pass may still lay out: it follows, and is not followed."""
        source = producer.get(name)
        return name not in plan and relayable(name) and isinstance(source, ir.ComputedBuffer) \
            and isinstance(source.body, ir.Pointwise)

    changed = True
    while changed:
        changed = False
        for node in graph.nodes:
            if not isinstance(node, ir.ComputedBuffer) or not isinstance(node.body, ir.Pointwise) \
                    or node.buffer in plan or not relayable(node.buffer):
                continue
            nc = buffers[node.buffer].sizes[:2]
            sources = {ld.buffer for ld in ir.body_loads(node.body)
                       if len(buffers[ld.buffer].sizes) == 4 and buffers[ld.buffer].sizes[:2] == nc
                       and not undecided(ld.buffer)}
            if sources:
                follow = all(nhwc(ir.BufferArg(a)) for a in sources)
            else:
                users = readers.get(node.buffer, [])
                follow = bool(users) and all(u.buffer in plan for u in users)
            if follow:
                relay(node.buffer)
                changed = changed or node.buffer in plan


def _views_by_buffer(graph: ir.Graph) -> dict[str, list[ir.ViewArg]]:
    """Buffer name -> the views of it that externs read."""
    views: dict[str, list[ir.ViewArg]] = {}
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel):
            for v in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs])):
                if isinstance(v, ir.ViewArg):
                    views.setdefault(v.name, []).append(v)
    return views


def _relaid_view(view: ir.ViewArg, old: ir.Buffer, new_strides) -> ir.ViewArg | None:
    """`view` of `old` once `old` takes `new_strides`: the same elements, at the offsets the new
    strides give them, if those are again a strided view (affine in the view's indices); else None."""
    indices = [loop_var(k) for k in range(len(view.sizes))]
    flat = sympy.sympify(view.offset) + sum((i * sympy.sympify(st) for i, st in zip(indices, view.strides)),
                                            sympy.Integer(0))
    upper = {i: sympy.sympify(size) for i, size in zip(indices, view.sizes)}
    index = sympy.expand(_relaid_index(flat, old, new_strides, upper))
    strides = tuple(index.coeff(i) if sympy.sympify(size) != 1 else sympy.sympify(st)
                    for i, size, st in zip(indices, view.sizes, view.strides))
    offset = index.subs({i: 0 for i in indices})
    if not all(st.is_Integer for st in strides) or not offset.is_Integer \
            or sympy.expand(index - offset - sum(st * i for st, i in zip(strides, indices))) != 0:
        return None
    return ir.ViewArg(view.name, view.sizes, strides, offset)


def _channels_last_view(view: ir.ViewArg | None) -> bool:
    """Whether a 4-d view reads its elements in NHWC order, channels at unit stride: dense, or a
    range of an NHWC buffer's channels (what ATen's convolutions take as channels-last)."""
    if view is None or len(view.sizes) != 4 or not all(sympy.sympify(e).is_Integer for e in (*view.sizes, *view.strides)):
        return False
    n, c, h, w = (int(size) for size in view.sizes)
    sn, sc, sh, sw = (int(st) for st in view.strides)
    return (sc == 1 or c == 1) and (w == 1 or sw >= c * sc) and (h == 1 or sh >= w * sw) and (n == 1 or sn >= h * sh)


def _strides_for_view(buf: ir.Buffer, view: ir.ViewArg) -> tuple | None:
    """Strides for contiguous `buf` under which its 4-d reshaping `view` (dims merged or split:
    the channel shuffle's `[b, 58, 2, h, w]` read as `[b, 116, h, w]`) is channels-last, or None.

    Each of the buffer's dims belongs to the view dim of the largest stride not above its own (the
    view dim it is part of); ordered as the view's dims are in NHWC (channels innermost), keeping
    their own order within a view dim, the buffer's dims give strides that the view must then read
    as NHWC: a buffer dim split across view dims (a view that splits what the buffer holds as one
    dim) fails that check."""
    view_dims = [d for d in range(4) if sympy.sympify(view.sizes[d]) != 1]
    nhwc_rank = {0: 0, 2: 1, 3: 2, 1: 3}
    rank = []
    for e, (size, stride) in enumerate(zip(buf.sizes, buf.strides)):
        owners = [d for d in view_dims if int(view.strides[d]) <= int(stride)]
        owner = max(owners, key=lambda d: int(view.strides[d])) if owners else 1
        rank.append((nhwc_rank[owner], e))
    order = tuple(e for _, e in sorted(rank))
    strides = _strides_in_order(buf.sizes, order)
    return strides if _channels_last_view(_relaid_view(view, buf, strides)) else None


def _channels_last_inputs(graph: ir.Graph) -> ir.Graph:
    """A convolution reading a buffer kiln does not compute (a graph input, an extern's result)
    reads a channels-last copy of it instead, so its output can be channels-last too."""
    def image(node, buffers: dict, computed: set) -> tuple[int, ...]:
        if not (node.args and isinstance(node.args[0], ir.BufferArg) and node.outputs and node.outputs[0]):
            return ()
        x = buffers[node.args[0].name]
        wanted = x.name not in computed and len(x.sizes) == 4 and all(sympy.sympify(s).is_number for s in x.sizes) \
            and x.strides != channels_last_strides(x.sizes)
        return (0,) if wanted else ()
    return _reading_copies(graph, image)


def _reading_copies(graph: ir.Graph, operands) -> ir.Graph:
    """`graph` with each convolution reading channels-last copies of its arguments at the positions
    `operands(node, buffers, computed)` names (`computed`: the buffers a node of the graph computes).

    [Note: one channels-last copy per buffer] A buffer is copied once per graph, whichever pass
    asks. A graph input that is one convolution's image and another's weight (fuzz seed 7569) was
    copied by both `_channels_last_inputs` and `_channels_last_weights`, each keeping its own
    copies: two buffers and two nodes of one name, `arg2_nhwc`, which the scheduler fused into one
    kernel that declared the value twice (g++: "redeclaration of 'float v_arg2_nhwc'"). The copy
    sits before the first convolution that reads it, so a later pass that reuses an earlier one's
    copy moves it up when its own reader comes first (the input was read where that one is)."""
    buffers = graph.buffer_map()
    computed = {n.buffer for n in graph.nodes if isinstance(n, ir.ComputedBuffer)}
    new_buffers, nodes = list(graph.buffers), []
    placed: set[str] = set()     # the buffers computed by the nodes placed so far
    moved: set[str] = set()      # copies an earlier pass made, placed ahead of where it put them
    changed = False
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer) and node.buffer in moved:
            continue
        positions = operands(node, buffers, computed) if _is_convolution(node) else ()
        if positions:
            args = list(node.args)
            for i in positions:
                x = buffers[args[i].name]
                name = f"{x.name}_nhwc"
                if name not in placed:
                    if name in buffers:
                        moved.add(name)
                    else:
                        new_buffers.append(ir.Buffer(name, x.sizes, channels_last_strides(x.sizes), x.dtype, x.device))
                    index = x.index([loop_var(k) for k in range(4)])
                    nodes.append(ir.ComputedBuffer(name, ir.Pointwise(x.sizes, ir.Load(x.name, index, x.dtype))))
                    placed.add(name)
                args[i] = ir.BufferArg(name)
            node, changed = dataclasses.replace(node, args=tuple(args)), True
        if isinstance(node, ir.ComputedBuffer):
            placed.add(node.buffer)
        nodes.append(node)
    if not changed:
        return graph
    return dataclasses.replace(graph, buffers=tuple(new_buffers), nodes=tuple(nodes))


_RELAID: dict = {}


def _relaid_index(index, old: ir.Buffer, new_strides, upper: dict) -> sympy.Expr:
    """The flat offset of the element at contiguous offset `index`, in the new strides."""
    index = sympy.sympify(index)
    key = (index, tuple(old.sizes), tuple(old.strides), tuple(new_strides), frozenset(upper.items()))
    done = _RELAID.get(key)              # [Note: index memo] in kiln/codegen/indexing.py: layers repeat
    if done is None:
        if len(_RELAID) >= 200_000:
            _RELAID.clear()
        done = _RELAID[key] = _relaid(index, old, new_strides, upper)
    return done


def _relaid(index: sympy.Expr, old: ir.Buffer, new_strides, upper: dict) -> sympy.Expr:
    out = sympy.Integer(0)
    strides = [sympy.sympify(st) for st in old.strides]
    outermost = max(range(len(strides)), key=lambda d: strides[d], default=0) \
        if all(st.is_number for st in strides) else 0
    for d, (size, old_stride, new_stride) in enumerate(zip(old.sizes, old.strides, new_strides)):
        # unevaluated: simplify_index decides most of them from the bounds, cheaper than sympy
        i = sympy.floor(index / old_stride, evaluate=False) if old_stride != 1 else index
        if d != outermost:      # every dim but the one of the largest stride wraps (any dense order)
            i = sympy.Mod(i, size, evaluate=False)
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
            node = dataclasses.replace(node, body=ir.map_body(node.body, fix))
        elif isinstance(node, ir.ExternKernel) and _view_names((node.args, [v for _, v in node.kwargs])) & plan.keys():
            def restride(a):
                return _relaid_view(a, old[a.name], plan[a.name]) if isinstance(a, ir.ViewArg) and a.name in plan else a
            node = dataclasses.replace(node, args=torch.utils._pytree.tree_map(restride, node.args),
                                       kwargs=torch.utils._pytree.tree_map(restride, node.kwargs))
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
    def weight(node, buffers: dict, computed: set) -> tuple[int, ...]:
        if len(node.args) < 2 or not isinstance(node.args[0], (ir.BufferArg, ir.ViewArg)) \
                or not isinstance(node.args[1], ir.BufferArg):
            return ()
        x, w = node.args[0], buffers[node.args[1].name]
        x_nhwc = _channels_last_view(x) if isinstance(x, ir.ViewArg) else \
            len(buffers[x.name].sizes) == 4 and _is_channels_last(buffers[x.name])
        wanted = x_nhwc and len(w.sizes) == 4 and w.name not in computed \
            and all(sympy.sympify(s).is_number for s in w.sizes) and not _is_channels_last(w)
        return (1,) if wanted else ()
    return _reading_copies(graph, weight)


# Matrix products and the argument positions of their matrix operands: each takes a row-major or a
# column-major matrix (the last two dims) as it comes.
_MATMUL_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}


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


def plan_input_order(graph: ir.Graph, free_outputs: frozenset = frozenset()) -> dict[str, tuple]:
    """Buffer name -> strides in its main input's dim order ([Note: layouts that follow their input]);
    `free_outputs` as for `plan_channels_last`."""
    buffers = graph.buffer_map()
    pinned = _contract_buffers(graph, free_outputs)
    operands: set[str] = set()
    for node in graph.nodes:
        if not isinstance(node, ir.ExternKernel):
            continue
        positions = _MATMUL_OPERANDS.get(extern_name(node), ())
        for i, arg in enumerate(node.args):
            if i in positions and isinstance(arg, ir.BufferArg):
                operands.add(arg.name)
            else:
                pinned |= {a.name for a in torch.utils._pytree.tree_leaves(arg) if isinstance(a, (ir.BufferArg, ir.ViewArg))}
        pinned |= {a.name for a in torch.utils._pytree.tree_leaves([v for _, v in node.kwargs])
                   if isinstance(a, (ir.BufferArg, ir.ViewArg))}
    for node in graph.nodes:   # a gather's index holds values the loop bounds do not know: not re-indexed
        if isinstance(node, ir.ComputedBuffer):
            pinned |= {ld.buffer for ld in ir.loads_of(node.body.expr) if ld.indirect}
    plan: dict[str, tuple] = {}
    for node in graph.nodes:
        if not isinstance(node, ir.ComputedBuffer) or not isinstance(node.body, ir.Pointwise) or node.buffer in pinned:
            continue
        buf = buffers[node.buffer]
        if len(buf.sizes) < 2 or not _static_and_nonempty(buf.sizes) or buf.offset != 0 or not _dense(buf):
            continue
        if buf.strides != ir.contiguous_strides(buf.sizes):
            continue        # laid out on purpose already (channels-last around a convolution)
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


def optimize_layouts(graph: ir.Graph, free_outputs: frozenset = frozenset()) -> ir.Graph:
    """The pass: channels-last around convolutions, then buffers that follow their input's order
    (see the module docstring). `free_outputs`: outputs whose strides are the pass's to choose."""
    if not graph.buffers:
        return graph
    graph = _channels_last_inputs(graph)
    graph = apply_layouts(graph, plan_channels_last(graph, free_outputs))
    graph = _channels_last_weights(graph)
    # a buffer follows its input's order as the pass found it: one whose input was re-laid in the
    # same round follows in the next (max pooling's recomputed indices follow its window choice,
    # which follows the channels-last pool input)
    for _ in range(_INPUT_ORDER_ROUNDS):
        plan = plan_input_order(graph, free_outputs)
        if not plan:
            break
        graph = apply_layouts(graph, plan)
    return pad_matmuls(graph)      # [Note: aligned matmuls], CUDA only


_INPUT_ORDER_ROUNDS = 4
