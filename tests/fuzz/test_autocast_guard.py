"""A graph traced under autocast holds autocast's casts: the entry is guarded on the autocast
state, so a later call without autocast (or with another dtype) compiles its own (found by
kiln.testing.guard_fuzz: the bf16 entry ran for a float32 call)."""
import torch

import kiln


def f(x):
    return (x @ x.t()).sum(-1) + x.sum()


def test_autocast_toggled_between_calls():
    compiled = kiln.compile(f)
    x = torch.randn(6, 4)
    for enabled, dtype in ((True, torch.bfloat16), (False, torch.bfloat16), (True, torch.float16), (True, torch.bfloat16)):
        with torch.autocast("cpu", dtype=dtype, enabled=enabled):
            ref, res = f(x), compiled(x)
        assert res.dtype == ref.dtype
        torch.testing.assert_close(res, ref, atol=1e-2 if enabled else 1e-5, rtol=1e-2 if enabled else 1e-5)
