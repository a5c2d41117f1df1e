"""`torch._check` and `torch._check_is_size` on values known only at run time.

[Note: run-time checks] A condition over an unbacked value (`n = mask.sum().item();
torch._check(n >= 2)`) has no answer while capturing, and eager raises where it fails. Capture
does what torch.compile does: the ShapeEnv assumes the condition (`ShapeEnv.expect_true`: learnt as a
fact, listed in `runtime_asserts`, so later questions are decided by it: `if n == 0:` after
`torch._check(n > 0)` takes no branch), and the graph gets an `aten._assert_scalar(cond, message)`
node that raises eager's RuntimeError, with the user's message and line, when the program runs on a
value for which the condition fails. A check that the facts decide needs no node; one over backed
sizes only is a guard, as any other branch on them.
"""
from __future__ import annotations

import operator

import torch

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.constants import is_python_constant, python_value
from kiln.capture.interpreter import GraphBreak
from kiln.capture.semantics import binary_op

_DEFAULT_MESSAGE = ("Expected cond to be True, but got False. (Could this error message be improved? "
                    "If so, please report an enhancement request to PyTorch.)")


def _message(tx, message: V.Variable | None) -> str:
    """The text eager would raise with: the message callable run while capturing, when it reads
    no run-time value; torch's default text otherwise."""
    if message is None or is_python_constant(message) and python_value(message) is None:
        return _DEFAULT_MESSAGE
    try:
        text = tx.call(message, [])
    except GraphBreak:
        return _DEFAULT_MESSAGE + " (the check's own message reads values known only at run time)"
    return str(python_value(text)) if is_python_constant(text) else _DEFAULT_MESSAGE


def check(tx, error_type: type, cond: V.Variable, message: V.Variable | None) -> V.Variable:
    """`torch._check_with(error_type, cond, message)`, the one function torch's checks call."""
    if is_python_constant(cond):
        if not isinstance(python_value(cond), bool):
            tx.raise_(TypeError, f"cond must be a bool, but got {type(python_value(cond))}")
        if not python_value(cond):
            tx.raise_(error_type, _message(tx, message))
        return V.Constant(None)
    if not (isinstance(cond, V.SymNumber) and isinstance(cond.example, torch.SymBool)):
        tx.raise_(TypeError, f"cond must be a bool, but got {cond.python_type()}")
    node = cond.example.node
    env = node.shape_env
    decided = env.static_value(env.simplify(node.expr))
    if decided is None and not env.has_unbacked(node.expr):
        decided = bool(env.evaluate(node))          # over backed sizes: a guard
    if decided is not None:
        if not decided:
            tx.raise_(error_type, _message(tx, message))
        return V.Constant(None)
    text = f"{_message(tx, message)} (a check assumed while compiling; {tx.user_where()})"
    env.expect_true(node)
    tx.out.call("call_function", torch.ops.aten._assert_scalar.default, (cond.node, text), {})
    return V.Constant(None)


@handles(torch._check_with)
def _check_with(tx, args, kwargs):
    names = ("error_type", "cond", "message")
    bound = dict(zip(names, args)) | kwargs
    return check(tx, python_value(bound["error_type"]), bound["cond"], bound.get("message"))


@handles(torch._check)
def _check(tx, args, kwargs):
    bound = dict(zip(("cond", "message"), args)) | kwargs
    return check(tx, RuntimeError, bound["cond"], bound.get("message"))


@handles(torch._check_is_size)
def _check_is_size(tx, args, kwargs):
    """`torch._check_is_size(n, max=None)`: n >= 0 (and <= max), assumed and checked at run time. The
    lower bound 0 makes n a size for size-oblivious questions ([Note: unbacked sizes])."""
    bound = dict(zip(("i", "message", "max"), args)) | kwargs
    i, message, bound_max = bound["i"], bound.get("message"), bound.get("max")
    check(tx, RuntimeError, binary_op(tx, operator.ge, i, V.Constant(0)), message)
    if bound_max is not None and not (is_python_constant(bound_max) and python_value(bound_max) is None):
        check(tx, RuntimeError, binary_op(tx, operator.le, i, bound_max), message)
    return V.Constant(None)
