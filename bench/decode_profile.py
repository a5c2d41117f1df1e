"""Where a decoding step's GPU time goes, kiln against Inductor: for each form, one profiled
`generate()` after a warm-up, its kernels grouped by name, per generated token. A probe for #36:

    python bench/decode_profile.py dolly [--forms inductor-static,kiln-static] [--new 20] [--out DIR]

Prints one table a form (the top kernels by time, launches and microseconds a token) and the host's
seconds a token; DIR/decode_profile.json holds every kernel."""
import argparse
import collections
import json
import os
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
a = p.parse_args()
warnings.simplefilter("ignore")
model = build(a.model, "cuda", torch.bfloat16)
ids = torch.randint(1, 1000, (1, 8), device="cuda")
kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, pad_token_id=0)
report = {}
with torch.no_grad():
    for name, generate in forms(model, a.forms.split(",")).items():
        generate(ids, **kw)
        generate(ids, **kw)
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            generate(ids, **kw)
            torch.cuda.synchronize()
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
                        "kernels": [(k, n, t) for k, (n, t) in rows]}
        print(f"\n## {a.model} {name}: {1e3 * wall / a.new:.2f} ms a token (profiled wall), "
              f"GPU {total / a.new:.0f} us a token, {report[name]['launches_per_token']:.0f} launches a token")
        print("| kernel | launches/token | us/token |\n|---|---|---|")
        for k, (n, t) in rows[:a.top]:
            print(f"| {k[:90]} | {n / a.new:.1f} | {t / a.new:.0f} |")
from kiln.runtime.cudagraphs import CudaGraphed
import gc
for g in (o for o in gc.get_objects() if isinstance(o, CudaGraphed)):
    print(f"CUDA-graphed program: {len(g.recorded)} recordings, {g.replays} replays, disabled: {g.disabled}")
if a.out:
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "decode_profile.json"), "w") as f:
        json.dump(report, f, indent=1)
