"""Where a decoding step's GPU time goes, kiln against Inductor: for each form, one profiled
`generate()` after a warm-up, its kernels grouped by name, per generated token. A probe for #36:

    python bench/decode_profile.py dolly [--forms inductor-static,kiln-static] [--new 20] [--out DIR]

Prints one table a form (the top kernels by time, launches and microseconds a token) and the host's
seconds a token; then, under cProfile, where the host's Python time goes a token (the functions of
most own time: generate's loop, guards, kiln's runtime; cProfile slows Python, so read shares, not
absolute times). Before the profiles, an unprofiled split of a token's wall time on the host: the
time inside the model's call (kiln's guards, entry and replay launch: kiln forms only, where the call
can be wrapped without changing what is compiled), the time the deferred stop check waits for the
GPU ([Note: decoding without a stop sync] in kiln/api.py), and the rest (generate()'s own Python). A
wait near zero means the GPU idles for the host. kiln's part is split further, medians a call: the
entry's guard, the compiled program's call, and the CUDA-graph replay inside it. DIR/decode_profile.json
holds every kernel and function."""
import argparse
import cProfile
import collections
import json
import os
import pstats
import time
import warnings

import torch

from kiln.bench.decoding import build, forms

p = argparse.ArgumentParser()
p.add_argument("model", nargs="?", default="dolly")
p.add_argument("--forms", default="inductor-static,kiln-static")
p.add_argument("--new", type=int, default=20)
p.add_argument("--top", type=int, default=14)
p.add_argument("--out", default=None)
p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test of the script, kernels not listed)")
a = p.parse_args()
warnings.simplefilter("ignore")
# kiln's part of a decode step's host time, by piece: the entry's guard (a passing check), the
# compiled program's call (aot runtime: primals, the program, the epilogue) and, inside it, the
# CUDA-graph replay (input copies, the graph's launch, output clones). Wrapped before compiling.
pieces = collections.defaultdict(list)


def _timed(key, fn):
    def call(*args, **kwargs):
        t = time.perf_counter()
        result = fn(*args, **kwargs)
        if result is not False:
            pieces[key].append(time.perf_counter() - t)
        return result
    return call


import kiln.capture.convert as _convert
import kiln.aot.runtime as _runtime
import kiln.runtime.cudagraphs as _cudagraphs
_entry_guards = _convert._guards     # (check, guards); the check's defaults are set on it there


def _guards(*args, **kwargs):
    check, guards = _entry_guards(*args, **kwargs)
    return _timed("guard", check), guards


_convert._guards = _guards
_runtime.AotRuntime.__call__ = _timed("program call", _runtime.AotRuntime.__call__)
_cudagraphs._Recording.replay = _timed("graph replay", _cudagraphs._Recording.replay)
model = build(a.model, a.device, torch.bfloat16 if a.device == "cuda" else torch.float32)
ids = torch.randint(1, 1000, (1, 8), device=a.device)
sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, pad_token_id=0)
report = {}


def host_split(name, generate) -> dict:
    """Wall ms a token, and the host's microseconds a decode step (the median over the steps after
    the prefill's call) inside the model's call, waiting in the stop check, and the rest."""
    from transformers.generation import utils as generation_utils
    spent = collections.defaultdict(list)

    def timed(key, fn):
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key].append(time.perf_counter() - t)
        return call

    check = getattr(generation_utils, "DeferredStopCheck", None)
    original_check = check.__dict__["__call__"] if check is not None else None
    if check is not None:
        check.__call__ = timed("stop_wait", original_check)
    wrapped = name.startswith("kiln")     # generate() reads `self.__call__`: an instance attribute wins
    if wrapped:
        model.__dict__["__call__"] = timed("model_call", type(model).__call__.__get__(model))
    try:
        sync()
        started = time.perf_counter()
        generate(ids, **kw)
        sync()
        wall = time.perf_counter() - started
    finally:
        if check is not None:
            check.__call__ = original_check
        model.__dict__.pop("__call__", None)
    def median_us(key):     # decode steps only: the first call is the prefill's
        steps = sorted(spent[key][1:])
        return 1e6 * steps[len(steps) // 2] if steps else None

    split = {"wall_ms_per_token": 1e3 * wall / a.new, "model_call_us_per_step": median_us("model_call"),
             "stop_wait_us_per_step": median_us("stop_wait"), "prefill_call_ms": 1e3 * spent["model_call"][0]
             if spent["model_call"] else None}
    show = {k: "n/a" if v is None else f"{v:.0f}" for k, v in split.items()}
    print(f"{a.model} {name} unprofiled: {split['wall_ms_per_token']:.3f} ms a token (prefill included); a decode "
          f"step's host time in the model's call {show['model_call_us_per_step']} us (median), waiting for the GPU "
          f"in the stop check {show['stop_wait_us_per_step']} us (median: near 0, the GPU waits for the host); "
          f"the prefill's call {show['prefill_call_ms']} ms")
    return split


with torch.no_grad():
    for name, generate in forms(model, a.forms.split(",")).items():
        generate(ids, **kw)
        generate(ids, **kw)
        for v in pieces.values():
            v.clear()
        split = host_split(name, generate)
        split["pieces_us_median"] = {k: 1e6 * sorted(v)[len(v) // 2] for k, v in pieces.items() if v}
        if split["pieces_us_median"]:
            print(f"{a.model} {name} kiln's host pieces a call (median us): " +
                  ", ".join(f"{k} {v:.0f}" for k, v in split["pieces_us_median"].items()))
        sync()
        started = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if a.device == "cuda" else torch.profiler.ProfilerActivity.CPU]) as prof:
            generate(ids, **kw)
            sync()
        wall = time.perf_counter() - started
        kernels = collections.defaultdict(lambda: [0, 0.0])
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name][0] += 1
                kernels[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        total = sum(t for _, t in kernels.values())
        rows = sorted(kernels.items(), key=lambda kv: -kv[1][1])
        report[name] = {"wall_ms_per_token": 1e3 * wall / a.new, "gpu_us_per_token": total / a.new,
                        "launches_per_token": sum(n for n, _ in kernels.values()) / a.new,
                        "kernels": [(k, n, t) for k, (n, t) in rows], "unprofiled": split}
        print(f"\n## {a.model} {name}: {1e3 * wall / a.new:.2f} ms a token (profiled wall), "
              f"GPU {total / a.new:.0f} us a token, {report[name]['launches_per_token']:.0f} launches a token")
        print("| kernel | launches/token | us/token |\n|---|---|---|")
        for k, (n, t) in rows[:a.top]:
            print(f"| {k[:90]} | {n / a.new:.1f} | {t / a.new:.0f} |")
        profiler = cProfile.Profile()
        profiler.runcall(generate, ids, **kw)
        sync()
        stats = pstats.Stats(profiler).stats   # (file, line, fn) -> (calls, prim calls, own s, cum s, callers)
        funcs = sorted(((f"{os.path.basename(f)}:{line}({fn})", v[1], v[2], v[3]) for (f, line, fn), v in stats.items()),
                       key=lambda r: -r[2])
        report[name]["host"] = [(f, n, own, cum) for f, n, own, cum in funcs[:60]]
        print(f"\nhost (cProfile), {sum(r[2] for r in funcs) * 1e6 / a.new:.0f} us of own time a token:")
        print("| function | calls/token | own us/token | cumulative us/token |\n|---|---|---|---|")
        for f, n, own, cum in funcs[:a.top]:
            print(f"| {f[:90]} | {n / a.new:.1f} | {own * 1e6 / a.new:.0f} | {cum * 1e6 / a.new:.0f} |")
from kiln.runtime.cudagraphs import CudaGraphed
import gc
for g in (o for o in gc.get_objects() if isinstance(o, CudaGraphed)):
    print(f"CUDA-graphed program: {g.recordings} recordings made, {g.replays} replays, disabled: {g.disabled}")
if a.out:
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "decode_profile.json"), "w") as f:
        json.dump(report, f, indent=1)
