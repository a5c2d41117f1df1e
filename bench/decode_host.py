"""kiln's host time in a decode step, on the CPU, as `mode="reduce-overhead"` spends it on a GPU host:
a static-cache generate() of a model whose CUDA-graph replays are emulated by a no-op, so a step's
kernels cost nothing and what is left is the host's work (kiln's guards, its runtime, the replay's
input and output handling, and generate()'s own loop). A probe for #36, whose batch-1 decoding is
bound by the host: the full models' structure at a width a CPU runs in no time (kiln/bench/decoding.py's
`narrow-dolly`, `narrow-llama`).

    python bench/decode_host.py narrow-dolly [--new 40] [--rounds 5] [--profile] [--breakdown]

Prints, per round, generate()'s milliseconds a token and the median and minimum of kiln's model call
a decode step (the prefill's call apart); `--profile` then lists kiln's functions by own time under
cProfile (which slows Python: read shares, not absolute times); `--breakdown` times the pieces of
one decode step's call, each called alone in a loop on that step's arguments (the minimum over
repeats, so another process's load shows less): the entry's guard, the entry run (the graph's
inputs read, the program call, the output built), the program call (aot's runtime with the CUDA-graph
wrapper) and the wrapper alone."""
import argparse
import cProfile
import io
import pstats
import statistics
import time
import timeit
import warnings

import torch

import kiln
import kiln.pipeline as pipeline
from kiln.bench.decoding import build
from kiln.runtime.cudagraphs import graphed


def _noop_capture(program, graph_args):
    """A recording whose replay launches nothing: the first run's outputs stand for every replay's."""
    return (lambda: None), program(*graph_args)


def _wrap(options, program, meta, on_cuda):
    if not options.cudagraphs:
        return program
    return graphed(program, meta, capture=_noop_capture)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="narrow-dolly")
    p.add_argument("--new", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--sort", default="tottime")
    p.add_argument("--filter", default="kiln", help="the profile lists functions whose file matches this")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    pipeline._wrap = _wrap
    model = build(a.model, "cpu", torch.float32)
    ids = torch.randint(1, 1000, (1, 8))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
              pad_token_id=0, cache_implementation="static")
    fast = kiln.compile(model, mode="reduce-overhead")
    calls: list[float] = []
    model_call = type(model).__call__
    last_step: list = []

    def timed(*args, **kwargs):
        last_step[:] = [args, kwargs]
        start = time.perf_counter()
        try:
            return model_call(model, *args, **kwargs)
        finally:
            calls.append(time.perf_counter() - start)
    with torch.no_grad():
        fast.generate(ids, **kw)
        fast.generate(ids, **kw)          # compiled, recorded
        model.__dict__["__call__"] = timed   # generate() calls `self(...)`: an instance attribute wins
        for _ in range(a.rounds):
            calls.clear()
            start = time.perf_counter()
            fast.generate(ids, **kw)
            wall = time.perf_counter() - start
            steps = calls[1:]
            print(f"{a.model}: generate {1e3 * wall / a.new:.3f} ms a token; kiln's model call a decode step: "
                  f"median {1e6 * statistics.median(steps):.0f} us, min {1e6 * min(steps):.0f} us")
        if a.profile:
            profile = cProfile.Profile()
            profile.enable()
            fast.generate(ids, **kw)
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(a.sort).print_stats(a.filter, 30)
            print(out.getvalue())
        model.__dict__.pop("__call__")
        if a.breakdown:
            print(_breakdown(model, *last_step))


def _breakdown(model, args: tuple, kwargs: dict) -> str:
    """The pieces of a decode step's call (see the module docstring), in us."""
    from kiln.capture.frame import _ALL_WRAPPERS
    entry = next(w.last_hit for w in _ALL_WRAPPERS if w.last_hit is not None and w.last_hit.check(model, *args, **kwargs))
    cell = entry.run.__closure__[entry.run.__code__.co_freevars.index("__graph")]
    runtime, seen = cell.cell_contents, []
    cell.cell_contents = lambda *graph_args: (seen.append(graph_args), runtime(*graph_args))[1]
    entry.run(model, *args, **kwargs)
    cell.cell_contents = runtime
    graph_args = seen[0]
    primals = (*graph_args, *runtime.state_values)

    def us(fn):
        return 1e6 * min(timeit.repeat(fn, number=500, repeat=25)) / 500
    pieces = {"guard": us(lambda: entry.check(model, *args, **kwargs)),
              "entry run": us(lambda: entry.run(model, *args, **kwargs)),
              "program call": us(lambda: runtime(*graph_args)),
              "cuda-graph wrapper": us(lambda: runtime.fw(*primals))}
    return "kiln's decode step, us (min): " + ", ".join(f"{k} {v:.1f}" for k, v in pieces.items())


if __name__ == "__main__":
    main()
