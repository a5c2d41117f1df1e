"""Guard fuzzing: call a compiled function again and again, changing one property of its inputs or
of the state it reads at a time, and check every call against eager and against a fresh compile.

    python -m kiln.testing.guard_fuzz --sequences N --seed S [--kiln-every K]

A sequence compiles `SUBJECT` (a function reading tensors, a list of tensors, a Python float and
int, two globals, grad mode and autocast) or `Subject` (the same as an nn.Module, reading its own
attributes and training flag too) once, then mutates one property per call: dtype, shape, strides,
storage offset, requires_grad, the float, the int, a global, a module attribute, the list's length,
grad mode, autocast. Each call is checked twice:

- wrong: its result (and x's gradient, when one is taken) differs from eager's;
- stale: it reused a cached entry (compiled no graph) whose graph differs from the one a fresh
  compile on the same inputs traces (the entry's guards accepted inputs it was not built for).

Graphs are recorded by a backend wrapper that notes, per call, the FX code of each graph that ran.
Most sequences run those graphs with the `eager` backend (guards are capture's, and a compile costs
no g++); every `--kiln-every`-th runs kiln's own backend, whose shape specializations add guards.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import re
import sys
import tempfile
import time
import warnings

import torch

SCALE = 2.0     # globals SUBJECT reads; mutated between calls
FLAG = True


def SUBJECT(x, xs, alpha, k):
    y = x * alpha + SCALE
    if FLAG:
        y = y.sin()
    for t in xs:
        y = y + t.sum()
    if k > 1:
        y = y * k
    if x.dim() >= 2:
        y = y + (x @ x.transpose(-1, -2)).sum(-1, keepdim=True)
    if x.dtype == torch.float64:
        y = y - 1
    if x.shape[0] > 3:
        y = y.cos()
    if torch.is_grad_enabled():
        y = y * 3
    return y.sum(0), y


class Subject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5
        self.use_relu = True
        self.w = torch.nn.Parameter(torch.tensor([0.25]))

    def forward(self, x, xs, alpha, k):
        y = SUBJECT(x, xs, alpha, k)[1] * self.scale + self.w
        if self.use_relu:
            y = y.relu()
        if self.training:
            y = y * 2
        return y


@dataclasses.dataclass
class State:
    dtype: torch.dtype = torch.float32
    shape: tuple = (3, 4)
    layout: str = "contiguous"       # contiguous | transposed | offset | strided
    requires_grad: bool = False
    alpha: float = 1.5
    k: int = 1
    scale_global: float = 2.0
    flag_global: bool = True
    scale_attr: float = 0.5
    use_relu: bool = True
    training: bool = True
    xs_len: int = 2
    grad_mode: bool = True
    autocast: bool = False
    param: tuple = ((1,), torch.float32)   # module.w's data: its sizes and dtype (`w.data = ...`)


def _mutations(rng: random.Random, s: State) -> dict:
    """Each mutation changes one property of `s` (returns the new state)."""
    def shape():
        dims = list(s.shape)
        if rng.random() < 0.2 and len(dims) > 1:
            dims.pop()
        elif rng.random() < 0.2 and len(dims) < 3:
            dims.append(rng.choice([2, 3]))
        else:
            dims[rng.randrange(len(dims))] = rng.choice([1, 2, 3, 4, 5, 6])
        return dataclasses.replace(s, shape=tuple(dims))
    return {
        "dtype": lambda: dataclasses.replace(s, dtype=torch.float64 if s.dtype == torch.float32 else torch.float32),
        "shape": shape,
        "stride": lambda: dataclasses.replace(s, layout=rng.choice(["contiguous", "transposed", "strided"])),
        "storage offset": lambda: dataclasses.replace(s, layout="offset" if s.layout != "offset" else "contiguous"),
        "requires_grad": lambda: dataclasses.replace(s, requires_grad=not s.requires_grad),
        "python float": lambda: dataclasses.replace(s, alpha=rng.choice([0.5, 1.5, 2.0, -1.0])),
        "python int": lambda: dataclasses.replace(s, k=rng.choice([0, 1, 2, 3])),
        "global float": lambda: dataclasses.replace(s, scale_global=rng.choice([1.0, 2.0, 3.5])),
        "global bool": lambda: dataclasses.replace(s, flag_global=not s.flag_global),
        "module attribute": lambda: dataclasses.replace(s, scale_attr=rng.choice([0.5, 1.0, 2.0])),
        "module bool attribute": lambda: dataclasses.replace(s, use_relu=not s.use_relu),
        "module training": lambda: dataclasses.replace(s, training=not s.training),
        "list length": lambda: dataclasses.replace(s, xs_len=rng.choice([0, 1, 2, 3])),
        "grad mode": lambda: dataclasses.replace(s, grad_mode=not s.grad_mode),
        "autocast": lambda: dataclasses.replace(s, autocast=not s.autocast),
        "parameter data": lambda: dataclasses.replace(s, param=(rng.choice([(1,), (1, 1), ()]),
                                                                rng.choice([torch.float32, torch.float64]))),
    }


def _inputs(s: State, seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = list(s.shape)
    if s.layout == "transposed" and len(shape) >= 2:
        x = torch.randn(shape[::-1], generator=g, dtype=s.dtype).t() if len(shape) == 2 else \
            torch.randn(shape[:-2] + shape[-2:][::-1], generator=g, dtype=s.dtype).transpose(-1, -2)
    elif s.layout == "strided":
        x = torch.randn([shape[0] * 2] + shape[1:], generator=g, dtype=s.dtype)[::2]
    elif s.layout == "offset":
        n = 1
        for d in shape:
            n *= d
        x = torch.randn(n + 2, generator=g, dtype=s.dtype)[2:].view(shape)
    else:
        x = torch.randn(shape, generator=g, dtype=s.dtype)
    x = x.detach().requires_grad_(s.requires_grad)
    xs = [torch.randn(shape[-1:], generator=g, dtype=s.dtype) for _ in range(s.xs_len)]
    return x, xs


@contextlib.contextmanager
def _applied(s: State, module: Subject | None):
    global SCALE, FLAG
    SCALE, FLAG = s.scale_global, s.flag_global
    if module is not None:
        module.scale, module.use_relu = s.scale_attr, s.use_relu
        module.train(s.training)
        sizes, dtype = s.param
        if module.w.shape != sizes or module.w.dtype != dtype:
            module.w.data = torch.full(sizes, 0.25, dtype=dtype)
    with torch.set_grad_enabled(s.grad_mode), torch.autocast("cpu", dtype=torch.bfloat16, enabled=s.autocast):
        yield


class Recorder:
    """A backend wrapper noting the FX code of every graph that runs, and every compile."""

    def __init__(self, base):
        self.base = base
        self.ran: list[str] = []
        self.compiled = 0

    def __call__(self, gm, example_inputs):
        self.compiled += 1
        inner = self.base(gm, example_inputs)
        from kiln.pipeline import symbolic_examples
        # ints that capture made graph inputs after they changed ([Note: ints that change]): the
        # graph stands for any value of them, as a symbolic graph for any sizes
        ints = tuple(n.name for n, x in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)
                     if isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool))
        symbolic = symbolic_examples(gm) is not None or bool(ints)
        code = (gm.code, symbolic, ints)

        def run(*args):
            self.ran.append(code)
            return inner(*args)
        return run


def _base_backend(use_kiln: bool):
    if use_kiln:
        from kiln.backends import kiln_backend
        return kiln_backend
    return lambda gm, example_inputs: gm.forward


def _normal(code: str, symbolic: bool, ints: tuple = ()) -> str:
    """A graph's code as compared: without FX's `; x = None` liveness notes. A symbolic graph
    stands for any sizes: its size computations (`x.size()`, `getitem > 3`: guards' inputs) go,
    and the sizes it passes to ops compare as N, as do a static graph's numbers; so do its int
    inputs (`ints`), which leave its signature."""
    lines = [line.split(";")[0].rstrip() for line in code.splitlines()]
    if not symbolic:
        return "\n".join(lines)
    derived: set[str] = set(ints)
    out = []
    for line in lines:
        if line.lstrip().startswith("def forward(") and ints:
            line = re.sub(r", (" + "|".join(map(re.escape, ints)) + r")\b", "", line)
        m = re.match(r"\s*(\w+) = (.*)", line)
        if m:
            lhs, rhs = m.groups()
            names = set(re.findall(r"[A-Za-z_]\w*", rhs))
            if ".size()" in rhs or "sym_size" in rhs or (names and names <= derived):
                derived.add(lhs)
                continue
        for name in derived:
            line = re.sub(rf"\b{name}\b", "N", line)
        out.append(re.sub(r"\b\d+\b", "N", line))
    return "\n".join(out)


def _call(fn, x, xs, s: State, module):
    with _applied(s, module):
        out = fn(x, xs, s.alpha, s.k)
        outs = list(out) if isinstance(out, tuple) else [out]
        grad = None
        if s.grad_mode and x.requires_grad:
            torch.autograd.backward([o.sum() for o in outs if o.requires_grad])
            grad = x.grad
    return [o.detach() for o in outs], grad


def sequence(seed: int, length: int = 6, use_kiln: bool = False) -> list[tuple[str, str, str]]:
    """One mutation sequence; returns its failures as (kind, mutation, detail)."""
    import kiln
    from kiln.bench.accuracy import same
    rng = random.Random(seed)
    as_module = rng.random() < 0.5
    state = State()
    recorder = Recorder(_base_backend(use_kiln))
    module = Subject() if as_module else None
    debug_dir = os.path.join(tempfile.gettempdir(), "kiln_fuzz_debug")   # repro folders of crashes
    compiled = kiln.compile(module if as_module else SUBJECT, backend=recorder, options={"debug_dir": debug_dir})
    failures = []
    mutation = "first call"
    for step in range(length + 1):
        if step:
            mutation = rng.choice(list(_mutations(rng, state)))
            state = _mutations(rng, state)[mutation]()
        x, xs = _inputs(state, seed * 100 + step)
        ref = _call(module if as_module else SUBJECT, x, xs, state, module)
        if module is not None:
            module.w.grad = None
        x2, xs2 = _inputs(state, seed * 100 + step)
        before, recorder.ran = recorder.compiled, []
        try:
            res = _call(compiled, x2, xs2, state, module)
        except Exception as e:
            from kiln.testing.fuzz import _is_refusal
            failures.append(("refusal" if _is_refusal(e) else "crash", mutation, f"{type(e).__name__}: {str(e)[:300]}"))
            break
        if module is not None:
            module.w.grad = None
        fp64 = None
        if state.autocast:   # bf16 matmuls: the float64 run arbitrates, as in the benchmark's rule
            import copy
            s64 = dataclasses.replace(state, dtype=torch.float64, autocast=False)
            x4, xs4 = _inputs(s64, seed * 100 + step)
            m64 = copy.deepcopy(module).double() if as_module else None
            fp64 = _call(m64 if as_module else SUBJECT, x4, xs4, s64, m64)
        verdict = same(ref, res, fp64, tol=1e-2 if state.autocast else 1e-4, relative=True)
        if not verdict.ok:
            failures.append(("wrong", mutation, f"{state}: {verdict.detail}"))
        if recorder.compiled == before and recorder.ran:   # a cached entry ran: would a fresh compile agree?
            fresh = Recorder(_base_backend(False))
            fresh_fn = kiln.compile(Subject() if as_module else SUBJECT, backend=fresh)
            if as_module:
                fresh_fn._orig_mod.w.data = module.w.data.clone()
            x3, xs3 = _inputs(state, seed * 100 + step)
            _call(fresh_fn, x3, xs3, state, fresh_fn._orig_mod if as_module else None)
            got = [_normal(*ran) for ran in recorder.ran]
            want = [_normal(c, sym or reused_sym) for (c, sym, _), (_, reused_sym, _) in zip(fresh.ran, recorder.ran)]
            if got != want:
                import difflib
                diff = "\n".join(difflib.unified_diff("\n".join(want).splitlines(), "\n".join(got).splitlines(),
                                                     "fresh", "reused", lineterm="", n=0))
                failures.append(("stale", mutation, f"{state}: a cached graph ran where a fresh compile "
                                                    f"traces another:\n{diff}"))
    return failures


def campaign(sequences: int, seed: int, kiln_every: int = 10, length: int = 6, log=print) -> dict:
    counts = {"sequences": 0, "calls": 0, "wrong": 0, "stale": 0, "crash": 0, "refusal": 0}
    start = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(seed, seed + sequences):
            failures = sequence(s, length, use_kiln=kiln_every > 0 and s % kiln_every == 0)
            counts["sequences"] += 1
            counts["calls"] += length + 1
            for kind, mutation, detail in failures:
                counts[kind] += 1
                log(f"seed {s}: {kind} after mutating {mutation}: {detail}")
    counts["seconds"] = round(time.time() - start, 1)
    log(f"done: {counts}")
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.guard_fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--length", type=int, default=6)
    parser.add_argument("--kiln-every", type=int, default=10, help="every K-th sequence uses kiln's backend (0: never)")
    a = parser.parse_args(argv)
    counts = campaign(a.sequences, a.seed, a.kiln_every, a.length, log=lambda m: print(m, flush=True))
    return 1 if counts["wrong"] or counts["stale"] or counts["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
