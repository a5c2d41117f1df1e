"""Where a bf16-autocast training step's GPU memory goes, eager against kiln: the peak during the
forward, what the forward leaves allocated for the backward (saved values plus the loss), and the
peak during the backward, each in MB above the memory held before the step (parameters, inputs).

    python bench/gpu_memory.py hf:GPT2LMHeadModel timm:resnet50
"""
from __future__ import annotations

import sys

import torch

import kiln
from kiln.bench.suites import disable_dropout, get_model
from kiln.bench.zoo import loss_of

MB = 1 << 20


def phases(fn, args, kwargs, params) -> tuple[float, float, float]:
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_of(fn(*args, **kwargs))
    torch.cuda.synchronize()
    fw_peak, after_fw = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bw_peak = torch.cuda.max_memory_allocated()
    return (fw_peak - base) / MB, (after_fw - base) / MB, (bw_peak - base) / MB


def main(specs: list[str]) -> None:
    print("| model | compiler | forward peak MB | held for backward MB | backward peak MB |")
    print("|---|---|---|---|---|")
    for spec in specs:
        suite, name = spec.split(":")
        model, args, kwargs = get_model(suite, name).make("cuda")
        model.train()
        disable_dropout(model)
        params = [p for p in model.parameters() if p.requires_grad]
        for compiler, fn in (("eager", model), ("kiln", kiln.compile(model))):
            for _ in range(2):   # warm-up (compile, autocast caches, allocator)
                phases(fn, args, kwargs, params)
            fw, held, bw = phases(fn, args, kwargs, params)
            print(f"| {name} | {compiler} | {fw:.0f} | {held:.0f} | {bw:.0f} |", flush=True)
        kiln.reset()
        del model, args, kwargs, params
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
