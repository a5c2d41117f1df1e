"""Where a DDP-compiled training step spends its time next to the same model compiled without DDP
(issue #22, world size 1): one process, NCCL (gloo on CPU), the GPT-2 of `examples/ddp_train.py`.
Variants, timed in interleaved rounds: eager, eager DDP, compiled, compiled DDP split at its
buckets, compiled DDP in one graph, and both with `gradient_as_bucket_view=True`. Then a few steps of each under torch.profiler: GPU kernel
time and count, host-side synchronizations, and the kernels whose total time differs most from
the compiled, non-DDP step.

    python bench/ddp_profile.py [--device cuda] [--steps 20] [--layers 12] [--out DIR]
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import statistics
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import ddp_train  # noqa: E402

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ")


def profile(trainer, ids, steps: int) -> dict:
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                     if torch.cuda.is_available() else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            trainer.step(ids)
    kernels: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    syncs = 0
    for e in prof.events():
        device_us = e.device_time
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name[:90]] += device_us / steps
            counts[e.name[:90]] += 1 / steps
        elif any(e.name.startswith(s) for s in SYNCS):
            syncs += 1
    return {"kernels": kernels, "counts": counts, "syncs": syncs / steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cuda = a.device == "cuda"
    args = argparse.Namespace(layers=a.layers or (12 if cuda else 2), dim=768 if cuda else 64,
                              heads=12 if cuda else 4, vocab=50257 if cuda else 512, seq=512 if cuda else 32,
                              batch=8 if cuda else 4, bf16=cuda)
    os.environ.update(WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29513")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    ddp_kwargs = {"device_ids": [0]} if cuda else {}
    variants = {}
    m = ddp_train.build(args, device)
    variants["eager"] = ddp_train.Trainer(m, m, args, device)
    m = ddp_train.build(args, device)
    variants["eager DDP"] = ddp_train.Trainer(m, DDP(m, **ddp_kwargs), args, device)
    m = ddp_train.build(args, device)
    variants["compiled"] = ddp_train.Trainer(m, kiln.compile(m), args, device)
    m = ddp_train.build(args, device)
    variants["compiled DDP split"] = ddp_train.Trainer(m, kiln.compile(DDP(m, **ddp_kwargs)), args, device)
    m = ddp_train.build(args, device)
    variants["compiled DDP one graph"] = ddp_train.Trainer(
        m, kiln.compile(DDP(m, **ddp_kwargs), options={"ddp_split": False}), args, device)
    # gradient_as_bucket_view: gradients live in DDP's buckets, no copy into them after the backward
    for split in (True, False):
        m = ddp_train.build(args, device)
        variants[f"compiled DDP {'split' if split else 'one graph'}, bucket view"] = ddp_train.Trainer(
            m, kiln.compile(DDP(m, gradient_as_bucket_view=True, **ddp_kwargs), options={"ddp_split": split}),
            args, device)
    ids = ddp_train.batch(args, 0, 0, device)
    times = {name: [] for name in variants}
    for step in range(3 + a.steps):
        for name, t in variants.items():
            seconds, _ = t.step(ids)
            if step >= 3:
                times[name].append(seconds)
    profiles = {name: profile(t, ids, 3) for name, t in variants.items()}
    base = profiles["compiled"]
    lines = [f"GPT-2 ({args.layers} layers) training step, world size 1, {a.device}, bf16 autocast {args.bf16}",
             "", "| variant | step ms | GPU kernel ms | kernels | host syncs |", "|---|---|---|---|---|"]
    for name in variants:
        pr = profiles[name]
        lines.append(f"| {name} | {statistics.median(times[name]) * 1e3:.2f} | "
                     f"{sum(pr['kernels'].values()) / 1e3:.2f} | {sum(pr['counts'].values()):.0f} | {pr['syncs']:.0f} |")
    for name in [n for n in variants if n.startswith("compiled DDP")]:
        pr = profiles[name]
        diff = {k: pr["kernels"][k] - base["kernels"].get(k, 0) for k in set(pr["kernels"]) | set(base["kernels"])}
        lines += ["", f"kernels whose time differs most, {name} minus compiled (us per step, count per step):"]
        for k, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:12]:
            lines.append(f"  {d:+9.0f} us  {pr['counts'].get(k, 0):4.0f} vs {base['counts'].get(k, 0):4.0f}  {k}")
    text = "\n".join(lines)
    if a.out:
        pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(a.out) / "ddp_profile.md").write_text(text + "\n")
    print(text)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
