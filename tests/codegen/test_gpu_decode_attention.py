"""Decoding's attention template on a real GPU ([Note: decode attention] in
kiln/codegen/attention_templates.py): an SDPA of one query row over a cache, grouped-query (LLaMA's
`repeat_kv` copy before it) and plain, bf16 with a float mask, compiles to kiln's attention kernel
and gives eager's answer by the benchmark's rule against float64; a tiny
LLaMA with a static cache decodes eager's tokens (or
swaps a near tie: [Note: greedy decoding's near ties] in kiln/bench/accuracy.py). Skipped without CUDA; `bash bench/gpu_checks.sh
tests` runs it on the GPU machine. (Written on a machine without a GPU.)"""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.bench.accuracy import same, same_greedy_decode
from kiln.codegen.triton import launcher

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _attention(q, k, v, mask, group):
    b, hk, s, d = k.shape          # transformers' repeat_kv, then SDPA with the mask
    k = k[:, :, None].expand(b, hk, group, s, d).reshape(b, hk * group, s, d)
    v = v[:, :, None].expand(b, hk, group, s, d).reshape(b, hk * group, s, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("heads, kv_heads, d, keys", [(32, 4, 64, 58), (32, 32, 80, 768), (8, 1, 128, 300)])
def test_decode_attention_is_kilns_kernel_with_eagers_answer(heads, kv_heads, d, keys):
    torch.manual_seed(0)
    q = torch.randn(1, heads, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, keys, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = torch.zeros(1, 1, 1, keys, device="cuda", dtype=torch.bfloat16)
    mask[..., keys - 5:] = float("-inf")          # the cache's unfilled tail
    group = heads // kv_heads
    kiln.reset()
    before = {id(x) for x in launcher.BUILT}
    with torch.no_grad():
        got = kiln.compile(_attention, dynamic=False)(q, k, v, mask, group)
        torch.cuda.synchronize()
        reference = _attention(q.double(), k.double(), v.double(), mask.double(), group)
    built = [x for x in launcher.BUILT if id(x) not in before]
    assert sum(x.attention is not None for x in built) == 1, "the attention is kiln's template kernel"
    # (the interpreter's tests read the schedule: no repeat_kv copy, no SDPA extern)
    verdict = same(_attention(q, k, v, mask, group), got, reference, tol=1e-2)
    assert verdict.ok, verdict.detail


def test_tiny_llama_static_cache_decodes_eagers_tokens():
    import transformers
    from kiln.bench.suites import ensure_torchvision_importable
    ensure_torchvision_importable()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(1, 1000, (1, 8), device="cuda")
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12, do_sample=False,
              pad_token_id=0, cache_implementation="static", return_dict_in_generate=True, output_logits=True)
    kiln.reset()
    with torch.no_grad():
        expected = model.generate(ids, **kw)
        got = kiln.compile(model, mode="reduce-overhead").generate(ids, **kw)
    verdict = same_greedy_decode(model, ids, expected, got)     # [Note: greedy decoding's near ties]
    assert verdict.ok, verdict.detail
    print(verdict.detail or "eager's tokens")
