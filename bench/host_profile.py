"""Where a compiled step spends its host (Python) time: cProfile over a few steady steps of kiln's
compiled step for suite models, printed by own time and by cumulative time. A step whose GPU
kernels take less than its wall time (`bench/gpu_profile.py`'s host-bound share) waits for this.

    python bench/host_profile.py timm:resnet50:train [hf:GPT2LMHeadModel:infer ...] [--steps 5]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

import kiln
from kiln.bench.case import Case, make_step
from kiln.bench.suites import disable_dropout, get_model


def profile_one(suite: str, name: str, mode: str, steps: int, top: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, args, kwargs = get_model(suite, name).make(device)
    if mode == "train":
        model.train()
        disable_dropout(model)
    case = Case(suite=suite, model=name, mode=mode, precision="bf16", compiler="kiln", device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    kiln.reset()
    step = make_step(kiln.compile(model), args, kwargs, case, params, device == "cuda")
    for _ in range(3):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)
        print(f"== {suite}:{name}:{mode}, {steps} steps, by {order}\n{out.getvalue()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help="suite:model:mode")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    for spec in a.cases:
        profile_one(*spec.split(":"), steps=a.steps, top=a.top)


if __name__ == "__main__":
    main()
