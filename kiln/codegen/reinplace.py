"""Writes into graph inputs made in place: an `index_put` that aot's functional graph applies to a
copy of an input it then writes back becomes `index_put_` on the input itself.

[Note: writes into inputs in place] aot functionalizes `cache.index_copy_(2, pos, new)` (a static
KV cache's update, `x[idx] = v` on an input) into a copy of the input, an `index_put` on the copy,
and the new value returned for the epilogue to copy back into the input
(`AotRuntime._epilogue`). For a decoding step that is three passes over every layer's whole cache
to write one position: the copy, the out-of-place index_put's clone, and the copy back. This pass
recognizes that chain in a forward prim graph and writes the positions into the input's own
storage instead; the output returned for the input is then a view of that storage with the
input's strides, which the epilogue recognizes (`Tensor.is_set_to`) and does not copy. Lowering
makes the `index_put_` a scatter kernel writing the input's storage at the loaded positions
(`kiln/codegen/lowering_scatter.py`); where it cannot, ATen's `index_put_` runs as an extern.

It applies only where that is the same computation:
- the input is one aot writes back (`gm.meta["kiln_inputs_written"]`: an output position and the
  input it holds the new value of) and does not require grad (autograd must see such a write);
- nothing else reads the input: every reader of its old value is in the chain itself, so no
  kernel can run after the write and see the new value where eager saw the old (reads of its
  sizes, `sym_size` under dynamic shapes, read no element);
- the index_put does not accumulate: with nothing else reading the input, writing it again gives
  the same values, so a CUDA graph's recording (which runs the program once more) is harmless;
- between the input and the index_put, and between the index_put and the output, there are only
  permutes, same-shape views and copies, and the permutes compose to the identity: the index_put's
  result, viewed back, is the whole input (a slice of it would be a slice_scatter, not handled).
"""
from __future__ import annotations

import torch
from torch import fx

from kiln.codegen.lowering import program_device

# ops by name, as lowering keys them (codegen reaches prims through the graphs it is handed)
_PERMUTE, _VIEW, _INDEX_PUT = "kiln_prims.permute.default", "kiln_prims.view.default", "kiln_prims.index_put.default"
_COPIES = ("kiln_prims.copy_strided.default", "aten._to_copy.default", "aten.clone.default")
# reads of an input's metadata, not its elements (a symbolic size's `sym_size` under dynamic shapes)
_SIZE_READS = ("aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default", "aten.sym_storage_offset.default")


def reinplace_input_writes(gm: fx.GraphModule) -> int:
    """Rewrite gm in place as [Note: writes into inputs in place] says; returns how many writes."""
    written = dict(gm.meta.get("kiln_inputs_written", ()))
    if not written:
        return 0
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # a CPU input of a CUDA program is a copy on the device ([Note: a CUDA program holds
    # everything on its device] in lowering.py): a write into it would miss the caller's tensor
    on_device = program_device([n.meta.get("val") for n in gm.graph.nodes])
    output = next(n for n in gm.graph.nodes if n.op == "output")
    flat = list(output.args[0])
    done = 0
    for position, index in written.items():
        if position >= len(flat) or index >= len(placeholders) or not isinstance(flat[position], fx.Node):
            continue
        if _device(placeholders[index]) is not None and _device(placeholders[index]).type != on_device:
            continue
        new_output = _reinplace(gm.graph, placeholders[index], flat[position])
        if new_output is not None:
            flat[position] = new_output
            done += 1
    if done:
        output.args = (type(output.args[0])(flat),)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def _reinplace(graph: fx.Graph, placeholder: fx.Node, value: fx.Node) -> fx.Node | None:
    """The output node to return instead of `value` after the rewrite, or None where it does not apply."""
    # from the output back to the index_put: views and copies
    back, node = [], value
    while _op(node) != _INDEX_PUT:
        if not _layout_only(node):       # (other readers of these read the new value: fine)
            return None
        back.append(node)
        node = node.args[0]
    index_put = node
    if len(index_put.args) > 3 and index_put.args[3]:      # accumulate: see the note
        return None
    # from the index_put's operand back to the input: the same, and nothing else reads the input
    forward, node = [], index_put.args[0]
    while node is not placeholder:
        if not isinstance(node, fx.Node) or not _layout_only(node) or len(node.users) != 1:
            return None
        forward.append(node)
        node = node.args[0]
    if len([u for u in placeholder.users if _op(u) not in _SIZE_READS]) != 1 or _rank(placeholder) < 0:
        return None
    into = _composed_permutation(reversed(forward), _rank(placeholder))
    out = _composed_permutation(reversed(back), len(into))
    if [into[d] for d in out] != list(range(len(into))):
        return None
    with graph.inserting_before(index_put):
        operand = _permuted(graph, placeholder, into)
        written = graph.call_function(torch.ops.kiln_prims.index_put_.default, (operand, *index_put.args[1:]))
    index_put.replace_all_uses_with(written)
    written.meta.update(index_put.meta)
    written.meta["val"] = operand.meta["val"]      # the result is the operand: its strides, not a copy's
    with graph.inserting_after(written):
        return _permuted(graph, written, out)


def _permuted(graph: fx.Graph, node: fx.Node, dims: list[int]) -> fx.Node:
    """`node` permuted by `dims` (itself for the identity), with its traced value."""
    if dims == list(range(len(dims))):
        return node
    permuted = graph.call_function(_permute_op(), (node, dims))
    permuted.meta.update(node.meta)
    permuted.meta["val"] = node.meta["val"].permute(dims)
    return permuted


def _layout_only(node) -> bool:
    """A node that moves no element: a permute, a view to the same shape, a same-dtype copy."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if _op(node) == _PERMUTE:
        return True
    if _op(node) == _VIEW:
        return list(node.args[1]) == list(_shape(node.args[0]) or ())
    if _op(node) in _COPIES:
        source = node.args[0]
        kwargs = node.kwargs
        same_dtype = kwargs.get("dtype") in (None, _dtype(source))
        return same_dtype and kwargs.get("device") in (None, _device(source))
    return False


def _composed_permutation(nodes, rank: int) -> list[int]:
    """The dims of the start, in the order the chain of layout nodes leaves them."""
    dims = list(range(rank))
    for node in nodes:
        if _op(node) == _PERMUTE:
            dims = [dims[d] for d in node.args[1]]
    return dims


def _op(node) -> str:
    return str(node.target) if isinstance(node, fx.Node) and node.op == "call_function" else ""


def _permute_op():
    return torch.ops.kiln_prims.permute.default


def _meta(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _shape(node):
    val = _meta(node)
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _rank(node) -> int:
    shape = _shape(node)
    return len(shape) if shape is not None else -1


def _dtype(node):
    val = _meta(node)
    return val.dtype if isinstance(val, torch.Tensor) else None


def _device(node):
    val = _meta(node)
    return val.device if isinstance(val, torch.Tensor) else None
