"""Sweep torch's OpInfo database on fake tensors: sizes, dtypes and strides against eager.

For each op of `op_db`, the first float32 CPU sample is run
  * on meta tensors: an op whose sample fails there has no meta support and is not counted;
  * eagerly (the reference);
  * on static fakes: every output's size, dtype and stride (strides of size-1 dims ignored)
    must equal eager's;
  * with dim 0 of the first input symbolic: the same check at the hint, then the expressions are
    checked at another size: dim 0 of the first input is grown, and if the guard function
    accepts the new inputs, the output size/stride expressions at the new size must equal what
    eager gives for them. A quarter of the ops' first samples start with a 0-dim tensor, which has
    no dim to make symbolic; for those the first of the op's samples whose first tensor has a
    dim 0 of size >= 2 is used for this part (and checked against eager at its hint, too).

Run as a script for the whole database (writes tests/symbolic/results/op_sweep.md):
    OMP_NUM_THREADS=1 .venv/bin/python tests/symbolic/sym_op_sweep.py
`test_sym_op_sweep.py` runs a fixed representative subset in CI.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings

import sympy
import torch
from torch.utils._pytree import tree_flatten, tree_map

from kiln.symbolic import FakeTensorMode


@dataclasses.dataclass
class OpResult:
    name: str
    status: str                  # "pass", "fail", "no-meta", "no-sample", "eager-error"
    detail: str = ""
    symbolic: str = ""           # "checked at n=..", "specialized", "no dynamic dim"


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def first_sample(op):
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    return next(iter(samples), None)


def _first_tensor(sample) -> torch.Tensor | None:
    flat = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
    return next((x for x in flat if isinstance(x, torch.Tensor)), None)


def symbolic_sample(op, first):
    """The first sample whose first tensor has a dim 0 of size >= 2 (looking at 20 at most)."""
    t = _first_tensor(first)
    if t is not None and t.dim() and t.shape[0] >= 2:
        return first
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    for _, sample in zip(range(20), samples):
        t = _first_tensor(sample)
        if t is not None and t.dim() and t.shape[0] >= 2:
            return sample
    return None


def call(op, sample, convert):
    inp, args, kwargs = tree_map(
        lambda x: convert(x) if isinstance(x, torch.Tensor) else x,
        (sample.input, sample.args, sample.kwargs))
    return op.op(inp, *args, **kwargs)


def tensors(out) -> list[torch.Tensor]:
    return [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]


def compare(fake_out, real_out, value) -> str | None:
    """A description of the first mismatch, or None. `value(sym)` makes a size concrete."""
    fakes, reals = tensors(fake_out), tensors(real_out)
    if len(fakes) != len(reals):
        return f"{len(fakes)} tensor outputs, eager has {len(reals)}"
    for i, (f, r) in enumerate(zip(fakes, reals)):
        sizes = [value(s) for s in f.shape]
        if sizes != list(r.shape):
            return f"output {i}: sizes {sizes} != eager {list(r.shape)}"
        if f.dtype != r.dtype:
            return f"output {i}: dtype {f.dtype} != eager {r.dtype}"
        strides = [value(s) for s in f.stride()]
        for d, n in enumerate(r.shape):
            if n > 1 and strides[d] != r.stride(d):
                return f"output {i}: strides {strides} != eager {list(r.stride())}"
        if f.device != r.device:
            return f"output {i}: device {f.device} != eager {r.device}"
    return None


def _grow(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` with dim 0 of size n, made by repeating its rows (keeps values valid, e.g. indices)."""
    reps = -(-n // t.shape[0])
    return torch.cat([t] * reps, 0)[:n].clone()


def sweep_op(op) -> OpResult:
    name = op_name(op)
    try:
        sample = first_sample(op)
    except Exception as e:  # noqa: BLE001 - the database's own failure, reported as such
        return OpResult(name, "no-sample", f"{type(e).__name__}: {e}"[:200])
    if sample is None:
        return OpResult(name, "no-sample", "no float32 sample")
    try:
        call(op, sample, lambda t: t.to("meta"))
    except Exception as e:  # noqa: BLE001
        return OpResult(name, "no-meta", f"{type(e).__name__}: {str(e).splitlines()[0][:150]}")
    try:
        real_out = call(op, sample, lambda t: t)
    except Exception as e:  # noqa: BLE001
        return OpResult(name, "eager-error", f"{type(e).__name__}: {e}"[:200])

    try:
        mode = FakeTensorMode()
        with mode:
            fake_out = call(op, sample, mode.from_real)
        problem = compare(fake_out, real_out, int)
    except Exception as e:  # noqa: BLE001
        problem = f"static: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
    if problem:
        return OpResult(name, "fail", "static: " + problem if not problem.startswith("static") else problem)
    try:
        sym_sample = symbolic_sample(op, sample)
        if sym_sample is None:
            return OpResult(name, "pass", symbolic="no sample has a dim 0 >= 2 in its first tensor")
        if sym_sample is not sample:
            try:
                real_out = call(op, sym_sample, lambda t: t)
                call(op, sym_sample, lambda t: t.to("meta"))
            except Exception as e:  # noqa: BLE001
                return OpResult(name, "pass", symbolic=f"sample with a dim 0 fails on eager "
                                                       f"or meta: {type(e).__name__}")
        return _symbolic(op, name, sym_sample, real_out)
    except Exception as e:  # noqa: BLE001
        return OpResult(name, "fail", f"symbolic: {type(e).__name__}: "
                        f"{str(e).splitlines()[0][:150] if str(e) else ''}")


def _symbolic(op, name, sample, real_out) -> OpResult:
    inputs = [x for x in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
              if isinstance(x, torch.Tensor)]
    first = inputs[0] if inputs else None
    mode = FakeTensorMode()
    sources: dict[int, str] = {}

    def convert(t):
        if id(t) not in sources:
            sources[id(t)] = f"a{len(sources)}"
        dynamic = [0] if t is first else []
        return mode.from_real(t, sources[id(t)], dynamic_dims=dynamic)

    with mode:
        fake_out = call(op, sample, convert)
    env = mode.shape_env
    problem = compare(fake_out, real_out, lambda s: env.hint_of(env.symbol_of(s)))
    if problem:
        return OpResult(name, "fail", f"symbolic at hint: {problem}")
    symbol = env.symbol_of(convert(first).shape[0])
    guard = env.guard_function(*sources.values())
    by_id = {id(t): t for t in inputs}
    n = first.shape[0]
    for new_n in (n + 1, n + 3, 2 * n, n + 7):
        grown = _grow(first, new_n)
        if not first.is_contiguous():
            continue
        new_inputs = [grown if by_id[i] is first else by_id[i] for i in sources]
        if not guard(*new_inputs):
            continue
        swap = lambda t: grown if t is first else t  # noqa: E731
        try:
            new_real = call(op, sample, swap)
        except Exception as e:  # noqa: BLE001
            return OpResult(name, "fail", f"guard accepted n={new_n} but eager raised "
                                          f"{type(e).__name__}: {str(e)[:100]}")

        def at_new(s):
            return int(sympy.sympify(env.symbol_of(s)).xreplace(
                {**env.hints, symbol: new_n}) if not isinstance(s, int) else s)

        problem = compare(fake_out, new_real, at_new)
        if problem:
            return OpResult(name, "fail", f"symbolic at {symbol}={new_n}: {problem}")
        return OpResult(name, "pass", symbolic=f"expressions checked at {symbol}={new_n}")
    return OpResult(name, "pass", symbolic="specialized (guards reject other sizes)")


def main(out_path: str) -> None:
    from torch.testing._internal.common_methods_invocations import op_db

    warnings.filterwarnings("ignore")
    results, start = [], time.time()
    for op in op_db:
        results.append(sweep_op(op))
        r = results[-1]
        print(f"{r.status:12s} {r.name:40s} {r.detail[:80]} {r.symbolic}", flush=True)
    counted = [r for r in results if r.status in ("pass", "fail")]
    passed = [r for r in counted if r.status == "pass"]
    checked = [r for r in passed if r.symbolic.startswith("expressions checked")]
    lines = [
        "# Op sweep on kiln fake tensors (first float32 CPU sample of each op_db entry)",
        "",
        f"Generated by `tests/symbolic/sym_op_sweep.py` with torch {torch.__version__} "
        f"in {time.time() - start:.0f} s.",
        "",
        f"- ops in op_db: {len(results)}",
        f"- sample runs on meta tensors (counted): {len(counted)}",
        f"- same sizes, dtypes, strides as eager, static and with dim 0 symbolic: "
        f"{len(passed)} / {len(counted)} = {100 * len(passed) / max(1, len(counted)):.1f}%",
        f"- of those, output expressions checked at a second size accepted by the guards: "
        f"{len(checked)}",
        f"- not counted: no meta support {sum(r.status == 'no-meta' for r in results)}, "
        f"no sample {sum(r.status == 'no-sample' for r in results)}, "
        f"eager error {sum(r.status == 'eager-error' for r in results)}",
        "",
        "| op | status | detail | symbolic |",
        "|---|---|---|---|",
    ]
    for r in results:
        detail = r.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.name} | {r.status} | {detail} | {r.symbolic} |")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "results", "op_sweep.md"))
