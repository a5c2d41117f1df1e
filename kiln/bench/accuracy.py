"""The accuracy rule of PyTorch's benchmark harness (`same`), applied to kiln's benchmark rows.

A compiled result passes against eager when every tensor is allclose at the suite tolerance;
a floating tensor that is not passes still when its RMSE against a float64 eager run is at most
`multiplier` times eager's own RMSE against that run (plus tol/10), with multiplier 2 for fp32
and 3 for bf16/fp16 results. Integer and bool tensors must match exactly. Hands on a `Verdict`
that says which leaf failed and by how much, so a fail_accuracy row is actionable.

`same(..., relative=True)` is the differential fuzzer's stricter form ([Note: tolerances relative
to the reference]); the benchmark keeps PyTorch's absolute one.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

# Tolerances per (suite, mode, precision), as PyTorch's harness sets them per suite: looser for
# training (gradients sum many terms) and for bf16.
TOLERANCE = {
    ("zoo", "infer", "fp32"): 1e-4, ("zoo", "train", "fp32"): 1e-3,
    ("hf", "infer", "fp32"): 1e-3, ("hf", "train", "fp32"): 1e-2,
    ("timm", "infer", "fp32"): 1e-3, ("timm", "train", "fp32"): 1e-2,
    # PyTorch 2.0's suites (kiln.bench.pt2_suites), at their runners' defaults (TorchBench's for vision)
    ("pt2-hf", "infer", "fp32"): 1e-3, ("pt2-hf", "train", "fp32"): 1e-2,
    ("pt2-timm", "infer", "fp32"): 1e-3, ("pt2-timm", "train", "fp32"): 1e-2,
    ("pt2-vision", "infer", "fp32"): 1e-4, ("pt2-vision", "train", "fp32"): 1e-3,
}
BF16_TOLERANCE = {"infer": 1e-2, "train": 4e-2}


def tolerance(suite: str, mode: str, precision: str) -> float:
    if precision == "bf16":
        return BF16_TOLERANCE[mode]
    return TOLERANCE.get((suite, mode, precision), 1e-3)


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str = ""   # for a failure: which leaf, max abs difference, the RMSEs compared


def flatten(value: Any) -> list[Any]:
    """The leaves of a model output or a list of results: tensors and Python scalars, in order.
    Dicts (transformers' ModelOutput among them) are walked in key order."""
    if isinstance(value, dict):
        return [leaf for key in value for leaf in flatten(value[key])]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(torch.mean(torch.square(a.double() - b.double())).item())


# [Note: tolerances relative to the reference] PyTorch's rule passes a tensor allclose at `tol`
# (an absolute tolerance as well as a relative one) and adds `tol / 10` to the RMSE limit: a
# gradient whose elements are all below 1e-3 passes at the training tolerance whatever its values,
# sign and all. That suits a benchmark (a model's outputs and gradients are of order one) but lets a
# fuzzer's small wrong results through. With `relative=True` both absolute terms scale with the
# reference's magnitude (the largest finite |element| of the float64 run, else of eager's): allclose
# at atol = tol * magnitude, and the RMSE limit `multiplier` x eager's RMSE + tol / 10 * magnitude.
# A result whose reference is zero everywhere must then be exactly zero, or be as far from float64
# as twice eager is; Python floats are held to the same rule as 0-dim float64 tensors.


def same(ref: Any, res: Any, fp64_ref: Any = None, *, tol: float = 1e-4, relative: bool = False) -> Verdict:
    """Does `res` (compiled) match `ref` (eager), with `fp64_ref` (eager in float64) as arbiter?
    `relative`: scale the absolute tolerances by the reference's magnitude ([Note: tolerances
    relative to the reference])."""
    ref_leaves, res_leaves = flatten(ref), flatten(res)
    fp64_leaves = flatten(fp64_ref) if fp64_ref is not None else [None] * len(ref_leaves)
    if len(ref_leaves) != len(res_leaves):
        return Verdict(False, f"eager gave {len(ref_leaves)} results, compiled gave {len(res_leaves)}")
    if len(fp64_leaves) != len(ref_leaves):
        return Verdict(False, f"the float64 run gave {len(fp64_leaves)} results, eager {len(ref_leaves)}")
    for i, (a, b, c) in enumerate(zip(ref_leaves, res_leaves, fp64_leaves)):
        verdict = _same_leaf(a, b, c, tol, relative)
        if not verdict.ok:
            return Verdict(False, f"result {i}: {verdict.detail}")
    return Verdict(True)


def _magnitude(t: torch.Tensor) -> float:
    """The largest finite |element| of `t` (0.0 for an empty or all-nonfinite tensor)."""
    finite = t.detach().double().abs()
    finite = finite[torch.isfinite(finite)]
    return finite.max().item() if finite.numel() else 0.0


def _same_leaf(ref: Any, res: Any, fp64: Any, tol: float, relative: bool = False) -> Verdict:
    if not isinstance(ref, torch.Tensor):
        if isinstance(res, torch.Tensor):
            return Verdict(False, f"eager gave {type(ref).__name__}, compiled a tensor")
        if relative and isinstance(ref, float) and isinstance(res, float):
            as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)
            return _same_leaf(as_tensor(ref), as_tensor(res), as_tensor(fp64) if isinstance(fp64, (int, float)) else None,
                              tol, relative)
        if isinstance(ref, float) and isinstance(res, float):
            return Verdict(math.isclose(ref, res, rel_tol=tol, abs_tol=tol), f"{ref!r} vs {res!r}")
        return Verdict(ref == res, f"{ref!r} vs {res!r}")
    if not isinstance(res, torch.Tensor):
        return Verdict(False, f"eager gave a tensor, compiled {type(res).__name__}")
    if ref.shape != res.shape:
        return Verdict(False, f"shape {tuple(res.shape)}, eager's is {tuple(ref.shape)}")
    if ref.dtype != res.dtype:
        return Verdict(False, f"dtype {res.dtype}, eager's is {ref.dtype}")
    if not (ref.is_floating_point() or ref.is_complex()):
        return Verdict(torch.equal(ref, res), "integer results differ")
    scale = _magnitude(fp64 if fp64 is not None else ref) if relative else 1.0
    if torch.allclose(ref, res, atol=tol * scale, rtol=tol, equal_nan=True):
        return Verdict(True)
    max_diff = (ref.double() - res.double()).abs().max().item()
    if fp64 is None:
        return Verdict(False, f"not allclose at tol {tol:g}" + (f" x magnitude {scale:.3g}" if relative else "")
                       + f" (max abs diff {max_diff:.3g}) and no float64 run")
    multiplier = 3.0 if res.dtype in (torch.float16, torch.bfloat16) else 2.0
    ref_error, res_error = rmse(fp64, ref), rmse(fp64, res)
    floor = tol / 10.0 * scale
    ok = res_error <= multiplier * ref_error + floor
    return Verdict(ok, f"max abs diff {max_diff:.3g}; RMSE vs float64: compiled {res_error:.3g}, "
                       f"eager {ref_error:.3g} (limit {multiplier:g}x + {floor:.3g})")


def same_greedy_decode(model, prompt: torch.Tensor, ref, res, *, tol: float = 1e-2) -> Verdict:
    """Does a compiled greedy `generate()` (`res`) decode eager's tokens (`ref`)? Both are generate()'s
    outputs with `return_dict_in_generate=True, output_logits=True`.

    [Note: greedy decoding's near ties] In bfloat16 a random-weight model's top two logits are often a
    few ulps apart, and any change of summation order (a GEMV's against cuBLAS's) can swap them:
    from that step on the two decodes continue different prefixes and say nothing of each other. So
    the tokens must be eager's up to the first that differs, and that step's logits (same prefix on
    both sides) must pass the benchmark's rule against the model run in float64 on that prefix: the
    compiled logits no further from float64 than eager's allow, where the swap is a tie that rounding
    decided. A compiled step whose logits fail the rule is a wrong result, tie or not."""
    import copy
    n = prompt.shape[-1]
    ref_tokens, res_tokens = ref.sequences[:, n:], res.sequences[:, n:]
    if ref_tokens.shape != res_tokens.shape:
        return Verdict(False, f"eager decoded {ref_tokens.shape[-1]} tokens, compiled {res_tokens.shape[-1]}")
    differ = (ref_tokens != res_tokens).any(dim=0).nonzero()
    if not len(differ):
        return Verdict(True)
    step = int(differ[0])
    prefix = ref.sequences[:, :n + step]
    with torch.no_grad():
        fp64 = copy.deepcopy(model).double()(prefix).logits[:, -1]
    verdict = same(ref.logits[step], res.logits[step], fp64, tol=tol)
    where = f"token {step} of {ref_tokens.shape[-1]} differs ({ref_tokens[:, step].tolist()} eager, " \
            f"{res_tokens[:, step].tolist()} compiled)"
    if not verdict.ok:
        return Verdict(False, f"{where} and that step's logits fail the rule against float64: {verdict.detail}")
    return Verdict(True, f"{where}: a near tie, its logits within the rule against float64")
