"""The device-independent layout passes of kiln/codegen/layout.py: [Note: layouts that follow their
input] and [Note: aligned matmuls]. The IR tests run anywhere (CUDA buffers are only names there);
the end-to-end ones compare with eager, on the CPU and, where there is one, on a GPU."""
import pytest
import sympy
import torch

import kiln
import kiln.prims.ops  # noqa: F401  (registers the prims)
from kiln.codegen import ir, layout
from kiln.codegen.ir import loop_var

mm = torch.ops.kiln_prims.mm.default
S = sympy.Integer
x0, x1 = loop_var(0), loop_var(1)


def _lm_head_graph(device: str, vocab: int) -> ir.Graph:
    """logits = x @ convert(W).T and their square, both graph outputs; W float32 [vocab, 768]."""
    bufs = (ir.Buffer("arg0", (S(4096), S(768)), (S(768), S(1)), torch.bfloat16, device),
            ir.Buffer("arg1", (S(vocab), S(768)), (S(768), S(1)), torch.float32, device),
            ir.Buffer("buf0", (S(768), S(vocab)), (S(vocab), S(1)), torch.bfloat16, device),
            ir.Buffer("buf1", (S(4096), S(vocab)), (S(vocab), S(1)), torch.bfloat16, device),
            ir.Buffer("buf2", (S(4096), S(vocab)), (S(vocab), S(1)), torch.bfloat16, device))
    cast = ir.Op("to_dtype", (ir.Load("arg1", x0 + 768 * x1, torch.float32),), torch.bfloat16)
    logits = ir.Load("buf1", vocab * x0 + x1, torch.bfloat16)
    nodes = (ir.ComputedBuffer("buf0", ir.Pointwise((S(768), S(vocab)), cast)),
             ir.ExternKernel(("buf1",), mm, (ir.BufferArg("arg0"), ir.BufferArg("buf0"))),
             ir.ComputedBuffer("buf2", ir.Pointwise((S(4096), S(vocab)),
                                                   ir.Op("mul", (logits, logits), torch.bfloat16))))
    return ir.Graph(inputs=("arg0", "arg1"), buffers=bufs, nodes=nodes, outputs=("buf2", "buf1"))


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_cast_of_a_transposed_weight_keeps_the_weights_order(device):
    graph = layout.optimize_layouts(_lm_head_graph(device, 50264))
    assert graph.buffer_map()["buf0"].strides == (1, 768)      # W's own order: read and written at unit stride
    (cast,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.buffer == "buf0"]
    assert sympy.expand(cast.body.expr.args[0].index) == x0 + 768 * x1


def test_a_misaligned_cuda_product_runs_on_zero_padded_operands_and_copies_its_corner_out():
    graph = layout.optimize_layouts(_lm_head_graph("cuda:0", 50257))
    buffers = graph.buffer_map()
    (product,) = [n for n in graph.nodes if isinstance(n, ir.ExternKernel)]
    assert product.outputs == ("buf1_pad",) and buffers["buf1_pad"].sizes == (4096, 50264)
    weight = buffers[product.args[1].name]
    assert weight.sizes == (768, 50264) and weight.strides == (1, 768)   # padded in the cast's own order
    assert product.args[0].name == "arg0"                                # 4096 x 768 is aligned already
    assert buffers["buf1"].sizes == (4096, 50257) and buffers["buf1"].strides == (50257, 1)   # a graph output
    aligned = layout.optimize_layouts(_lm_head_graph("cuda:0", 50264))
    assert not any(b.name.endswith("_pad") for b in aligned.buffers)     # nothing to do when sizes are aligned
    assert not any(b.name.endswith("_pad") for b in layout.optimize_layouts(_lm_head_graph("cpu", 50257)).buffers)


def test_a_misaligned_operand_the_graph_takes_in_is_copied_padded():
    bufs = (ir.Buffer("arg0", (S(4096), S(50257)), (S(50257), S(1)), torch.bfloat16, "cuda:0"),
            ir.Buffer("arg1", (S(50257), S(768)), (S(768), S(1)), torch.bfloat16, "cuda:0"),
            ir.Buffer("buf0", (S(4096), S(768)), (S(768), S(1)), torch.bfloat16, "cuda:0"))
    graph = ir.Graph(inputs=("arg0", "arg1"), buffers=bufs, outputs=("buf0",),
                     nodes=(ir.ExternKernel(("buf0",), mm, (ir.BufferArg("arg0"), ir.BufferArg("arg1"))),))
    out = layout.optimize_layouts(graph)
    (product,) = [n for n in out.nodes if isinstance(n, ir.ExternKernel)]
    sizes = [out.buffer_map()[a.name].sizes for a in product.args]
    assert sizes == [(4096, 50264), (50264, 768)]                     # K padded in both, with zeros
    assert product.outputs == ("buf0",)                                # M and N were aligned


@pytest.fixture
def padding_on_cpu(monkeypatch):
    """[Note: aligned matmuls] applied to CPU programs too, for every product, so the C++ backend
    checks what the padding computes against eager."""
    from kiln.codegen import matmul_padding
    padded: list[str] = []

    def pad_everywhere(graph):
        out = matmul_padding.pad_matmuls(graph, devices=("cpu", "cuda"))
        padded.extend(b.name for b in out.buffers if "_pad" in b.name)
        return out
    monkeypatch.setattr(matmul_padding, "PAD_MIN_MACS", 1)
    monkeypatch.setattr(layout, "pad_matmuls", pad_everywhere)
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    return padded


def test_padded_products_train_equal_to_eager(padding_on_cpu):
    torch.manual_seed(0)
    head = torch.nn.Linear(37, 101)            # odd M (batch 3 x 11), K and N; addmm with a bias
    tail = torch.nn.Linear(101, 29, bias=False)
    x = torch.randn(3, 11, 37, requires_grad=True)

    def fn(x):
        h = torch.tanh(head(x))
        return tail(h) * 2, torch.bmm(h, h.transpose(1, 2))
    kiln.reset()
    got, want = kiln.compile(fn)(x), fn(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    params = [x, head.weight, head.bias, tail.weight]
    got_grads = torch.autograd.grad(sum(g.square().sum() for g in got), params)
    want_grads = torch.autograd.grad(sum(w.square().sum() for w in want), params)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert len(padding_on_cpu) >= 10      # operands and results of the forward and backward products


def test_transposed_casts_and_products_equal_eager_on_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200)
    x = torch.randn(3, 5, 96, requires_grad=True)

    def fn(x):
        return torch.nn.functional.linear(x, lin.weight.double().float(), lin.bias) * 2
    kiln.reset()
    got = kiln.compile(fn)(x)
    want = fn(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
def test_on_the_gpu_a_misaligned_lm_head_under_autocast_trains_equal_to_eager():
    torch.manual_seed(0)
    head = torch.nn.Linear(768, 50257, bias=False, device="cuda")
    x = torch.randn(8, 512, 768, device="cuda", requires_grad=True)

    def step(fn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fn(x)
        grads = torch.autograd.grad(logits.float().square().mean(), (x, head.weight))
        return logits, grads
    kiln.reset()
    want, want_grads = step(head)
    got, got_grads = step(kiln.compile(head))
    assert got.is_contiguous()
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=3e-2, atol=1e-4)


@needs_gpu
def test_on_the_gpu_embedding_gradients_through_index_add_equal_eagers():
    """[Note: accumulating index_put on CUDA]: many repeated rows (T5's relative-position bias)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(32, 8, device="cuda")
    idx = torch.randint(0, 32, (512, 512), device="cuda")

    def fn(i):
        return emb(i).square().sum()
    kiln.reset()
    want = torch.autograd.grad(fn(idx), emb.weight)[0]
    got = torch.autograd.grad(kiln.compile(fn)(idx), emb.weight)[0]
    flat = idx.flatten().cpu()
    terms = (2 * emb.weight.detach().double().cpu())[flat]
    exact = torch.zeros(32, 8, dtype=torch.float64).index_add_(0, flat, terms)
    magnitude = torch.zeros(32, 8, dtype=torch.float64).index_add_(0, flat, terms.abs())
    count = torch.bincount(flat, minlength=32).double()[:, None]
    # atomics add a row's terms in any order: a float32 sum of n terms in any order is within
    # n * 2**-24 * sum(|terms|) of the exact one (eager's sorted segments are usually closer)
    bound = count * 2.0 ** -24 * magnitude
    assert ((got.double().cpu() - exact).abs() <= bound).all(), ((got.double().cpu() - exact).abs().max(), bound.min())
    assert ((want.double().cpu() - exact).abs() <= bound).all()    # the bound holds for eager's order too


def test_a_value_recomputed_for_a_transposed_operand_keeps_its_inputs_order():
    """GPT-2's backward recomputes gelu for `mm(t(h), grad)`: [256, 32] read through a reshape of a
    [2, 16, 256] input. Stored row-major in [256, 32] it wrote down columns (2.4 ms of a 24 ms step on
    the H200); in the input's order it is the transposed operand cuBLAS takes as it is."""
    bufs = (ir.Buffer("arg0", (S(2), S(16), S(256)), (S(4096), S(256), S(1)), torch.bfloat16, "cuda:0"),
            ir.Buffer("arg1", (S(32), S(64)), (S(64), S(1)), torch.bfloat16, "cuda:0"),
            ir.Buffer("buf0", (S(256), S(32)), (S(32), S(1)), torch.bfloat16, "cuda:0"),
            ir.Buffer("buf1", (S(256), S(64)), (S(64), S(1)), torch.bfloat16, "cuda:0"))
    h = ir.Load("arg0", x0 + 256 * sympy.Mod(x1, 16) + 4096 * sympy.floor(x1 / 16), torch.bfloat16)
    nodes = (ir.ComputedBuffer("buf0", ir.Pointwise((S(256), S(32)), ir.Op("mul", (h, h), torch.bfloat16))),
             ir.ExternKernel(("buf1",), mm, (ir.BufferArg("buf0"), ir.BufferArg("arg1"))))
    graph = ir.Graph(inputs=("arg0", "arg1"), buffers=bufs, nodes=nodes, outputs=("buf1",))
    assert layout.optimize_layouts(graph).buffer_map()["buf0"].strides == (1, 256)


def test_a_buffer_another_extern_reads_keeps_its_layout():
    bufs = (ir.Buffer("arg0", (S(64), S(96)), (S(96), S(1)), torch.float32, "cpu"),
            ir.Buffer("buf0", (S(96), S(64)), (S(64), S(1)), torch.float32, "cpu"),
            ir.Buffer("buf1", (S(96), S(64)), (S(64), S(1)), torch.float32, "cpu"))
    nodes = (ir.ComputedBuffer("buf0", ir.Pointwise((S(96), S(64)), ir.Load("arg0", x0 + 96 * x1, torch.float32))),
             ir.ExternKernel(("buf1",), torch.ops.kiln_prims.sort.default, (ir.BufferArg("buf0"), -1, False)))
    graph = ir.Graph(inputs=("arg0",), buffers=bufs, nodes=nodes, outputs=("buf1",))
    assert layout.optimize_layouts(graph).buffer_map()["buf0"].strides == (64, 1)


def test_a_buffer_that_is_one_convolutions_weight_and_anothers_image_is_copied_channels_last_once():
    """[Note: one channels-last copy per buffer] (fuzz seed 7569): `arg2` is the weight of the first
    convolution (whose image is copied channels-last) and the image of the second. The input and
    weight passes each made their own `arg2_nhwc`; two nodes of one name were fused into one C++
    kernel that declared its value twice. One copy now, before the first convolution that reads it."""
    conv = torch.ops.kiln_prims.convolution.default
    f32 = torch.float32
    bufs = (ir.Buffer("arg0", (S(1), S(6), S(1), S(1)), (S(6), S(1), S(1), S(1)), f32, "cpu"),
            ir.Buffer("arg1", (S(8), S(6), S(2), S(6)), (S(72), S(12), S(6), S(1)), f32, "cpu"),
            ir.Buffer("arg2", (S(2), S(6), S(2), S(2)), (S(24), S(4), S(2), S(1)), f32, "cpu"),
            ir.Buffer("buf0", (S(8), S(2), S(3), S(7)), (S(42), S(21), S(7), S(1)), f32, "cpu"),
            ir.Buffer("buf1", (S(2), S(1), S(2), S(2)), (S(4), S(4), S(2), S(1)), f32, "cpu"))
    common = ([1, 1], [1, 1], False, [0, 0], 1)
    nodes = (ir.ExternKernel(("buf0",), conv, (ir.BufferArg("arg1"), ir.BufferArg("arg2"), None, [1, 1]) + common),
             ir.ExternKernel(("buf1",), conv, (ir.BufferArg("arg2"), ir.BufferArg("arg0"), None, [2, 2]) + common))
    graph = layout.optimize_layouts(ir.Graph(inputs=("arg0", "arg1", "arg2"), buffers=bufs, nodes=nodes,
                                             outputs=("buf0", "buf1")))
    names = [b.name for b in graph.buffers]
    assert len(names) == len(set(names)) and "arg2_nhwc" in names
    copies = [k for k, n in enumerate(graph.nodes) if isinstance(n, ir.ComputedBuffer) and n.buffer == "arg2_nhwc"]
    first, second = [k for k, n in enumerate(graph.nodes) if isinstance(n, ir.ExternKernel)]
    assert len(copies) == 1 and copies[0] < first
    assert graph.nodes[first].args[1].name == "arg2_nhwc" and graph.nodes[second].args[0].name == "arg2_nhwc"
