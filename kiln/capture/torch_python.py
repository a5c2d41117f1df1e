"""torch functions whose ATen kernels decide on tensor data, written in Python for capture.

[Note: checks after the graph] ATen's `cov` validates its weights on their values (none negative,
a sum that is not zero) and zeroes a non-positive normalization factor, each by reading a Python
bool off a tensor (`at::equal`): a fake tensor has no value to read, so the composite op could not be
captured at all (and `corrcoef`, which calls it, neither). The versions here follow ATen step for
step with those decisions taken without data: a factor at or below zero becomes zero with
`torch.where`, and each validation is a `values_hold(condition, message)`, which capture assumes
true and the compiled program checks after the graph ran (`semantics.require_true`), so bad weights
still raise eager's RuntimeError with eager's message and the user's line. The metadata checks (dimensions, dtypes, counts) raise eager's errors while capturing.
ATen warns when the factor is not positive; these do not. Complex inputs go to ATen as before.
"""
from __future__ import annotations

import torch

from kiln.capture import variables as V
from kiln.capture.callables import handles


def values_hold(condition: torch.Tensor, message: str) -> None:
    """Eager's `TORCH_CHECK` on tensor values: raises RuntimeError(message) unless `condition`; under
    capture, checked after the graph ran (`_values_hold`)."""
    if not condition:
        raise RuntimeError(message)


@handles(values_hold)
def _values_hold(tx, args, kwargs):
    from kiln.capture.semantics import check_after_graph
    from kiln.capture.constants import python_value
    condition, message = args
    check_after_graph(tx, condition, RuntimeError(python_value(message)))
    return V.Constant(None)


def _check_weights(w, name: str, kind: str, observations) -> None:
    """ATen's checks of cov's `fweights` (integral) or `aweights` (floating point), with its messages."""
    if w.dim() > 1:
        raise RuntimeError(f"cov(): expected {name} to have one or fewer dimensions but got {name} "
                           f"with {w.dim()} dimensions")
    integral = not (w.dtype.is_floating_point or w.dtype.is_complex or w.dtype == torch.bool)
    if not (integral if kind == "integral" else w.dtype.is_floating_point):
        raise RuntimeError(f"cov(): expected {name} to have {kind} dtype but got {name} with {w.dtype} dtype")
    if w.numel() != observations:
        raise RuntimeError(f"cov(): expected {name} to have the same numel as there are observations "
                           f"in the input but got {w.numel()} != {observations}")
    if observations > 0:
        values_hold(w.min() >= 0, f"cov(): {name} cannot be negative")


def cov(input, *, correction=1, fweights=None, aweights=None):
    x = input.view(1, -1) if input.dim() < 2 else input
    observations = x.shape[1]
    w = None
    if fweights is not None:
        _check_weights(fweights, "fweights", "integral", observations)
        w = fweights
    if aweights is not None:
        _check_weights(aweights, "aweights", "floating point", observations)
        w = aweights if w is None else w * aweights
    if w is None:
        w_sum = torch.scalar_tensor(observations, dtype=torch.long, device=x.device)
    else:
        w_sum = w.sum()
        values_hold(w_sum != 0, "cov(): weights sum to zero, can't be normalized")
    avg = (x if w is None else x * w).sum(1) / w_sum
    if w is not None and aweights is not None and correction != 0:
        norm_factor = w_sum - correction * (w * aweights).sum() / w_sum
    else:
        norm_factor = w_sum - correction
    norm_factor = torch.where(norm_factor <= 0, torch.zeros_like(norm_factor), norm_factor)
    x = x - avg.unsqueeze(1)
    c = torch.mm(x, (x if w is None else x * w).t().conj())
    return torch.true_divide(c, norm_factor).squeeze()


def corrcoef(input):
    c = torch.cov(input)
    if c.dim() == 0:
        return c / c
    stddev = torch.sqrt(c.diagonal())
    c = c / stddev.view(-1, 1)
    c = c / stddev.view(1, -1)
    return c.clip(-1, 1)


def _inlined(python_fn, torch_fn):
    """A handler that inlines `python_fn` for a real, at most 2-D, non-bool input, and hands
    anything else to the torch op (whose errors are eager's)."""
    def handle(tx, args, kwargs):
        from kiln.capture.attributes import _function
        from kiln.capture.torch_calls import call_torch
        x = args[0] if args else kwargs.get("input")
        example = getattr(x, "example", None)
        if isinstance(x, V.TensorVar) and example.dim() <= 2 and example.dtype != torch.bool \
                and not example.is_complex():
            return tx.inline(_function(python_fn), list(args), dict(kwargs))
        return call_torch(tx, "call_function", torch_fn, list(args), dict(kwargs))
    return handle


handles(torch.cov, torch.Tensor.cov)(_inlined(cov, torch.cov))
handles(torch.corrcoef, torch.Tensor.corrcoef)(_inlined(corrcoef, torch.corrcoef))
