"""The prim graph of a CUDA function with a CPU scalar input and a CPU result (issue #36's probe):
which device each node's value reports."""
import os
os.environ["KILN_LOG"] = "graphs"
import torch
import kiln


def scaled(x, length):
    scale = torch.sqrt(torch.full((), float(x.shape[-1])))
    return x * length / scale, length + 1


got = kiln.compile(scaled)(torch.randn(4, 8, device="cuda"), torch.tensor(3))
print("result devices:", [t.device for t in got])
