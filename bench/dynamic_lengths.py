"""Issue #17's scenario: HF BERT (BertForMaskedLM, random weights) over ten sequence lengths, one
compiled model; per length: graphs captured so far, backend programs, compiled and eager step
times (median of `--steps`), and every recompile's reason (the failed guard in the user's terms).
Past the cache-size limit the compiled time should be eager's.

    python bench/dynamic_lengths.py [--size base|tiny] [--device cuda] [--dynamic true|none|false]
                                    [--batch 16] [--bf16] [--limit 8] [--steps 5]
                                    [--lengths 128,200,...] [--compare-static] [--json out.jsonl]

`--compare-static` (issue #17, item 3: symbolic kernels as fast as static ones) also compiles a
copy of the model statically (`dynamic=False`, a cache limit above the number of lengths, so each
length is its own static graph) and times it in the same rounds as the dynamic model and eager
(one step of each in turn), and prints per length the static time and `dyn/static`, the dynamic
model's speed relative to the static one (>= 0.90 is the target at every length).
"""
from __future__ import annotations

import argparse
import copy
import json
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


def _time_round_robin(fns: dict, steps: int, device: str) -> dict:
    """Median seconds of each of `fns`, timed in rounds (one step of each, in turn), so all of them
    see the same clocks and the same neighbours on the GPU."""
    times: dict = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


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
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated sequence lengths")
    p.add_argument("--compare-static", action="store_true",
                   help="then time kiln dynamic=False at each length (a static graph per length)")
    p.add_argument("--json", help="append one JSON line per length to this file")
    a = p.parse_args()
    lengths = tuple(int(x) for x in a.lengths.split(","))
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
    static = None
    if a.compare_static:    # a second copy compiled statically: its own entries, a static graph per length
        limit = len(lengths) + 8
        static = kiln.compile(copy.deepcopy(model), backend=backends.resolve(a.backend, Options(cache_size_limit=limit)),
                              dynamic=False, options={"cache_size_limit": limit})
    print(f"{'length':>6} {'graphs':>6} {'programs':>8} {'compiled ms':>11} {'eager ms':>9} {'speedup':>7}"
          + (f" {'static ms':>9} {'dyn/static':>10}" if static else ""))
    rows = []
    with torch.no_grad(), autocast, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for length in lengths:
            ids = torch.randint(0, config.vocab_size, (a.batch, length), device=a.device)
            seen = len(events)
            fast(input_ids=ids)                      # compiles, if it will
            fns = {"compiled": lambda: fast(input_ids=ids), "eager": lambda: model(input_ids=ids)}
            if static is not None:
                frame._EVENT_SINKS.remove(events)    # the static copy's compiles are not this run's
                static(input_ids=ids)
                frame._EVENT_SINKS.append(events)
                fns["static"] = lambda: static(input_ids=ids)
            ms = {k: v * 1e3 for k, v in _time_round_robin(fns, a.steps, a.device).items()}
            count = sum(len(getattr(p, "programs", None) or {0: p}) for p in programs)
            line = (f"{length:>6} {len(programs):>6} {count:>8} {ms['compiled']:>11.2f} {ms['eager']:>9.2f} "
                    f"{ms['eager'] / ms['compiled']:>6.2f}x")
            if static is not None:
                line += f" {ms['static']:>9.2f} {ms['static'] / ms['compiled']:>9.2f}x"
            print(line)
            rows.append({"length": length, "graphs": len(programs), "programs": count,
                         "compiled_ms": ms["compiled"], "eager_ms": ms["eager"],
                         **({"static_ms": ms["static"]} if static is not None else {})})
            for e in events[seen:]:
                if e.kind in ("recompile", "eager"):
                    print(f"         {e.kind}: {e.detail}")
    frame._EVENT_SINKS.remove(events)
    speedups = [r["eager_ms"] / r["compiled_ms"] for r in rows]
    print(f"geomean speedup over eager: {statistics.geometric_mean(speedups):.2f}x")
    if static is not None:
        worst = min(r["static_ms"] / r["compiled_ms"] for r in rows)
        print(f"slowest length relative to static: {worst:.2f}x (target >= 0.90)")
    if a.json:
        with open(a.json, "a") as f:
            for row in rows:
                f.write(json.dumps({"size": a.size, "device": a.device, "batch": a.batch, "bf16": a.bf16,
                                    "dynamic": a.dynamic, "backend": a.backend, **row}) + "\n")


if __name__ == "__main__":
    main()
