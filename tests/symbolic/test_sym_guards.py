"""Guards: a trace made once with symbolic sizes is reused exactly when re-tracing would agree.

A "graph" here is what a tracer would record: the inputs' sizes and strides (placeholders), then
the ATen ops run on fakes, in order, with each output's sizes and strides as expressions over
the inputs' sources. Two traces are the same graph when those lists print the same.
"""
import os
import random

import pytest
import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kiln.symbolic import FakeTensorMode


class OpRecorder(TorchDispatchMode):
    """Records (op, output sizes, output strides) for each op; symbols printed by source."""

    def __init__(self, env):
        super().__init__()
        self.env = env
        self.ops = []

    def _text(self, value):
        expr = self.env.symbol_of(value)
        names = {s: sympy.Symbol(str(src)) for s, src in self.env.sources.items()}
        return str(sympy.sympify(expr).xreplace(names))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [(tuple(self._text(s) for s in t.shape), tuple(self._text(s) for s in t.stride()))
                  for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), shapes))
        return out


def trace(fn, inputs, dynamic):
    """Run fn on fakes of `inputs` (dims in dynamic[i] symbolic). Returns (graph, env, output)."""
    mode = FakeTensorMode()
    fakes = [mode.from_real(t, f"x{i}", dynamic_dims=d) for i, (t, d) in
             enumerate(zip(inputs, dynamic))]
    recorder = OpRecorder(mode.shape_env)
    recorder.ops.append(("inputs", [(tuple(recorder._text(s) for s in f.shape),
                                     tuple(recorder._text(s) for s in f.stride())) for f in fakes]))
    try:
        with mode, recorder:
            out = fn(*fakes)
    except (RuntimeError, IndexError, ValueError) as e:
        return ("error", type(e).__name__), mode.shape_env, None
    return recorder.ops, mode.shape_env, out


def transformer_block(x, pos, w):
    """A small attention-like function branching on the sequence length."""
    b, s, h = x.shape
    x = x + pos[:s]                        # pos is a table at least as long as s
    if s > 4:                              # a user branch on the sequence length
        x = x[:, 1:]                       # drop a "cls" token when the sequence is long
    q = x @ w
    att = (q @ x.transpose(1, 2)) / h ** 0.5
    att = att.softmax(-1)
    out = (att @ x).reshape(-1, h)
    return out.view(b, -1, h).mean(1)


def test_symbolic_batch_and_seq_trace_is_reused():
    hidden = 16
    x, pos, w = torch.randn(4, 8, hidden), torch.randn(32, hidden), torch.randn(hidden, hidden)
    graph, env, out = trace(transformer_block, [x, pos, w], [[0, 1], [], []])
    guard = env.guard_function("x0", "x1", "x2")
    sources = {str(s) for g in env.guards for s in g.sources}
    assert sources == {"x0.size()[1]"}, env.format_guards()
    # The user's branch is recorded with the user's line.
    # Each guard names the user's line that raised it: the slice of the position table and the
    # branch on the sequence length.
    lines = {g.user_location.rsplit(":", 1)[1] for g in env.guards
             if os.path.basename(__file__) in (g.user_location or "")}
    assert lines == {str(_line_of("x = x + pos[:s]")), str(_line_of("if s > 4:"))}, \
        env.format_guards()

    accepted = [(2, 5), (3, 6), (7, 9), (16, 31), (5, 12), (9, 17), (2, 32), (11, 7), (3, 20),
                (8, 25)]
    for b, s in accepted:
        real_x = torch.randn(b, s, hidden)
        assert guard(real_x, pos, w), (b, s, guard.source)
        expected = transformer_block(real_x, pos, w)
        values = {sym: {"x0.size()[0]": b, "x0.size()[1]": s}[str(src)]
                  for sym, src in env.sources.items()}
        got = [int(sympy.sympify(env.symbol_of(d)).xreplace(values)) for d in out.shape]
        assert got == list(expected.shape)
    # s = 4 takes the other branch: the recorded assumption s > 4 is broken.
    assert not guard(torch.randn(4, 4, hidden), pos, w)
    # A sequence longer than the position table breaks the slice's assumption.
    assert not guard(torch.randn(4, 40, hidden), pos, w)
    assert not guard(torch.randn(4, 8, hidden + 1), pos, w)   # static hidden size


def _line_of(text):
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


def test_guard_function_names_missing_inputs():
    from kiln.symbolic import GuardSourceError

    _, env, _ = trace(transformer_block, [torch.randn(4, 8, 16), torch.randn(32, 16),
                                          torch.randn(16, 16)], [[0, 1], [], []])
    with pytest.raises(GuardSourceError, match="x0"):
        env.guard_function("x1")


def random_program(rng):
    """A random function of (a, b) whose control flow and ops depend on sizes."""
    t1, t2, t3 = rng.randint(2, 9), rng.randint(2, 9), rng.randint(10, 60)
    mod = rng.choice([2, 3])

    def program(a, b):
        n, m = a.shape
        if n > t1:
            a = a[: n // 2]
        z = a * b                               # b is (m,) or (1,) or mismatched
        if z.shape[0] % mod == 0:
            z = z.reshape(mod, -1)
        else:
            z = z.sum(0, keepdim=True)
        z = torch.cat([z, z[:, :1]], 1)
        if z.numel() >= t3:
            z = z.t()
        if m < t2:
            z = torch.nn.functional.pad(z, (0, 1))
        return z.contiguous() * 2

    return program


def _random_inputs(rng):
    n, m = rng.randint(1, 14), rng.randint(1, 12)
    k = rng.choice([m, m, 1, m + 1])
    return [torch.randn(n, m), torch.randn(k)]


@pytest.mark.parametrize("seed", range(6))
def test_guard_accepts_iff_retrace_gives_same_graph(seed):
    rng = random.Random(seed)
    program = random_program(rng)
    dynamic = [[0, 1], [0]]
    base = _random_inputs(rng)
    while trace(program, base, dynamic)[0][0] == "error":
        base = _random_inputs(rng)
    graph, env, _ = trace(program, base, dynamic)
    guard = env.guard_function("x0", "x1")
    assert guard(*base)
    agreements = {True: 0, False: 0}
    n, m = base[0].shape
    nearby = [[torch.randn(n + dn, m + dm), torch.randn(base[1].shape[0] + dm
                                                         if base[1].shape[0] == m else 1)]
              for dn, dm in ((1, 0), (0, 1), (2, 2), (-1, 0), (3, -1))
              if n + dn >= 1 and m + dm >= 1]
    for inputs in nearby + [_random_inputs(rng) for _ in range(25)]:
        same = trace(program, inputs, dynamic)[0] == graph
        accepted = guard(*inputs)
        assert accepted == same, (seed, [tuple(t.shape) for t in base],
                                  [tuple(t.shape) for t in inputs], guard.source)
        agreements[accepted] += 1
    assert agreements[False] > 0, "no shape was rejected: the check would not catch a loose guard"
