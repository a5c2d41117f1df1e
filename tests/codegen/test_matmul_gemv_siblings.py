"""Sibling GEMVs ([Note: sibling GEMVs] in kiln/codegen/matmul_templates.py): products of a few rows
that read the same A computed by one GEMV template kernel. LLaMA's gate and up (one N) are one
loop with the `silu(gate) * up` as its epilogue, gate and up never stored; q, k and v (two Ns) are
the segments of one launch. Run under Triton's interpreter on CPU tensors against eager (float32
closely, bfloat16 by the benchmark's rule against float64), kernels counted on kiln's schedule.

As in test_matmul_gemv.py, most tests lower the rule's size thresholds (`any_size`) so that small
shapes take the GEMV form; M is 1, 2 or 3 (in a block of 1, 2 or 4 rows), N is no multiple of
BLOCK_N (4) and K = 300 no multiple of BLOCK_K (128 for float32, 256 for bfloat16)."""
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen import compile as codegen_compile
from kiln.codegen import ir
from kiln.codegen import triton as triton_printer
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.matmul_padding import extern_name
from kiln.codegen.matmul_templates import group_sibling_gemvs, use_matmul_templates
from kiln.codegen.scheduler import schedule
from kiln.codegen.triton import heuristics
from kiln.codegen.triton.heuristics import default_sibling_gemv_config
from tests.codegen.conftest import compare_with_eager

FP32 = dict(rtol=1e-5, atol=1e-5)
K = 300


@pytest.fixture
def schedules(monkeypatch):
    """Every schedule kiln's code generator makes while the test runs."""
    made = []

    def keep(graph):
        made.append(schedule(graph))
        return made[-1]
    monkeypatch.setattr(codegen_compile, "schedule", keep)
    return made


def _schedule(graphs, fn, *inputs, siblings=True):
    """`fn`'s forward scheduled as the default mode compiles it for the Triton printer (`siblings`:
    with sibling products grouped, as it does; else each product alone, as before)."""
    (gm, examples), _ = graphs(fn, *inputs)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph))
    if siblings:
        graph = group_sibling_gemvs(graph, triton_printer.default_sibling_gemv_config)
    return schedule(use_matmul_templates(graph, triton_printer.default_matmul_configs)), gm, examples


def _siblings(sched) -> list[ir.Kernel]:
    return [s for s in sched.steps if isinstance(s, ir.Kernel) and isinstance(s.template, ir.SiblingGemvs)]


def _launches(sched) -> int:
    return len(sched.steps)


def _run(gm, examples, inputs):
    program = compile_prim_graph(gm, examples, printer=triton_printer)
    assert "_extern" not in program.host_source, program.host_source
    return program(*inputs)


# -- the rule's sizes

def test_the_rule_takes_llama_1b_siblings_as_groups():
    """LLaMA-1.1B's q, k, v (2048 -> 2048, 256, 256) and gate, up (2048 -> 5632 each) at one token, in
    bfloat16: each group meets the rule as a whole. gate and up: blocks of 8 columns of both (704
    programs of 16 weight rows each, as the rule tiles their concatenation: 16 columns of 11264);
    q, k, v: blocks of 4 (512 + 64 programs)."""
    qkv = default_sibling_gemv_config(1, [2048, 256, 256], 2048, torch.bfloat16)
    gate_up = default_sibling_gemv_config(1, [5632, 5632], 2048, torch.bfloat16)
    assert (qkv.form, qkv.BLOCK_M, qkv.BLOCK_N, qkv.BLOCK_K) == ("gemv", 1, 4, 256), qkv
    assert (gate_up.form, gate_up.BLOCK_N, gate_up.BLOCK_K) == ("gemv", 8, 256), gate_up
    assert heuristics.default_matmul_configs(1, 256, 2048, torch.bfloat16) == [], "k alone is no GEMV"


@pytest.mark.parametrize("args, why", [
    ((5, [2048, 256, 256], 2048, torch.bfloat16), "more rows than GEMV_DEFAULT_ROWS"),
    ((1, [256, 256], 2048, torch.bfloat16), "2 MiB, but 128 column blocks together for 132 SMs"),
    ((1, [128, 128], 2048, torch.bfloat16), "1 MiB together only with a third member"),
])
def test_the_rule_refuses_groups_that_fail_it_as_a_whole(args, why):
    assert default_sibling_gemv_config(*args) is None, why


def test_members_too_small_alone_join_a_group_that_meets_the_rule(graphs, monkeypatch):
    """With the thresholds at 30 column blocks, none of q (90 columns: 23 blocks), k and v (42: 11)
    is a GEMV alone; together (45 blocks) they are one."""
    monkeypatch.setattr(heuristics, "GEMV_MIN_WEIGHT_BYTES", 0)
    monkeypatch.setattr(heuristics, "GEMV_MIN_COLUMN_BLOCKS", 30)
    torch.manual_seed(0)
    inputs = [torch.randn(1, K), torch.randn(90, K) / K ** 0.5, torch.randn(42, K) / K ** 0.5, torch.randn(42, K) / K ** 0.5]
    alone, _, _ = _schedule(graphs, _qkv, *inputs, siblings=False)
    assert not [s for s in alone.steps if isinstance(s, ir.Kernel)], str(alone)     # three externs
    sched, gm, examples = _schedule(graphs, _qkv, *inputs)
    assert len(_siblings(sched)) == 1 and _launches(sched) == 1, str(sched)
    compare_with_eager(_qkv, _run(gm, examples, inputs), inputs, torch.float32)


# -- a LLaMA MLP block: gate and up of one N, silu(gate) * up as their epilogue

def _mlp(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _mlp_inputs(m, n, dtype):
    torch.manual_seed(0)
    return [torch.randn(m, K).to(dtype), (torch.randn(n, K) / K ** 0.5).to(dtype),
            (torch.randn(n, K) / K ** 0.5).to(dtype), (torch.randn(K, n) / n ** 0.5).to(dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_a_llama_mlp_block_is_two_kernels(graphs, any_size, m, dtype):
    """gate, up and silu(gate) * up in one template kernel (gate and up never stored), down a GEMV of
    its own: two launches where each product alone made three."""
    n = 77
    inputs = _mlp_inputs(m, n, dtype)
    before, _, _ = _schedule(graphs, _mlp, *inputs, siblings=False)
    sched, gm, examples = _schedule(graphs, _mlp, *inputs)
    (group,) = _siblings(sched)
    assert group.template.segments == ((0, 1),) and n % group.template.config.BLOCK_N != 0, str(sched)
    assert group.template.config.BLOCK_M >= m and K % group.template.config.BLOCK_K != 0
    assert _launches(before) == 3 and _launches(sched) == 2, f"{before}\n----\n{sched}"
    gate, up, product = group.origins
    assert {gate, up} <= sched.local_buffers and gate not in group.buffer_args and up not in group.buffer_args
    assert any(isinstance(e, ir.Op) and e.name == "sigmoid" for s in group.stages[0].body for e in ir.walk(s.expr))
    compare_with_eager(_mlp, _run(gm, examples, inputs)[0], inputs, dtype)


def test_members_read_outside_the_kernel_are_stored(graphs, any_size):
    """gate and up returned besides silu(gate) * up: the kernel stores all three."""
    def fn(x, w_gate, w_up):
        gate, up = F.linear(x, w_gate), F.linear(x, w_up)
        return F.silu(gate) * up, gate, up
    inputs = _mlp_inputs(2, 77, torch.float32)[:3]
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    (group,) = _siblings(sched)
    assert _launches(sched) == 1 and not sched.local_buffers & set(group.origins), str(sched)
    stored = {s.buffer for s in group.stages[0].body if isinstance(s, ir.Store)}
    assert stored == set(group.origins), str(sched)
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, torch.float32)


# -- q, k and v: one launch over the stacked column ranges

def _qkv(x, w_q, w_k, w_v):
    return F.linear(x, w_q), F.linear(x, w_k), F.linear(x, w_v)


def _qkv_bias(x, w_q, w_k, w_v, b_q, b_k, b_v):     # Qwen's projections carry biases
    return F.linear(x, w_q, b_q), F.linear(x, w_k, b_k), F.linear(x, w_v, b_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("fn", [_qkv, _qkv_bias])
def test_a_qkv_triple_is_one_launch(graphs, any_size, fn, m, dtype):
    """q (90 columns) and k, v (42 each): two segments, k and v computed together; one launch where
    each product alone made three. Biases: addmm's (bfloat16) in each member's body; float32's
    mm + add: each add joins the segment whose result it reads."""
    torch.manual_seed(0)
    ns = (90, 42, 42)
    inputs = [torch.randn(m, K).to(dtype)] + [(torch.randn(n, K) / K ** 0.5).to(dtype) for n in ns]
    if fn is _qkv_bias:
        inputs += [torch.randn(n).to(dtype) for n in ns]
    before, _, _ = _schedule(graphs, fn, *inputs, siblings=False)
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    (group,) = _siblings(sched)
    assert group.template.segments == ((0,), (1, 2)) and len(group.stages) == 2, str(sched)
    assert _launches(before) == 3 and _launches(sched) == 1, f"{before}\n----\n{sched}"
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, dtype)


# -- where products of one A are not grouped

def test_an_epilogue_reading_two_segments_is_refused(graphs, any_size):
    """q + k (two segments' results) cannot run on one program's columns: refused with the reason,
    a kernel of its own; k's own epilogue (a ReLU) joins its segment."""
    def fn(x, w_q, w_k):
        q, k = F.linear(x, w_q), F.linear(x, w_k)
        return q[:, :42] + k, torch.relu(k)
    torch.manual_seed(0)
    inputs = [torch.randn(2, K), torch.randn(90, K) / K ** 0.5, torch.randn(42, K) / K ** 0.5]
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    (group,) = _siblings(sched)
    assert _launches(sched) == 2 and len(group.origins) == 3, str(sched)
    assert any("several segments" in w.reason for w in sched.refused), str(sched)
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, torch.float32)


def test_a_weight_made_after_the_first_member_keeps_them_apart(graphs, any_size):
    """The group would run where its first product was; the second's weight is computed later (a
    scaled weight made between them), so each stays a GEMV of its own."""
    def fn(x, w1, w2):
        first = F.linear(x, w1)
        return first, F.linear(x, w2 * first.mean())
    torch.manual_seed(0)
    inputs = [torch.randn(1, K), torch.randn(77, K) / K ** 0.5, torch.randn(77, K) / K ** 0.5]
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    assert not _siblings(sched), str(sched)
    assert sum(isinstance(s, ir.Kernel) and s.template is not None for s in sched.steps) == 2, str(sched)
    compare_with_eager(fn, _run(gm, examples, inputs), inputs, torch.float32)


def test_many_rows_or_other_operands_keep_their_own_products(graphs, any_size):
    """Five rows (GEMV_DEFAULT_ROWS is 4); products of different As; a B not contiguous along K."""
    many = [torch.randn(5, K), torch.randn(77, K), torch.randn(77, K)]
    sched, _, _ = _schedule(graphs, lambda x, a, b: (F.linear(x, a), F.linear(x, b)), *many)
    assert not _siblings(sched) and all(isinstance(s, ir.ExternKernel) for s in sched.steps), str(sched)
    two = [torch.randn(1, K), torch.randn(1, K), torch.randn(77, K), torch.randn(77, K)]
    sched, _, _ = _schedule(graphs, lambda x, y, a, b: (F.linear(x, a), F.linear(y, b)), *two)
    assert not _siblings(sched), str(sched)
    across = [torch.randn(1, K), torch.randn(K, 77), torch.randn(K, 77)]
    sched, _, _ = _schedule(graphs, lambda x, a, b: (x @ a, x @ b), *across)
    assert not _siblings(sched), str(sched)


def test_max_autotune_keeps_its_per_product_choice(any_size, schedules):
    """Under max-autotune the autotuner decides each product alone (the interpreter: the first
    tiling, the GEMV); no sibling kernel."""
    x, wg, wu, wd = _mlp_inputs(1, 77, torch.float32)
    kiln.reset()
    with torch.no_grad():
        got = kiln.compile(_mlp, mode="max-autotune", options={"triton_interpret": True})(x, wg, wu, wd)
    torch.testing.assert_close(got, _mlp(x, wg, wu, wd), **FP32)
    (sched,) = schedules
    templates = [s for s in sched.steps if isinstance(s, ir.Kernel) and s.template is not None]
    assert len(templates) == 3 and not _siblings(sched), str(sched)


# -- a whole decode step: a tiny LLaMA with a static cache

def test_a_tiny_llama_decodes_with_sibling_gemvs_and_eager_tokens(any_size, schedules):
    """generate() with transformers' StaticCache, every product forced to the GEMV form, through the
    interpreter: eager's tokens; the decode step's every layer has one q/k/v kernel of two segments
    and one gate/up kernel with silu(gate) * up in it, no extern product and no silu kernel."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=36, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=50, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                  pad_token_id=0, cache_implementation="static")
    kiln.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model.generate(ids, **kwargs)
        model.forward = kiln.compile(model.forward, options={"triton_interpret": True})
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected), (got, expected)
    decode = [s for s in schedules if _siblings(s)]
    assert decode, "no decode step grouped its products:\n" + "\n----\n".join(map(str, schedules))
    step = decode[-1]
    groups = [k.template.segments for k in _siblings(step)]
    layers = config.num_hidden_layers
    assert groups.count(((0,), (1, 2))) == layers and groups.count(((0, 1),)) == layers, str(step)
    assert not [s for s in step.steps if isinstance(s, ir.ExternKernel) and extern_name(s) in ("mm", "addmm")], str(step)
    silu = [k for k in step.steps if isinstance(k, ir.Kernel)
            and any(isinstance(e, ir.Op) and e.name == "sigmoid" for st in k.stages for s in st.body for e in ir.walk(s.expr))]
    assert all(isinstance(k.template, ir.SiblingGemvs) for k in silu) and len(silu) == layers, str(step)


# -- the GPU text, compiled for sm_90 without a GPU

@pytest.mark.parametrize("fn, ns", [(_qkv, (2048, 256, 256)), (_mlp, (5632, 5632))])
def test_sibling_gemvs_compile_for_sm90_with_vector_loads_and_no_spills(graphs, fn, ns):
    """LLaMA-1.1B's q/k/v (the segments' dispatch) and gate/up with silu(gate) * up, bfloat16 at one
    token, the rule's thresholds as they are: Triton's compiler for an H100 takes the printed kernel
    (the interpreter never checks the GPU text), reads the weights in 128-bit loads and keeps every
    sum in registers."""
    pytest.importorskip("triton.backends.nvidia")
    from kiln.codegen.triton.offline import compile_for_gpu
    k, dtype = 2048, torch.bfloat16
    inputs = [torch.randn(1, k).to(dtype)] + [torch.randn(n, k).to(dtype) for n in ns]
    if fn is _mlp:
        inputs.append(torch.randn(k, ns[0]).to(dtype))
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    (kernel,) = _siblings(sched)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    config = heuristics.template_launch(dataclasses.asdict(kernel.template.config))
    build = compile_for_gpu(kernel, graph.buffer_map(), [], config=config)
    assert build.vector_loads, sorted(build.memory_ops())
    assert build.spill_bytes in (0, None), build.spill_bytes
