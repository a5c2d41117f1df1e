"""`MyFunction.apply(*args)` of a `torch.autograd.Function` inside captured code.

Without autograd (grad mode off, or no tensor argument requires grad) `apply` computes what
`forward` computes and records nothing for backward, so its forward is inlined into the graph,
with a `ctx` whose saving methods do nothing (`InferenceContext`). With autograd, the Function's
own backward must run (it need not be the derivative of its forward: SqrtBoundDerivative clamps
it), and kiln's graphs differentiate their ops, so that call is a graph break and runs eagerly.
"""
from __future__ import annotations

import torch

from kiln.capture import variables as V


class InferenceContext:
    """The `ctx` of a forward run without autograd: what it saves is never read."""

    needs_input_grad = ()
    materialize_grads = True

    def save_for_backward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def apply(tx, args, kwargs):
    from kiln.capture.attributes import getattr_var
    from kiln.capture.constants import python_value
    cls_var, inputs = args[0], args[1:]
    cls = python_value(cls_var)
    tensors = [a for a in [*inputs, *kwargs.values()] if isinstance(a, V.TensorVar)]
    if torch.is_grad_enabled() and any(t.example.requires_grad for t in tensors):
        raise tx.unsupported(f"{cls.__name__}.apply with autograd: its own backward runs eagerly")
    forward = getattr_var(tx, cls_var, "forward")
    if torch.autograd.function._is_setup_context_defined(cls.setup_context):
        return tx.call(forward, list(inputs), kwargs)  # setup_context only saves for backward
    return tx.call(forward, [V.NewObjectVar(InferenceContext, {}), *inputs], kwargs)
