"""Cache-hit overhead of graph capture: kiln vs torch.compile, both with backend="eager".

The function takes 10 small tensors and adds them; the time each compiler adds to a call is
(median time of a compiled call) - (median time of the plain Python call), measured in one run,
interleaved, after warm-up. Run: `python bench/capture_overhead.py` (OMP_NUM_THREADS=1 advised).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import kiln


def ten_args(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9


def per_call_us(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main(rounds: int = 30, calls: int = 2000) -> dict:
    args = [torch.randn(8) for _ in range(10)]
    candidates = {
        "eager": ten_args,
        "kiln": kiln.compile(ten_args, backend="eager"),
        "torch.compile": torch.compile(ten_args, backend="eager"),
    }
    for fn in candidates.values():  # compile and warm up
        for _ in range(100):
            fn(*args)
    samples = {name: [] for name in candidates}
    for _ in range(rounds):  # interleaved, so drift hits all three alike
        for name, fn in candidates.items():
            samples[name].append(per_call_us(fn, args, calls))
    median = {name: statistics.median(s) for name, s in samples.items()}
    result = {
        "eager_us": median["eager"],
        "kiln_us": median["kiln"],
        "torch_compile_us": median["torch.compile"],
        "kiln_overhead_us": median["kiln"] - median["eager"],
        "torch_compile_overhead_us": median["torch.compile"] - median["eager"],
    }
    return result


if __name__ == "__main__":
    r = main(*(int(a) for a in sys.argv[1:]))
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    print(f"eager call:            {r['eager_us']:.2f} us")
    print(f"kiln call:             {r['kiln_us']:.2f} us  (adds {r['kiln_overhead_us']:.2f} us)")
    print(f"torch.compile call:    {r['torch_compile_us']:.2f} us  (adds {r['torch_compile_overhead_us']:.2f} us)")
    verdict = "kiln adds less" if r["kiln_overhead_us"] <= r["torch_compile_overhead_us"] else "kiln adds MORE"
    print(f"{verdict} than torch.compile per cache-hit call")
