"""The memory-efficient attention kernel reads its bias with every stride but the last a multiple
of 16 elements; a mask over 174 keys, broadcast over heads and realized contiguous for the extern,
failed on the GPU ("attn_bias is not correctly aligned (strideH)"). Lowering realizes such a bias
with padded rows. Checked on fake CUDA tensors (no GPU needed); the GPU tests run it
(tests/codegen/test_cudagraphs.py's static-cache decoding)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen import ir
from kiln.codegen.lowering import lower_graph

aten = torch.ops.aten


def attention(q, k, v, mask):
    bias = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return aten._scaled_dot_product_efficient_attention.default(q, k, v, bias, False)[0]


@pytest.mark.parametrize("keys", [174, 176])
def test_a_broadcast_bias_reaches_the_kernel_with_aligned_rows(keys):
    with FakeTensorMode():
        q = torch.empty(1, 4, 1, 64, device="cuda", dtype=torch.bfloat16)
        k = v = torch.empty(1, 4, keys, 64, device="cuda", dtype=torch.bfloat16)
        mask = torch.empty(1, 1, 1, keys, device="cuda", dtype=torch.bfloat16)
        gm = make_fx(attention)(q, k, v, mask)
        graph, _ = lower_graph(gm, [q, k, v, mask])
    buffers = graph.buffer_map()
    (extern,) = [n for n in graph.nodes if isinstance(n, ir.ExternKernel) and "attention" in str(n.op)]
    bias = extern.args[3]
    strides = bias.strides if isinstance(bias, ir.ViewArg) else buffers[bias.name].strides
    assert all(int(s) % 16 == 0 for s in strides[:-1]), (keys, strides)
    assert int(strides[-1]) == 1

