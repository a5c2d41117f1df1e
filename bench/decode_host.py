"""kiln's host time in a decode step, on the CPU, as `mode="reduce-overhead"` spends it on a GPU host:
a static-cache generate() of a model whose CUDA-graph replays are emulated by a no-op, so a step's
kernels cost nothing and what is left is the host's work (kiln's guards, its runtime, the replay's
input and output handling, and generate()'s own loop). A probe for #36, whose batch-1 decoding is
bound by the host: the full models' structure at a width a CPU runs in no time (kiln/bench/decoding.py's
`narrow-dolly`, `narrow-llama`).

    python bench/decode_host.py narrow-dolly [--new 40] [--rounds 5] [--profile]

Prints, per round, generate()'s milliseconds a token and the median and minimum of kiln's model call
a decode step (the prefill's call apart); `--profile` then lists kiln's functions by own time under
cProfile (which slows Python: read shares, not absolute times)."""
import argparse
import cProfile
import io
import pstats
import statistics
import time
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

    def timed(*args, **kwargs):
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


if __name__ == "__main__":
    main()
