"""Repeated kernels compile once, and a graph's distinct kernels build in parallel parts
([Note: parallel builds] in kiln/codegen/compile.py); results stay eager's."""
import torch

import kiln
from kiln.bench.zoo import ZOO, loss_of
from kiln.codegen import compile as c


def test_gpt2_repeated_layers_compile_each_kernel_once_and_train_as_eager(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")       # compile for real
    monkeypatch.setattr(c, "PARALLEL_PARTS", {"kiln.codegen.cpp": 2})
    saved = []
    orig_save = c.save_kernels
    monkeypatch.setattr(c, "save_kernels", lambda *a: (lambda b: (saved.append(b), b)[1])(orig_save(*a)))
    model, inputs = ZOO["gpt2"].make("cpu")
    ref_model, _ = ZOO["gpt2"].make("cpu")
    # eval mode (no dropout), with gradients: forward and backward graphs both compile
    want = ref_model(*inputs)
    loss_of(want).backward()
    kiln.reset()
    got = kiln.compile(model)(*inputs)
    loss_of(got).backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
    assert len(saved) == 2                                                  # forward and backward
    assert all(b["same"] for b in saved), "layer 2's kernels repeat layer 1's"
    assert max(len(b["parts"]) for b in saved) == 2                         # the backward in two parts at once
