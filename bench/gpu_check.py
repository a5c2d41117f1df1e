"""One bf16-autocast step of benchmark models through kiln, on the GPU, with the kernel checker on:
for each (model, mode), the error with its whole traceback, or the max difference from eager and,
under KILN_CHECK=kernels, the first kernel whose output differs from the graph run eagerly.

    KILN_CHECK=kernels python bench/gpu_check.py hf:T5ForConditionalGeneration:infer hf:BertForMaskedLM:train
"""
from __future__ import annotations

import copy
import sys
import time
import traceback

import torch

import kiln
from kiln.bench.case import Case, make_step, results_of
from kiln.bench.suites import disable_dropout, get_model


def check(suite: str, name: str, mode: str, device: str = "cuda") -> None:
    print(f"==== {suite}:{name}:{mode}", flush=True)
    model, args, kwargs = get_model(suite, name).make(device)
    if mode == "train":
        model.train()
        disable_dropout(model)
    case = Case(suite=suite, model=name, mode=mode, precision="bf16", compiler="kiln", device=device)
    ref_model = copy.deepcopy(model)
    ref_params = [p for p in ref_model.parameters() if p.requires_grad]
    want = results_of(make_step(ref_model, args, kwargs, case, ref_params, True)(), case, ref_params)
    del ref_model
    kiln.reset()
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()
    try:
        step = make_step(kiln.compile(model), args, kwargs, case, params, True)
        got = results_of(step(), case, params)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception:
        traceback.print_exc()
        return
    first = time.perf_counter() - start
    worst = max(((g.float() - w.float()).abs().max().item() / (w.float().abs().max().item() + 1e-6), i)
                for i, (g, w) in enumerate(zip(got, want)) if isinstance(g, torch.Tensor) and g.numel())
    print(f"first call {first:.1f} s; worst relative max diff {worst[0]:.3g} (result {worst[1]} of {len(got)})",
          flush=True)


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        check(*spec.split(":"))
