"""Cold and warm compile seconds of zoo models on CPU, each in a fresh process.

    OMP_NUM_THREADS=1 python bench/warm_start.py [--models gpt2,resnet] [--size test|bench] [--out FILE]
        [--repos before=/path/to/old/checkout,after=.]

For each (model, infer|train): a cold process compiles into an empty cache directory, a warm process
compiles again from that directory. Each process reports the first compiled call's seconds (compile
and run), eager's first call, and, under KILN_LOG=perf, the seconds per stage (`kiln.log`); the
result is a markdown table; "CPU s" is the process's and its g++ children's CPU seconds over the
first call (less sensitive than wall seconds to other work on a shared machine). With several --repos, each case runs in every checkout in turn (so a
loaded machine slows them alike), --repeat times; the table keeps the run of least CPU seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time, torch
import kiln, kiln.log
from kiln.bench.zoo import ZOO, loss_of
name, mode, size = sys.argv[1:4]
model, inputs = ZOO[name].make("cpu", size=size)
if mode == "train":
    model.train()
def step(m):
    if mode == "train":
        out = m(*inputs)
        loss_of(out).backward()
        return out
    with torch.no_grad():
        return m(*inputs)
t = time.perf_counter(); step(model); eager = time.perf_counter() - t
compiled = kiln.compile(model)
def cpu():
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
c = cpu(); t = time.perf_counter(); step(compiled); first = time.perf_counter() - t; first_cpu = cpu() - c
print("RESULT " + json.dumps({"eager_first": eager, "kiln_first": first, "kiln_first_cpu": first_cpu,
                              "stages": kiln.log.totals()}))
"""


def run(name: str, mode: str, size: str, cache: str, repo: str) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=cache, KILN_LOG="perf", PYTHONPATH=repo)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, "-c", CHILD, name, mode, size], env=env, capture_output=True, text=True,
                          cwd=repo)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{name} {mode} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,resnet")
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--size", default="test")
    ap.add_argument("--repos", default="kiln=" + os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    repos = [item.split("=", 1) for item in args.repos.split(",")]
    rows = []
    stages: list[str] = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            best: dict[tuple[str, str], dict] = {}
            for _ in range(args.repeat):
                for label, repo in repos:
                    with tempfile.TemporaryDirectory(prefix="kiln-warm-") as cache:
                        for phase in ("cold", "warm"):
                            r = run(name, mode, args.size, os.path.join(cache, "kiln"), os.path.abspath(repo))
                            if args.out:             # every run, as it comes (a long bench may be cut short)
                                with open(args.out + ".jsonl", "a") as f:
                                    f.write(json.dumps({"model": name, "mode": mode, "kiln": label, "phase": phase, **r}) + "\n")
                            print(name, mode, label, phase, f"{r['kiln_first']:.2f} s", file=sys.stderr)
                            if (label, phase) not in best or r["kiln_first_cpu"] < best[label, phase]["kiln_first_cpu"]:
                                best[label, phase] = r
            for label, _ in repos:
                for phase in ("cold", "warm"):
                    r = best[label, phase]
                    rows.append((name, mode, label, phase, r))
                    stages += [s for s in r["stages"] if s not in stages]
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this checkout's kiln
    from kiln.log import STAGES as order
    stages = [s for s in order if s in stages] + [s for s in stages if s not in order]
    head = ["model", "mode", "kiln", "phase", "eager 1st s", "kiln 1st s", "kiln 1st CPU s", *stages]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, mode, label, phase, r in rows:
        cells = [name, mode, label, phase, f"{r['eager_first']:.2f}", f"{r['kiln_first']:.2f}",
                 f"{r['kiln_first_cpu']:.2f}",
                 *(f"{r['stages'][s]:.2f}" if s in r["stages"] else "" for s in stages)]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"`OMP_NUM_THREADS=1 python bench/warm_start.py --models {args.models} --modes {args.modes} "
                    f"--size {args.size} --repeat {args.repeat} --repos {args.repos}`\n\n{table}\n")


if __name__ == "__main__":
    main()
