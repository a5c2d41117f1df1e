"""Norm prologues ([Note: norm prologues] in kiln/codegen/prologues.py): a GEMV template computes a
row normalization of its A itself (the statistics over K, then A's value in its K loop), and the
norm's kernel disappears. Run under Triton's interpreter on CPU tensors against eager (float32
closely, bfloat16 by the benchmark's rule against float64); kernels counted on kiln's schedule,
with the prologues and without them (`find_prologues` answering nothing, as before them).

As in test_matmul_gemv_siblings.py, the rule's size thresholds are lowered (`any_size`) so that
small shapes take the GEMV form; K = 300 is no multiple of BLOCK_K (128 for float32, 256 for
bfloat16) and N no multiple of BLOCK_N."""
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen import compile as codegen_compile
from kiln.codegen import ir, prologues, scheduler
from kiln.codegen import triton as triton_printer
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.matmul_templates import group_sibling_gemvs, use_matmul_templates
from kiln.codegen.triton import heuristics
from tests.codegen.conftest import compare_with_eager

K = 300


@pytest.fixture(autouse=True)
def _with_prologues(monkeypatch):
    """Off by default until timed on a GPU (prologues.NORM_PROLOGUES); these tests are of the form."""
    monkeypatch.setattr(prologues, "NORM_PROLOGUES", True)


def _without_prologues(monkeypatch):
    monkeypatch.setattr(prologues, "NORM_PROLOGUES", False)


def _graph(graphs, fn, inputs, configs=None, siblings=True):
    """`fn`'s forward lowered as the default mode lowers it for the Triton printer (`configs`: the
    tilings offered, the default mode's GEMVs unless given; `siblings`: products of one A grouped),
    and its prim graph."""
    (gm, examples), _ = graphs(fn, *inputs)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph))
    if siblings:
        graph = group_sibling_gemvs(graph, triton_printer.default_sibling_gemv_config)
    return use_matmul_templates(graph, configs or triton_printer.default_matmul_configs), gm, examples


def _kernels(sched) -> list[ir.Kernel]:
    return [s for s in sched.steps if isinstance(s, ir.Kernel)]


def _norm_kernels(sched) -> list[ir.Kernel]:
    """Kernels of their own with a reduction: the norms'."""
    return [k for k in _kernels(sched) if k.template is None and any(st.reduction_ranges for st in k.stages)]


def _with_prologue(sched) -> list[ir.Kernel]:
    return [k for k in _kernels(sched) if k.template is not None and k.prologue]


def _run(gm, examples, inputs):
    program = compile_prim_graph(gm, examples, printer=triton_printer)
    return program(*inputs)


def _counts(graphs, monkeypatch, fn, inputs):
    """(kernels without prologues, the schedule with them, gm, examples)."""
    graph, gm, examples = _graph(graphs, fn, inputs)
    with monkeypatch.context() as m:
        _without_prologues(m)
        before = scheduler.schedule(graph)
    return before, scheduler.schedule(graph), gm, examples


# -- LayerNorm before a linear layer

def _layer_norm_linear_of(k: int):
    def layer_norm_linear(x, w, b, weight, bias):
        return F.linear(F.layer_norm(x, (k,), w, b), weight, bias)
    return layer_norm_linear


_layer_norm_linear = _layer_norm_linear_of(K)


def _layer_norm_inputs(m, n, dtype):
    torch.manual_seed(0)
    return [(torch.randn(m, K) * 3 + 1).to(dtype), torch.randn(K).to(dtype), torch.randn(K).to(dtype),
            (torch.randn(n, K) / K ** 0.5).to(dtype), torch.randn(n).to(dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_layer_norm_before_a_gemv_is_its_prologue(graphs, any_size, monkeypatch, m, dtype):
    """The norm's kernel (its mean, its variance and the normalized row) is gone: one kernel, the
    GEMV's, with two statistics stages and A's stage over K, and A no argument of it."""
    inputs = _layer_norm_inputs(m, 77, dtype)
    before, sched, gm, examples = _counts(graphs, monkeypatch, _layer_norm_linear, inputs)
    assert len(_kernels(before)) == 2 and len(_norm_kernels(before)) == 1, str(before)
    assert len(sched.steps) == 1 and not _norm_kernels(sched), str(sched)
    (kernel,) = _with_prologue(sched)
    assert len(kernel.prologue) == 3 and kernel.template.a.name not in kernel.buffer_args, str(kernel)
    assert kernel.template.a.name in sched.local_buffers and K % kernel.template.config.BLOCK_K
    compare_with_eager(_layer_norm_linear, _run(gm, examples, inputs), inputs, dtype)


# -- LLaMA's RMSNorm (float32 inside) before q/k/v and gate/up

def _rms_norm(x, w):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def _rms_qkv(x, w, w_q, w_k, w_v):
    h = _rms_norm(x, w)
    return F.linear(h, w_q), F.linear(h, w_k), F.linear(h, w_v)


def _rms_mlp(x, w, w_gate, w_up, w_down):
    h = _rms_norm(x, w)
    return F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])
def test_rms_norm_before_qkv_siblings_is_one_launch(graphs, any_size, monkeypatch, m, dtype):
    """input_layernorm, q, k and v: one launch of two segments, each computing the norm (float32
    statistics, the cast to the weight's dtype before the product by the weight, as eager rounds)."""
    torch.manual_seed(0)
    inputs = [torch.randn(m, K).to(dtype), (torch.rand(K) + 0.5).to(dtype)]
    inputs += [(torch.randn(n, K) / K ** 0.5).to(dtype) for n in (90, 42, 42)]
    before, sched, gm, examples = _counts(graphs, monkeypatch, _rms_qkv, inputs)
    assert len(before.steps) == 2 and len(_norm_kernels(before)) == 1, str(before)
    assert len(sched.steps) == 1, str(sched)
    (kernel,) = _with_prologue(sched)
    assert isinstance(kernel.template, ir.SiblingGemvs) and kernel.template.segments == ((0,), (1, 2))
    assert len(kernel.prologue) == 2, str(kernel)         # the mean of squares, then A
    compare_with_eager(_rms_qkv, _run(gm, examples, inputs), inputs, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_before_gate_and_up_is_one_launch(graphs, any_size, monkeypatch, dtype):
    """post_attention_layernorm, gate, up and silu(gate) * up in one kernel; down a GEMV of its own."""
    torch.manual_seed(0)
    n = 77
    inputs = [torch.randn(2, K).to(dtype), (torch.rand(K) + 0.5).to(dtype), (torch.randn(n, K) / K ** 0.5).to(dtype),
              (torch.randn(n, K) / K ** 0.5).to(dtype), (torch.randn(K, n) / n ** 0.5).to(dtype)]
    before, sched, gm, examples = _counts(graphs, monkeypatch, _rms_mlp, inputs)
    assert len(before.steps) == 3 and len(sched.steps) == 2, f"{before}\n----\n{sched}"
    (kernel,) = _with_prologue(sched)
    assert kernel.template.segments == ((0, 1),)
    compare_with_eager(_rms_mlp, _run(gm, examples, inputs)[0], inputs, dtype)


def test_a_bfloat16_row_normalized_by_a_float32_weight(graphs, any_size, monkeypatch):
    """x in bfloat16, the norm's weight and the linear layer's in float32: the normalized row is
    float32 (the product by the weight promotes it), and the prologue reads x in bfloat16."""
    torch.manual_seed(0)
    inputs = [torch.randn(1, K).to(torch.bfloat16), torch.rand(K) + 0.5, torch.randn(77, K) / K ** 0.5,
              torch.randn(42, K) / K ** 0.5, torch.randn(42, K) / K ** 0.5]
    before, sched, gm, examples = _counts(graphs, monkeypatch, _rms_qkv, inputs)
    assert len(before.steps) == 2 and len(sched.steps) == 1, f"{before}\n----\n{sched}"
    assert _with_prologue(sched)
    compare_with_eager(_rms_qkv, _run(gm, examples, inputs), inputs, torch.float32)


# -- dolly's parallel residual: two norms of one x, each before its own GEMV

def _parallel_residual(x, w1, b1, w2, b2, w_qkv, b_qkv, w_fc1, b_fc1):
    qkv = F.linear(F.layer_norm(x, (K,), w1, b1), w_qkv, b_qkv)
    fc1 = F.gelu(F.linear(F.layer_norm(x, (K,), w2, b2), w_fc1, b_fc1))
    return qkv, fc1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_norms_of_one_x_are_each_their_gemvs_prologue(graphs, any_size, monkeypatch, dtype):
    """ln1(x) before qkv and ln2(x) before fc1 share their mean and variance (and dolly's centred x):
    each GEMV computes them again, and no norm kernel is left."""
    torch.manual_seed(0)
    inputs = [torch.randn(1, K) * 2] + [torch.randn(K) for _ in range(4)]
    for n in (90, 120):
        inputs += [torch.randn(n, K) / K ** 0.5, torch.randn(n)]
    inputs = [x.to(dtype) for x in inputs]
    before, sched, gm, examples = _counts(graphs, monkeypatch, _parallel_residual, inputs)
    assert len(_norm_kernels(before)) >= 1, str(before)
    assert not _norm_kernels(sched) and len(_with_prologue(sched)) == 2 and len(sched.steps) == 2, str(sched)
    compare_with_eager(_parallel_residual, _run(gm, examples, inputs), inputs, dtype)


# -- where the norm stays a kernel of its own

def test_a_normalized_row_with_another_reader_stays_stored(graphs, any_size, monkeypatch):
    """The normalized row returned too: its kernel must run to store it, so the GEMV reads it (the
    refusal recorded with its reason)."""
    def fn(x, w, b, weight, bias):
        h = F.layer_norm(x, (K,), w, b)
        return F.linear(h, weight, bias), h
    inputs = _layer_norm_inputs(2, 77, torch.float32)
    before, sched, gm, examples = _counts(graphs, monkeypatch, fn, inputs)
    assert len(sched.steps) == len(before.steps) == 2 and not _with_prologue(sched), str(sched)
    assert any("readers besides GEMV templates" in w.reason for w in sched.refused), str(sched)
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, torch.float32)


def test_statistics_with_another_reader_stay_stored(graphs, any_size, monkeypatch):
    """The row's mean of squares returned too: the norm's kernel computes it anyway."""
    def fn(x, w, weight):
        ms = x.pow(2).mean(-1, keepdim=True)
        return F.linear(x * torch.rsqrt(ms + 1e-6) * w, weight), ms
    torch.manual_seed(0)
    inputs = [torch.randn(1, K), torch.randn(K), torch.randn(77, K) / K ** 0.5]
    _, sched, gm, examples = _counts(graphs, monkeypatch, fn, inputs)
    assert not _with_prologue(sched) and any("outside the prologue" in w.reason for w in sched.refused), str(sched)
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, torch.float32)


def test_the_dot_form_refuses_a_norm_prologue(graphs, monkeypatch):
    """Sixteen rows, max-autotune's tiled product (the dot form): the norm stays its own kernel, and
    the schedule says why."""
    inputs = _layer_norm_inputs(16, 77, torch.float32)
    graph, gm, examples = _graph(graphs, _layer_norm_linear, inputs, triton_printer.matmul_configs)
    sched = scheduler.schedule(graph)
    (template,) = [k for k in _kernels(sched) if k.template is not None]
    assert template.template.config.form == "dot" and not template.prologue and _norm_kernels(sched), str(sched)
    assert any("GEMV form only" in w.reason for w in sched.refused), str(sched)
    compare_with_eager(_layer_norm_linear, _run(gm, examples, inputs), inputs, torch.float32)


def test_the_recompute_bound_refuses_a_costly_prologue(graphs, any_size, monkeypatch):
    """Every program recomputes the statistics: past MAX_PROLOGUE_READ_RATIO of its weight bytes, the
    norm keeps its kernel."""
    monkeypatch.setattr(prologues, "MAX_PROLOGUE_READ_RATIO", 0.25)   # it reads 0.5x: x, w, b for A
    inputs = _layer_norm_inputs(1, 77, torch.float32)
    _, sched, _, _ = _counts(graphs, monkeypatch, _layer_norm_linear, inputs)
    assert not _with_prologue(sched) and any("MAX_PROLOGUE_READ_RATIO" in w.reason for w in sched.refused), str(sched)


def test_a_norm_read_by_a_refused_gemv_stays_for_the_other_too(graphs, any_size, monkeypatch):
    """One normalized row, two GEMVs of their own (not grouped): the narrow one's programs would
    recompute too much for their 4 columns, so the norm stays stored for it, and the wide one (16
    columns a program) reads it too rather than computing it again."""
    monkeypatch.setattr(prologues, "MAX_PROLOGUE_READ_RATIO", 0.25)   # 0.5x for 4 columns, 0.125x for 16

    def fn(x, w, b, narrow, wide):
        h = F.layer_norm(x, (K,), w, b)
        return F.linear(h, narrow), F.linear(h, wide)
    torch.manual_seed(0)
    inputs = _layer_norm_inputs(1, 77, torch.float32)[:4] + [torch.randn(8192, K) / K ** 0.5]
    graph, gm, examples = _graph(graphs, fn, inputs, siblings=False)
    sched = scheduler.schedule(graph)
    blocks = sorted(k.template.config.BLOCK_N for k in _kernels(sched) if k.template is not None)
    assert blocks == [4, 16] and not _with_prologue(sched) and len(_norm_kernels(sched)) == 1, str(sched)
    assert any("MAX_PROLOGUE_READ_RATIO" in w.reason for w in sched.refused), str(sched)
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, torch.float32)


# -- whole decode steps: tiny LLaMA and GPT-NeoX (dolly's family) with a static cache

def _decode(monkeypatch, model, vocab):
    """generate() with a static cache through the interpreter: eager's tokens, and the last decode
    step's schedule."""
    made = []

    def keep(graph):
        made.append(scheduler.schedule(graph))
        return made[-1]
    monkeypatch.setattr(codegen_compile, "schedule", keep)
    ids = torch.randint(1, vocab, (1, 5), generator=torch.Generator().manual_seed(1))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                  pad_token_id=0, cache_implementation="static")
    kiln.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model.generate(ids, **kwargs)
        forward = model.forward
        model.forward = kiln.compile(forward, options={"triton_interpret": True})
        got = model.generate(ids, **kwargs)
        model.forward = forward
    assert torch.equal(got, expected), (got, expected)
    return [s for s in made if any(k.template is not None for k in _kernels(s))][-1]


def _tiny(family: str, dtype):
    from kiln.bench.suites import ensure_torchvision_importable
    ensure_torchvision_importable()
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=97, hidden_size=36, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=50, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(config).to(dtype).eval()
    config = transformers.GPTNeoXConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25,
                                        use_parallel_residual=True)
    return transformers.GPTNeoXForCausalLM(config).to(dtype).eval()


@pytest.mark.parametrize("family, dtype", [("llama", torch.float32), ("neox", torch.bfloat16)])
def test_tiny_decoders_lose_their_norm_kernels(any_size, monkeypatch, family, dtype):
    """Eager's tokens with and without the prologues; with them a decode step has no norm kernel
    left. LLaMA: each layer's input and post-attention norms (in the q/k/v and gate/up sibling
    kernels) and the final norm (in the head) were a kernel each. GPT-NeoX (dolly's family, parallel
    residual): each layer's ln1 and ln2 of one x were one kernel (ln2's output computed in the
    cache write's), now computed by qkv and fc1; the first layer's norm kernel stays for the
    rotary positions' cast that shared it, and the final norm's for the cache positions' increments
    (its residual sum, read at x's first element for the shifted mean, stays stored)."""
    model = _tiny(family, dtype)
    with monkeypatch.context() as m:
        _without_prologues(m)
        before = _decode(m, model, 97)
    step = _decode(monkeypatch, model, 97)
    layers = model.config.num_hidden_layers
    assert len(_norm_kernels(before)) == (2 * layers + 1 if family == "llama" else layers + 1), str(before)
    assert not _norm_kernels(step), str(step)
    gone = len(_kernels(before)) - len(_kernels(step))
    assert gone == (2 * layers + 1 if family == "llama" else layers - 1), f"{before}\n----\n{step}"


# -- the GPU text, compiled for sm_90 without a GPU

@pytest.mark.parametrize("fn, ns, k", [(_rms_qkv, (2048, 256, 256), 2048), (_rms_mlp, (5632, 5632), 2048),
                                       (_layer_norm_linear, (7680,), 2560)])
def test_prologue_gemvs_compile_for_sm90_without_spills(graphs, fn, ns, k):
    """LLaMA-1.1B's input norm with q/k/v and its post-attention norm with gate/up, and dolly's ln1
    with qkv, bfloat16 at one token with the rule's thresholds as they are: Triton's compiler for
    an H100 takes the printed kernel, reads the weights in 128-bit loads and keeps every value in
    registers (ptxas: 40 registers a thread for q/k/v with the norm against 38 without, 64 against
    48 for gate/up, 60 against 56 for dolly's qkv)."""
    pytest.importorskip("triton.backends.nvidia")
    from kiln.codegen.triton.offline import compile_for_gpu
    dtype = torch.bfloat16
    torch.manual_seed(0)
    if fn is _layer_norm_linear:
        fn = _layer_norm_linear_of(k)
        inputs = [torch.randn(1, k), torch.randn(k), torch.randn(k), torch.randn(ns[0], k), torch.randn(ns[0])]
    else:
        inputs = [torch.randn(1, k), torch.randn(k)] + [torch.randn(n, k) for n in ns]
        inputs += [torch.randn(k, ns[0])] if fn is _rms_mlp else []
    graph, _, _ = _graph(graphs, fn, [x.to(dtype) for x in inputs])
    (kernel,) = _with_prologue(scheduler.schedule(graph))
    config = heuristics.template_launch(dataclasses.asdict(kernel.template.config))
    build = compile_for_gpu(kernel, graph.buffer_map(), [], config=config)
    assert build.vector_loads, sorted(build.memory_ops())
    assert build.spill_bytes in (0, None), build.spill_bytes
