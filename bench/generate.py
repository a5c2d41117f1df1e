"""The PyTorch 2.0 announcement's example: a GPT-NeoX model of dolly-v2-3b's shape (random weights, bf16),
`model.forward = kiln.compile(model.forward)`, `generate()` greedy to 50 tokens: the same tokens as eager, and
how many graphs kiln compiled (capture) and how many programs its backend built for them. With
`--inductor`, torch.compile's forward is timed too, and the three are timed round-robin in this one
process (eager, kiln, inductor, eager, ...) after every compile.

    python bench/generate.py [--size dolly|tiny] [--device cuda] [--tokens 50] [--backend kiln]
                             [--numerics eager|fast] [--inductor] [--rounds 3]
"""
from __future__ import annotations

import argparse
import math
import time

import torch

import kiln
from kiln import backends, log
from kiln.config import Options
from kiln.bench.suites import ensure_torchvision_importable

SIZES = {  # dolly-v2-3b's config.json, and a tiny one for a CPU check
    "dolly": dict(vocab_size=50280, hidden_size=2560, num_hidden_layers=32, num_attention_heads=32,
                  intermediate_size=10240, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True),
    "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=256, max_position_embeddings=256, rotary_pct=0.25),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="dolly", choices=SIZES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--backend", default="kiln")
    p.add_argument("--dtype", default=None, help="bfloat16 or float32 (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--numerics", default="eager", choices=("eager", "fast"),
                   help="kiln's options['numerics'] (default eager: the tokens and scores must be eager's bits)")
    p.add_argument("--inductor", action="store_true", help="also time torch.compile(model.forward)")
    p.add_argument("--rounds", type=int, default=3, help="timed generate() calls of each, interleaved")
    a = p.parse_args()
    ensure_torchvision_importable()
    import transformers
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device == "cuda" else torch.float32)
    with torch.device(a.device):
        model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SIZES[a.size])).to(dtype).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, a.prompt), device=a.device)

    def generate(scores: bool = False):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False,
                                 output_scores=scores, return_dict_in_generate=scores)
        if a.device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - start

    generate()                                   # warm-up: the timed eager run is a steady one
    eager, eager_s = generate(scores=True)
    expected = eager.sequences
    graphs = []

    def counting_backend(gm, example_inputs):
        compiled = backends.resolve(a.backend, Options(numerics=a.numerics))(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    original = model.forward
    forwards = {"eager": original, "kiln": kiln.compile(original, backend=counting_backend)}
    model.forward = forwards["kiln"]
    first, first_s = generate()
    stages = log.totals()                       # where the first generate()'s compiling went
    second, second_s = generate()
    scored, _ = generate(scores=True)           # a third, cached run: the scores of each step
    programs = [len(getattr(g, "programs", {})) or 1 for g in graphs]
    print(f"GPT-NeoX {a.size} on {a.device}, {a.tokens} tokens, backend {a.backend}, numerics {a.numerics}")
    print(f"  same tokens as eager: first run {torch.equal(first, expected)}, second run {torch.equal(second, expected)}")
    print(f"  compilations (captured graphs): {len(graphs)}; backend programs per graph: {programs}")
    print(f"  generate() seconds: eager {eager_s:.2f}, compiled first (compiles included) {first_s:.2f}, "
          f"compiled second {second_s:.2f}")
    print("  the first generate()'s compile stages, seconds: "
          + ", ".join(f"{name} {t:.2f}" for name, t in sorted(stages.items(), key=lambda kv: -kv[1]) if t >= 0.05))
    if a.inductor:
        model.forward = forwards["inductor"] = torch.compile(original)
        inductor_out, inductor_first_s = generate()
        print(f"  inductor: first generate() (compiles included) {inductor_first_s:.2f} s, "
              f"same tokens as eager {torch.equal(inductor_out, expected)}")
    times: dict[str, list[float]] = {name: [] for name in forwards}
    for _ in range(a.rounds):                   # interleaved: a drift hits every forward alike
        for name, forward in forwards.items():
            model.forward = forward
            times[name].append(generate()[1])
    model.forward = forwards["kiln"]
    median = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
    print("  interleaved generate() seconds (median of %d): " % a.rounds
          + ", ".join(f"{name} {s:.3f} ({median['eager'] / s:.2f}x over eager)" for name, s in median.items()))
    if "inductor" in median:
        print(f"  kiln / inductor speed: {median['inductor'] / median['kiln']:.2f}")
    if not torch.equal(first, expected):
        print("  " + first_difference(expected, first, eager.scores, a.prompt))
    steps = [i for i, (w, g) in enumerate(zip(eager.scores, scored.scores)) if not torch.equal(w, g)]
    print(f"  first step whose scores are not eager's bit for bit: {steps[0] if steps else 'none'}")


def first_difference(expected: torch.Tensor, got: torch.Tensor, scores, prompt: int) -> str:
    """Where the compiled tokens leave eager's, and how close eager's own choice was there: the gap
    between eager's logits for its token and for the compiled one, against the spacing of bfloat16
    numbers at that magnitude (a gap within it is a tie that rounding decides)."""
    k = int((expected[0] != got[0]).nonzero()[0])
    step = scores[k - prompt][0].float()
    want, chose = int(expected[0, k]), int(got[0, k])
    gap = float(step[want] - step[chose])
    spacing = 2.0 ** (math.floor(math.log2(max(abs(float(step[want])), 1e-30))) - 7)
    return (f"first different token: position {k - prompt} of {expected.shape[1] - prompt}; eager's logit gap "
            f"between its token and the compiled one there: {gap:.4g} (bfloat16 spacing at that magnitude: {spacing:.4g})")


if __name__ == "__main__":
    main()
