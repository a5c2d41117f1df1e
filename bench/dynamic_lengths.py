"""Issue #17's scenario: HF BERT (BertForMaskedLM, random weights) over ten sequence lengths, one
compiled model; per length: graphs captured so far, backend programs, compiled and eager step
times (median of `--steps`), and every recompile's reason (the failed guard in the user's terms).
Past the cache-size limit the compiled time should be eager's.

    python bench/dynamic_lengths.py [--size base|tiny] [--device cuda] [--dynamic true|none|false]
                                    [--batch 16] [--bf16] [--limit 8]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import kiln
from kiln import backends
from kiln.bench.suites import ensure_torchvision_importable
from kiln.capture import frame
from kiln.config import Options

LENGTHS = (128, 200, 256, 317, 384, 450, 512, 77, 300, 511)


def _time(fn, steps: int, device: str) -> float:
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="base", choices=("base", "tiny"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dynamic", default="true", choices=("true", "none", "false"))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--limit", type=int, default=8, help="cache_size_limit")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--backend", default="kiln")
    a = p.parse_args()
    ensure_torchvision_importable()
    import transformers
    torch.manual_seed(0)
    config = transformers.BertConfig() if a.size == "base" else transformers.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
    model = transformers.BertForMaskedLM(config).to(a.device).eval()
    inner = backends.resolve(a.backend, Options(cache_size_limit=a.limit))
    programs = []

    def counting(gm, example_inputs):
        programs.append(inner(gm, example_inputs))
        return programs[-1]
    dynamic = {"true": True, "none": None, "false": False}[a.dynamic]
    fast = kiln.compile(model, backend=counting, dynamic=dynamic, options={"cache_size_limit": a.limit})
    events: list = []
    frame._EVENT_SINKS.append(events)
    autocast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.bf16)
    print(f"BERT-{a.size} on {a.device}, batch {a.batch}, {'bf16 autocast' if a.bf16 else 'fp32'}, "
          f"dynamic={dynamic}, backend {a.backend}, cache_size_limit {a.limit}")
    print(f"{'length':>6} {'graphs':>6} {'programs':>8} {'compiled ms':>11} {'eager ms':>9} {'speedup':>7}")
    with torch.no_grad(), autocast, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for length in LENGTHS:
            ids = torch.randint(0, config.vocab_size, (a.batch, length), device=a.device)
            seen = len(events)
            fast(input_ids=ids)                      # compiles, if it will
            compiled = _time(lambda: fast(input_ids=ids), a.steps, a.device)
            eager = _time(lambda: model(input_ids=ids), a.steps, a.device)
            count = sum(len(getattr(p, "programs", None) or {0: p}) for p in programs)
            print(f"{length:>6} {len(programs):>6} {count:>8} {compiled * 1e3:>11.2f} {eager * 1e3:>9.2f} "
                  f"{eager / compiled:>6.2f}x")
            for e in events[seen:]:
                if e.kind in ("recompile", "eager"):
                    print(f"         {e.kind}: {e.detail}")
    frame._EVENT_SINKS.remove(events)


if __name__ == "__main__":
    main()
