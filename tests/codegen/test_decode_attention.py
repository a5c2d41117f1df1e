"""Decoding's attention as a template kernel ([Note: decode attention] in
kiln/codegen/attention_templates.py): the SDPA extern replaced by kiln's kernel, grouped-query
attention read from the kv heads without transformers' `repeat_kv` copy, q's producer (a rotary
embedding) and the mask's computed inside it; run under Triton's interpreter on CPU tensors and
compared with eager (float32 closely, bfloat16 as the other half-precision tests here do).

Lk = 150 is no multiple of the key blocks (128 keys at head dim 64, 64 at 80), so the walk's last
block is partial; head dim 80 (GPT-NeoX/dolly's) is padded to 128 lanes and masked."""
from __future__ import annotations

import math
import warnings

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen import compile as compile_module
from kiln.codegen import ir
from kiln.codegen import triton as triton_printer
from kiln.codegen.attention_templates import use_attention_templates
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.scheduler import schedule

ON = {"triton_interpret": True}
HEADS = 8
LK = 150


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' repeat_kv: (B, Hkv, L, D) -> (B, Hkv * n, L, D), an expand and a reshape."""
    b, h, length, d = x.shape
    if n == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n, length, d).reshape(b, h * n, length, d)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attention(group: int, rotary: bool, scale: float | None = None, causal: bool = False):
    def attend(q, k, v, cos, sin, mask):
        if rotary:     # LLaMA's rotary embedding of q: a pointwise producer only the attention reads
            q = q * cos + _rotate_half(q) * sin
        k, v = _repeat_kv(k, group), _repeat_kv(v, group)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal)
    return attend


def _inputs(batch: int, lq: int, d: int, group: int, mask: str, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HEADS, lq, d, generator=g).to(dtype)
    k, v = (torch.randn(batch, HEADS // group, LK, d, generator=g).to(dtype) for _ in range(2))
    cos, sin = (torch.randn(1, 1, lq, d, generator=g).to(dtype) for _ in range(2))
    if mask == "bool":      # a static cache's: positions past the one being decoded masked out
        m = torch.rand(batch, 1, lq, LK, generator=g) < 0.7
        m[..., 0] = True
    elif mask == "float":
        m = torch.randn(batch, HEADS, lq, LK, generator=g).to(dtype)
    else:
        m = None
    return q, k, v, cos, sin, m


def _scheduled(graphs, fn, *inputs):
    """`fn`'s forward lowered for the Triton printer and scheduled, with the attention pass."""
    (gm, examples), _ = graphs(fn, *inputs)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = use_attention_templates(optimize_layouts(dedupe_buffers(graph)), triton_printer.attention_configs)
    return graph, schedule(graph)


def _attention_kernels(sched) -> list:
    return [s for s in sched.steps if isinstance(s, ir.Kernel) and isinstance(s.template, ir.AttentionProduct)]


def _sdpa_externs(sched) -> list:
    return [s for s in sched.steps if isinstance(s, ir.ExternKernel) and "scaled_dot_product" in str(s.op)]


def _copies(sched) -> list:
    """Kernels that only copy: every value they store is one load (transformers' repeat_kv)."""
    out = []
    for k in sched.steps:
        if isinstance(k, ir.Kernel) and k.template is None:
            stores = [s for st in k.stages for s in st.body if isinstance(s, ir.Store)]
            values = {s.name: s.expr for st in k.stages for s in st.body if isinstance(s, ir.Assign)}
            if stores and all(isinstance(values.get(getattr(s.expr, "name", None), s.expr), ir.Load) for s in stores):
                out.append(k)
    return out


def _compare(got, want, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


# (dtype, Lq, head dim, H / Hkv, mask, batch, rotary q): every value of each axis, in a dozen cases
CASES = [
    (torch.float32, 1, 64, 1, "none", 1, False),
    (torch.float32, 3, 80, 4, "bool", 2, True),
    (torch.float32, 1, 80, 8, "float", 1, True),
    (torch.float32, 3, 64, 8, "bool", 2, False),
    (torch.float32, 1, 64, 4, "float", 2, False),
    (torch.float32, 3, 80, 1, "float", 1, True),
    (torch.bfloat16, 1, 64, 4, "bool", 1, True),
    (torch.bfloat16, 3, 80, 8, "none", 2, True),
    (torch.bfloat16, 1, 80, 1, "bool", 2, False),
    (torch.bfloat16, 3, 64, 4, "float", 1, False),
    (torch.bfloat16, 1, 80, 8, "float", 2, False),
    (torch.bfloat16, 3, 64, 1, "none", 1, True),
]


@pytest.mark.parametrize("dtype, lq, d, group, mask, batch, rotary", CASES,
                         ids=[f"{str(c[0])[6:]}-lq{c[1]}-d{c[2]}-g{c[3]}-{c[4]}-b{c[5]}{'-rope' if c[6] else ''}"
                              for c in CASES])
def test_decode_attention_matches_eager(graphs, dtype, lq, d, group, mask, batch, rotary):
    fn = _attention(group, rotary)
    inputs = _inputs(batch, lq, d, group, mask, dtype)
    graph, sched = _scheduled(graphs, fn, *inputs)
    assert len(_attention_kernels(sched)) == 1 and not _sdpa_externs(sched), str(sched)
    assert not _copies(sched), "the template reads the kv heads, not repeat_kv's copy"
    if rotary:      # q's rotary embedding is the template's prologue: no kernel of its own
        assert [s for s in sched.steps if isinstance(s, ir.Kernel)] == _attention_kernels(sched), str(sched)
    if mask == "bool":      # ... and so is the mask's where(m, 0, -inf)
        (node,) = [n for n in graph.nodes if isinstance(n, ir.AttentionTemplate)]
        assert node.mask is not None and any(e.name == "where" for e in ir.walk(node.mask) if isinstance(e, ir.Op))
    kiln.reset()
    got = kiln.compile(fn, options=ON)(*inputs)
    _compare(got, fn(*inputs), dtype)


def test_the_kv_heads_are_read_in_place(graphs):
    """GQA at H / Hkv = 4: the template's keys and values are views of K and V themselves (kv head
    h // 4), not of the copy; the copy's buffer is gone from the program."""
    fn = _attention(4, rotary=False)
    q, k, v, cos, sin, m = _inputs(2, 1, 64, 4, "float", torch.float32)
    graph, sched = _scheduled(graphs, fn, q, k, v, cos, sin, m)
    (kernel,) = _attention_kernels(sched)
    product = kernel.template
    assert (product.key_group, product.value_group) == (4, 4)
    assert [int(s) for s in product.key.sizes] == [2, 2, LK, 64]
    assert [int(s) for s in product.key.strides] == [2 * LK * 64, LK * 64, 64, 1]
    assert {product.key.name, product.value.name} <= set(graph.inputs)
    assert not any(len(b.sizes) == 5 for b in graph.buffers), "repeat_kv's [B, Hkv, 4, L, D] buffer"


def test_operands_are_traced_through_permuted_and_padded_layouts():
    """The element a view reads, as the loop index of the node that wrote it: a repeat_kv copy
    ([B, Hkv, 4, L, D] read as [B, 4 * Hkv, L, D]), a mask realized with its rows padded to 16
    elements (the memory-efficient kernel's alignment), a permuted buffer; none where a layout
    overlaps itself."""
    from kiln.codegen.attention_templates import _loop_indices
    x = [ir.loop_var(k) for k in range(4)]
    b, hk, g, l, d = (sympy.Symbol(n, integer=True, nonnegative=True) for n in "bhgld")

    def buffer(sizes, strides):
        return ir.Buffer("t", tuple(map(sympy.Integer, sizes)), tuple(map(sympy.Integer, strides)), torch.float32)
    copy = buffer((2, 2, 4, 11, 32), (2816, 1408, 352, 32, 1))
    bounds = {b: 2, hk: 2, g: 4, l: 11, d: 32}
    assert _loop_indices(copy, 2816 * b + 352 * (4 * hk + g) + 32 * l + d, bounds) == [b, hk, g, l, d]
    padded = buffer((1, 1, 3, 11), (48, 48, 16, 1))
    assert _loop_indices(padded, 16 * x[2] + x[3], {x[2]: 3, x[3]: 11}) == [0, 0, x[2], x[3]]
    permuted = buffer((2, 8, 3, 64), (1536, 64, 512, 1))      # [B, Lq, H, D] seen as [B, H, Lq, D]
    assert _loop_indices(permuted, 1536 * x[0] + 64 * x[1] + 512 * x[2] + x[3],
                         {x[0]: 2, x[1]: 8, x[2]: 3, x[3]: 64}) == x
    assert _loop_indices(buffer((3, 11), (8, 1)), x[0], {x[0]: 24}) is None


@pytest.mark.parametrize("op, outputs", [("_scaled_dot_product_efficient_attention", 4),
                                         ("_scaled_dot_product_cudnn_attention", 9)])
def test_the_cuda_externs_become_the_same_template(graphs, op, outputs):
    """A CUDA graph's SDPA is the memory-efficient or the cuDNN extern (attn_bias positional, a
    logsumexp flag, more outputs), which this machine cannot trace: the CPU graph's extern is
    rewritten into each, and the pass makes the template the CPU one makes; with the logsumexp
    read it keeps the extern."""
    import dataclasses
    fn = _attention(4, rotary=True)
    q, k, v, cos, sin, m = _inputs(1, 1, 64, 4, "bool", torch.float32)
    (gm, examples), _ = graphs(fn, q, k, v, cos, sin, m)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph))
    (at,) = [i for i, n in enumerate(graph.nodes) if isinstance(n, ir.ExternKernel) and "scaled_dot" in str(n.op)]
    cpu = graph.nodes[at]
    kwargs = dict(cpu.kwargs)
    args = list(cpu.args[:3]) + [kwargs.pop("attn_mask"), True]     # attn_bias, compute_log_sumexp
    cuda = ir.ExternKernel(cpu.outputs + (None,) * (outputs - len(cpu.outputs)),
                           getattr(torch.ops.kiln_prims, op).default, tuple(args), tuple(kwargs.items()))
    rewritten = dataclasses.replace(graph, nodes=graph.nodes[:at] + (cuda,) + graph.nodes[at + 1:])
    want = use_attention_templates(graph, triton_printer.attention_configs)
    got = use_attention_templates(rewritten, triton_printer.attention_configs)
    assert got == want and any(isinstance(n, ir.AttentionTemplate) for n in got.nodes)
    logsumexp = cpu.outputs[1]
    assert logsumexp is not None
    kept = dataclasses.replace(rewritten, outputs=rewritten.outputs + (logsumexp,))
    assert use_attention_templates(kept, triton_printer.attention_configs) == kept


@pytest.mark.parametrize("why, lq, causal, scale", [
    ("prefill's rows (more than MAX_QUERY_ROWS)", 5, False, None),
    ("a causal mask", 1, True, None),
])
def test_the_extern_is_kept_outside_the_rule(graphs, why, lq, causal, scale):
    fn = _attention(4, rotary=False, causal=causal)
    q, k, v, cos, sin, _ = _inputs(1, lq, 64, 4, "none", torch.float32)
    _, sched = _scheduled(graphs, fn, q, k, v, cos, sin, None)
    assert not _attention_kernels(sched) and len(_sdpa_externs(sched)) == 1, why


def test_an_explicit_scale_and_four_query_rows(graphs):
    fn = _attention(8, rotary=True, scale=0.3)
    inputs = _inputs(2, 4, 64, 8, "float", torch.float32, seed=3)
    _, sched = _scheduled(graphs, fn, *inputs)
    (kernel,) = _attention_kernels(sched)
    assert math.isclose(kernel.template.scale, 0.3)
    kiln.reset()
    _compare(kiln.compile(fn, options=ON)(*inputs), fn(*inputs), torch.float32)


def test_training_keeps_the_extern(graphs):
    """A training forward saves the logsumexp for its backward: the pass must not fire there, and
    the gradients are eager's."""
    fn = _attention(4, rotary=True)
    q, k, v, cos, sin, m = _inputs(1, 1, 64, 4, "float", torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    (gm, examples), bw = graphs(fn, q, k, v, cos, sin, m)
    assert bw is not None
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph))
    assert use_attention_templates(graph, triton_printer.attention_configs) == graph
    kiln.reset()
    got = kiln.compile(fn, options=ON)(q, k, v, cos, sin, m)
    want = fn(q, k, v, cos, sin, m)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    for a, b in zip(grads, torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", ["llama-1.1b", "dolly"])
@pytest.mark.parametrize("lq", [1, 4])
def test_the_template_compiles_for_sm90_without_spills(graphs, shape, lq):
    """The CUDA text (which the interpreter never runs) compiled offline for an H100: the configs
    `attention_configs` offers keep the tiles in registers at LLaMA-1.1B's decode shape (32 heads
    over 4 kv heads, d 64, 2048 keys) and dolly-v2-3b's (32 heads, d 80), bfloat16."""
    pytest.importorskip("triton.backends.nvidia")
    import dataclasses
    from kiln.codegen.triton.attention import launch
    from kiln.codegen.triton.offline import compile_for_gpu
    heads, kv_heads, d, lk = (32, 4, 64, 2048) if shape == "llama-1.1b" else (32, 32, 80, 512)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, lq, d, generator=g).bfloat16()
    k, v = (torch.randn(1, kv_heads, lk, d, generator=g).bfloat16() for _ in range(2))
    cos, sin = (torch.randn(1, 1, lq, d, generator=g).bfloat16() for _ in range(2))
    graph, sched = _scheduled(graphs, _attention(heads // kv_heads, rotary=True), q, k, v, cos, sin,
                              torch.rand(1, 1, lq, lk, generator=g) < 0.9)
    (kernel,) = _attention_kernels(sched)
    build = compile_for_gpu(kernel, graph.buffer_map(), (), config=launch(dataclasses.asdict(kernel.template.config)))
    assert build.spill_bytes == 0 and build.vector_loads, (kernel.template.config, build.registers, build.spill_bytes)


# -- tiny LLaMA (grouped-query) and GPT-NeoX (dolly's, head dim not a power of two) decoding

transformers = pytest.importorskip("transformers")
NEW_TOKENS = 4


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gpt_neox":
        config = transformers.GPTNeoXConfig(vocab_size=97, hidden_size=160, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25,
                                            use_parallel_residual=True)
        return transformers.GPTNeoXForCausalLM(config).eval()
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(model, ids) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                              cache_implementation="static")


def _decode_schedules(monkeypatch, arch: str) -> tuple[list, torch.Tensor, torch.Tensor]:
    """(the schedule of each graph compiled, eager's tokens, kiln's) for a static-cache generate
    under mode="reduce-overhead" through the interpreter."""
    scheduled = []

    def recording(graph):
        sched = schedule(graph)
        scheduled.append(sched)
        return sched
    monkeypatch.setattr(compile_module, "schedule", recording)
    kiln.reset()
    model = _model(arch)
    ids = torch.randint(1, 97, (1, 7), generator=torch.Generator().manual_seed(1))
    expected = _generate(model, ids)
    got = _generate(kiln.compile(model, mode="reduce-overhead", options=ON), ids)
    return scheduled, expected, got


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_static_cache_decoding_gives_eagers_tokens(arch, monkeypatch):
    scheduled, expected, got = _decode_schedules(monkeypatch, arch)
    assert torch.equal(got, expected)
    decode = [s for s in scheduled if _attention_kernels(s)]
    assert decode, "the decode step's attention is the template's"
    assert all(len(_attention_kernels(s)) == 2 and not _sdpa_externs(s) for s in decode)


def test_llama_decode_step_has_no_repeat_kv_copy_and_no_sdpa_extern(monkeypatch):
    """The tiny LLaMA's decode step (8 query heads sharing 2 kv heads) with the pass, and without
    it (the printer offering no template) as the control: the copy kernels and the externs are
    there without the pass and gone with it."""
    scheduled, expected, got = _decode_schedules(monkeypatch, "llama")
    decode = scheduled[-1]
    assert torch.equal(got, expected)
    assert len(_attention_kernels(decode)) == 2
    assert not _sdpa_externs(decode) and not _copies(decode), str(decode)

    monkeypatch.delattr(triton_printer, "attention_configs")
    before, expected, got = _decode_schedules(monkeypatch, "llama")
    assert torch.equal(got, expected)
    assert len(_sdpa_externs(before[-1])) == 2 and len(_copies(before[-1])) == 2, str(before[-1])
    kernels = [s for s in decode.steps if isinstance(s, ir.Kernel)]
    kernels_before = [s for s in before[-1].steps if isinstance(s, ir.Kernel)]
    # per layer: the copy and q's rotary embedding gone, the attention a kernel; per step: the mask's
    assert len(kernels) == len(kernels_before) - 2 * 2 - 1 + 2


def test_a_cache_longer_than_the_template_walks_keeps_the_extern():
    from kiln.codegen.triton.attention import MAX_KEYS, attention_configs
    assert attention_configs(1, MAX_KEYS, 64, torch.bfloat16)
    assert attention_configs(1, MAX_KEYS + 1, 64, torch.bfloat16) == []
