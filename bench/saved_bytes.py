"""Bytes the forward saves for the backward, per model: the zoo's transformers and CNNs and
torchvision's resnet18, one training step each on the CPU (issue #38's check that the common
subexpression pass saves no more than before). Prints one line a model: graphs, values, bytes.

    python bench/saved_bytes.py [--models gpt2,bert,llama,vit,resnet,resnet18]
"""
import argparse
import contextlib
import io
import re

import torch

import kiln
from kiln.bench.suites import ensure_torchvision_importable
from kiln.bench.zoo import ZOO, loss_of

p = argparse.ArgumentParser()
p.add_argument("--models", default="gpt2,bert,llama,vit,resnet,resnet18")
a = p.parse_args()
for name in a.models.split(","):
    if name == "resnet18":
        ensure_torchvision_importable()
        import torchvision
        torch.manual_seed(0)
        model, inputs = torchvision.models.resnet18(), (torch.randn(2, 3, 64, 64),)
    else:
        model, inputs = ZOO[name].make("cpu", size="test")
    model.train()
    kiln.reset()
    log = io.StringIO()
    import os
    os.environ["KILN_LOG"] = "graphs"
    with contextlib.redirect_stdout(log):
        loss_of(kiln.compile(model)(*inputs)).backward()
    del os.environ["KILN_LOG"]
    saved = [tuple(map(int, m.groups())) for m in re.finditer(r"saved (\d+) values, (\d+) bytes", log.getvalue())]
    print(f"{name}: {len(saved)} graphs, {sum(v for v, _ in saved)} values, {sum(b for _, b in saved)} bytes saved")
