"""Which parts of GPT-NeoX (dolly-v2-3b's shape, bf16 weights) kiln computes bit for bit as eager
does: each part compiled alone on the same random input, the share of output elements that differ
from eager's and the largest difference. generate() picks the same tokens only if the whole model
does, and a part that differs points at the kernel to look at.

    python bench/gpu_bitwise.py [--device cuda] [--layers 32]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

import kiln

sys.path.insert(0, os.path.dirname(__file__))
from generate import SIZES  # noqa: E402

EAGER_NUMERICS = {"numerics": "eager"}   # bit-for-bit comparisons need eager's order ([Note: numerics])


def _layouts(args) -> str:
    """(shape, strides) of the tensor arguments: a kernel's choice (cuDNN's) may depend on them."""
    return str([(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)])


class _AttentionOps(torch.utils._python_dispatch.TorchDispatchMode):
    """The attention kernels eager runs."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "attention" in str(func):
            self.ops.append(f"{func}{_layouts(args)}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _recorded_attention_externs():
    """A list that the attention externs of every program kiln builds meanwhile append their calls
    (op and layouts) to, for as long as those programs run."""
    import kiln.pipeline as backend
    calls, saved = [], backend.compile_prim_graph

    def recording(op):
        def call(*args, **kwargs):
            calls.append(f"{op}{_layouts(args)}")
            return op(*args, **kwargs)
        return call

    def keep(gm, example_inputs, **options):
        program = saved(gm, example_inputs, **options)
        g = getattr(program, "__globals__", {})
        for k, v in list(g.items()):
            if k.startswith("_extern") and "attention" in str(v):
                g[k] = recording(v)
        return program
    backend.compile_prim_graph = keep
    try:
        yield calls
    finally:
        backend.compile_prim_graph = saved


def _kiln_externs(fn, *args) -> tuple:
    """fn compiled by kiln, run once; then a second call's result and the attention externs it ran."""
    with _recorded_attention_externs() as externs:
        compiled = kiln.compile(fn, options=EAGER_NUMERICS)
        compiled(*args)
    externs.clear()
    return compiled(*args), externs


def compare(name: str, fn, *args) -> None:
    with torch.no_grad():
        with _AttentionOps() as eager_ops:
            want = fn(*args)
        kiln.reset()
        got, kiln_ops = _kiln_externs(fn, *args)
    if eager_ops.ops or kiln_ops:
        print(f"  {name}: eager runs {sorted(set(eager_ops.ops))}, kiln calls {sorted(set(kiln_ops))}")
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for i, (w, g) in enumerate(zip(want, got)):
        w, g = getattr(w, "logits", w), getattr(g, "logits", g)
        differ = (w != g).float().mean().item()
        worst = (w.float() - g.float()).abs().max().item()
        print(f"| {name}{f'[{i}]' if len(want) > 1 else ''} | {tuple(w.shape)} | {differ:.2%} | {worst:.3g} |",
              flush=True)


def _two_layers(model, h, positions):
    cos_sin = model.gpt_neox.rotary_emb(h, positions)
    for layer in model.gpt_neox.layers[:2]:
        h = _first(layer(h, position_embeddings=cos_sin))
    return h


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--divergence", action="store_true", help="only find the first layer that differs")
    p.add_argument("--decode", action="store_true", help="only compare generate()'s steps and attention kernels")
    a = p.parse_args()
    from kiln.bench.suites import ensure_torchvision_importable
    ensure_torchvision_importable()
    import transformers
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(**{**SIZES["dolly"], "num_hidden_layers": a.layers})
    with torch.device(a.device):
        model = transformers.GPTNeoXForCausalLM(config).to(torch.bfloat16).eval()
    layer = model.gpt_neox.layers[0]
    ids = torch.randint(0, config.vocab_size, (1, a.tokens), device=a.device)   # generate.py's prompt
    hidden = torch.randn(1, a.tokens, config.hidden_size, device=a.device, dtype=torch.bfloat16)
    positions = torch.arange(a.tokens, device=a.device)[None]
    print("| part | shape | elements differing | max abs diff |")
    print("|---|---|---|---|")
    if a.divergence:
        return first_divergence(model, ids, positions)
    if a.decode:
        return decode_steps(model, ids)
    compare("layer_norm", layer.input_layernorm, hidden)
    compare("gelu", lambda x: torch.nn.functional.gelu(x), hidden)
    compare("linear with bias", layer.mlp.dense_h_to_4h, hidden)
    compare("mlp", layer.mlp, hidden)
    compare("rotary cos/sin", model.gpt_neox.rotary_emb, hidden, positions)
    cos, sin = model.gpt_neox.rotary_emb(hidden, positions)
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb
    q, k = torch.randn(2, 1, 32, a.tokens, 80, device=a.device, dtype=torch.bfloat16).unbind(0)
    compare("rotary applied", lambda q, k, c, s: apply_rotary_pos_emb(q, k, c, s), q, k, cos, sin)
    compare("sdpa", lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, k)
    compare("attention", lambda h, c, s: layer.attention(h, None, position_embeddings=(c, s))[0], hidden, cos, sin)
    q, k, v = torch.randn(3, 1, 32, 16, 80, device=a.device, dtype=torch.bfloat16).unbind(0)
    with torch.no_grad():
        views = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v,
                                                                 is_causal=True)
        dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(f"  eager sdpa, q transposed-contiguous against contiguous: {(views != dense).float().mean():.2%} differ")
    compare("layer", lambda h, c, s: _first(layer(h, position_embeddings=(c, s))), hidden, cos, sin)
    compare("embedding", model.gpt_neox.embed_in, ids)
    compare("linear without bias (lm_head)", model.lm_head, hidden)
    compare("final norm and head", lambda h: model.lm_head(model.gpt_neox.final_layer_norm(h)), hidden)
    ln_in, ln_post = layer.input_layernorm, layer.post_attention_layernorm
    r1, r2 = torch.randn_like(hidden), torch.randn_like(hidden)
    compare("residual sum", lambda x, y, z: x + y + z, hidden, r1, r2)
    compare("layer_norm of a residual sum", lambda x, y, z: ln_in(x + y + z), hidden, r1, r2)
    compare("sum and two layer_norms of it", lambda x, y, z: ((h := x + y + z), ln_in(h), ln_post(h)), hidden, r1, r2)
    second = model.gpt_neox.layers[1]
    compare("two layers", lambda h, c, s: _first(second(_first(layer(h, position_embeddings=(c, s))),
                                                        position_embeddings=(c, s))), hidden, cos, sin)
    compare("two layers, rotary inside", lambda h, p: _two_layers(model, h, p), hidden, positions)
    masks(q, k, v, a.tokens)
    gelu_differences(hidden.device, torch.bfloat16)
    gelu_differences(hidden.device, torch.float32)
    compare(f"model ({a.layers} layers) logits", lambda i: model(input_ids=i, use_cache=False).logits, ids)
    compare(f"model ({a.layers} layers) hidden states", lambda i: model(
        input_ids=i, use_cache=False, output_hidden_states=True).hidden_states, ids)
    first_divergence(model, ids, positions)
    # Under compilation HF cannot look at the padding mask's values, so it builds the causal mask
    # that eager skips (`is_causal=True`); kiln elides it again ([Note: mask elision]). Eager on
    # the masked path shows what the mask alone would cost.
    from transformers import masking_utils
    plain = masking_utils._ignore_causal_mask_sdpa
    masking_utils._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        with torch.no_grad():
            masked = model(input_ids=ids, use_cache=False).logits
    finally:
        masking_utils._ignore_causal_mask_sdpa = plain
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits
    print(f"  eager with HF's explicit mask against eager: {(masked != eager).float().mean():.2%} of logits differ")


def decode_steps(model, ids, steps: int = 50) -> None:
    """generate()'s steps, eager against kiln: the first step whose scores differ, the first
    (step, layer) whose hidden state differs and that layer's norms and MLP on eager's input to it,
    and the attention kernels each ran."""
    def generate():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                  output_scores=True, output_hidden_states=True, return_dict_in_generate=True)
    with _AttentionOps() as eager_ops:
        want = generate()
    kiln.reset()
    forward = model.forward
    try:
        with _recorded_attention_externs() as kiln_ops:
            model.forward = kiln.compile(forward, options=EAGER_NUMERICS)
            got = generate()
    finally:
        model.forward = forward
    print(f"  same tokens: {torch.equal(want.sequences, got.sequences)}")
    for i, (w, g) in enumerate(zip(want.scores, got.scores)):
        if not torch.equal(w, g):
            finite = torch.isfinite(w) & torch.isfinite(g)
            worst = torch.where(finite, w.float() - g.float(), 0.0).abs().max().item()
            print(f"| first differing decode step {i}: scores | {tuple(w.shape)} | {(w != g).float().mean().item():.2%}"
                  f" | {worst:.3g} |")
            break
    else:
        print(f"  all {len(want.scores)} steps' scores bit-equal")
    eager_set, kiln_set = set(eager_ops.ops), set(kiln_ops)
    print(f"  attention kernels (with their layouts): eager {len(eager_set)}, kiln {len(kiln_set)}; only eager's: "
          f"{sorted(eager_set - kiln_set)[:3]}; only kiln's: {sorted(kiln_set - eager_set)[:3]}")
    for step, (ws, gs) in enumerate(zip(want.hidden_states, got.hidden_states)):
        bad = [j for j, (w, g) in enumerate(zip(ws, gs)) if not torch.equal(w, g)]
        if bad:
            break
    else:
        print("  every step's hidden states bit-equal")
        return
    j, n = bad[0], bad[0] - 1
    w, g = ws[j], gs[j]
    print(f"| step {step}: first differing hidden state {j} (of {len(ws)}) | {tuple(w.shape)} | "
          f"{(w != g).float().mean().item():.2%} | {(w.float() - g.float()).abs().max().item():.3g} |")
    if not 0 <= n < len(model.gpt_neox.layers) - 1:
        return                                   # the embedding, or the last layer with the final norm
    layer, h = model.gpt_neox.layers[n], ws[n]
    compare(f"step {step} layer {n} input_layernorm", layer.input_layernorm, h)
    compare(f"step {step} layer {n} post_attention_layernorm", layer.post_attention_layernorm, h)
    compare(f"step {step} layer {n} mlp", lambda x: layer.mlp(layer.post_attention_layernorm(x)), h)


def first_divergence(model, ids, positions) -> None:
    """The first layer whose compiled output differs from eager's (each layer compiled with its
    whole-model context), and its parts on eager's input to that layer."""
    with torch.no_grad():
        states = model(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
        kiln.reset()
        got = kiln.compile(lambda i: model(input_ids=i, use_cache=False, output_hidden_states=True), options=EAGER_NUMERICS)(ids).hidden_states
    bad = [i for i, (w, g) in enumerate(zip(states, got)) if not torch.equal(w, g)]
    if not bad:
        print("  every hidden state bit-equal")
        return
    n = bad[0] - 1
    layer, h = model.gpt_neox.layers[n], states[n]
    cos, sin = model.gpt_neox.rotary_emb(h, positions)
    print(f"  first different hidden state: {bad[0]}; layer {n}'s parts on eager's input to it:")
    compare(f"layer {n} input_layernorm", layer.input_layernorm, h)
    compare(f"layer {n} post_attention_layernorm", layer.post_attention_layernorm, h)
    compare(f"layer {n} attention", lambda x, c, s: layer.attention(layer.input_layernorm(x), None,
                                                                    position_embeddings=(c, s))[0], h, cos, sin)
    compare(f"layer {n} mlp", lambda x: layer.mlp(layer.post_attention_layernorm(x)), h)
    compare(f"layer {n} whole", lambda x, c, s: _first(layer(x, position_embeddings=(c, s))), h, cos, sin)
    with torch.no_grad():
        x = layer.mlp.dense_h_to_4h(layer.post_attention_layernorm(h))
    print(f"  layer {n} mlp pre-activation range: [{x.min().item():.4g}, {x.max().item():.4g}]")
    compare(f"layer {n} gelu on its pre-activations", lambda t: torch.nn.functional.gelu(t), x)
    compare(f"layer {n} dense_4h_to_h", layer.mlp.dense_4h_to_h, torch.nn.functional.gelu(x))


def masks(q, k, v, tokens: int) -> None:
    """Does a boolean mask change eager's attention numerics against `is_causal` / no mask?"""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        causal = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()[None, None]
        by_flag, by_mask = sdpa(q, k, v, is_causal=True), sdpa(q, k, v, attn_mask=causal)
        q1 = q[:, :, -1:]
        ones = torch.ones(1, 1, 1, tokens, dtype=torch.bool, device=q.device)
        none, all_true = sdpa(q1, k, v), sdpa(q1, k, v, attn_mask=ones)
    print(f"  eager sdpa, prefill: a causal bool mask against is_causal: {(by_flag != by_mask).float().mean():.2%} differ;"
          f" decode: an all-true mask against none: {(none != all_true).float().mean():.2%} differ")


def gelu_differences(device, dtype) -> None:
    """The elements where kiln's gelu differs from eager's, against a float64 reference. (Triton's
    bundled libdevice erff differed from eager's by an ulp in 13% of float32 values; kiln links the
    CUDA toolkit's of torch's version when installed: [Note: libdevice].)"""
    fn = torch.nn.functional.gelu
    x = torch.randn(1 << 22, device=device, dtype=dtype) * 3
    with torch.no_grad():
        want = fn(x)
        kiln.reset()
        got = kiln.compile(lambda t: fn(t), options=EAGER_NUMERICS)(x)
        exact = fn(x.double())
    bad = (want != got).nonzero().flatten()
    print(f"  gelu on {x.numel()} {dtype} values: {bad.numel()} differ; eager nearer the float64 value in "
          f"{int(((want.double() - exact).abs() < (got.double() - exact).abs())[bad].sum())}")
    for i in bad[:6].tolist():
        print(f"    x={x[i].item():.8g} eager={want[i].item():.8g} kiln={got[i].item():.8g} float64={exact[i].item():.8g}")


if __name__ == "__main__":
    main()
