"""One training step of the zoo's GPT-2 (test size) through kiln, for the report tests (a script)."""
import torch

import kiln
from kiln.bench.zoo import ZOO, loss_of

if __name__ == "__main__":
    model, inputs = ZOO["gpt2"].make("cpu")
    model.train()
    fast = kiln.compile(model)
    loss_of(fast(*inputs)).backward()
    assert all(p.grad is not None for p in model.parameters())
