"""Cold and warm compile seconds of zoo and suite models, each in a fresh process (CPU or CUDA).

    OMP_NUM_THREADS=1 python bench/warm_start.py [--models gpt2,resnet,hf:GPT2LMHeadModel,timm:resnet50]
        [--size test|bench] [--batch N] [--device cpu|cuda] [--precision fp32|bf16] [--out FILE]
        [--repos before=/path/to/old/checkout,after=.]

For each (model, infer|train): a cold process compiles into empty cache directories (kiln's and
Triton's: with Triton's shared `~/.triton`, a "cold" process found binaries and Triton's own driver
module built by earlier runs), a warm process compiles again from those directories. Each process reports the first compiled call's seconds (compile
and run), a second compiled call ("steady"; "compile s" is the first minus it, as `kiln bench`'s
cold and warm seconds), eager's first call, the seconds of `import torch` and then of `import kiln`,
whether torch's dynamo got imported, and, under KILN_LOG=perf, the seconds per stage (`kiln.log`);
the result is a markdown table; "CPU s" is the process's and its g++ children's CPU seconds over the
first call (less sensitive than wall seconds to other work on a shared machine). With several
--repos, each case runs in every checkout in turn (so a loaded machine slows them alike), --repeat
times; the table keeps the run of least CPU seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import contextlib, json, resource, sys, time
t = time.perf_counter(); import torch; torch_import = time.perf_counter() - t
t = time.perf_counter(); import kiln, kiln.log; kiln_import = time.perf_counter() - t
from kiln.bench.zoo import ZOO, loss_of
name, mode, size, batch, device, precision = sys.argv[1:7]
if ":" in name:                           # a suite's model (hf:GPT2LMHeadModel, timm:resnet50)
    from kiln.bench.suites import disable_dropout, get_model
    suite, model_name = name.split(":", 1)
    model, inputs, kwargs = get_model(suite, model_name).make(device, batch=int(batch) if batch else None)
    disable_dropout(model)
else:
    model, inputs = ZOO[name].make(device, size=size)
    kwargs = {}
if mode == "train":
    model.train()
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
def step(m):
    cast = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with cast, (contextlib.nullcontext() if mode == "train" else torch.no_grad()):
        out = m(*inputs, **kwargs)
        if mode == "train":
            loss_of(out).backward()
    sync()
def timed(m):
    t = time.perf_counter(); step(m); return time.perf_counter() - t
eager = timed(model)
compiled = kiln.compile(model)
def cpu():
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
c = cpu(); first = timed(compiled); first_cpu = cpu() - c
steady = timed(compiled)
print("RESULT " + json.dumps({"eager_first": eager, "kiln_first": first, "kiln_first_cpu": first_cpu,
                              "kiln_steady": steady, "import_torch": torch_import, "import_kiln": kiln_import,
                              "dynamo_imported": "torch._dynamo" in sys.modules,
                              "stages": kiln.log.totals()}))
"""


def run(name: str, mode: str, size: str, batch: str, device: str, precision: str, cache: str, repo: str) -> dict:
    """One process; `cache`: the folder its kiln and Triton caches live under."""
    # the checkout first; the rest of the caller's path (wheels installed under a --target) after it
    path = [repo] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(cache, "kiln"), TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               KILN_LOG="perf", PYTHONPATH=os.pathsep.join(path))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)    # a user's processes import kiln from bytecode caches
    proc = subprocess.run([sys.executable, "-c", CHILD, name, mode, size, batch, device, precision], env=env, capture_output=True, text=True,
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
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast")
    ap.add_argument("--batch", default="", help="batch of suite models (hf:NAME, timm:NAME); default theirs")
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
                            r = run(name, mode, args.size, args.batch, args.device, args.precision, cache, os.path.abspath(repo))
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
    head = ["model", "mode", "kiln", "phase", "import torch s", "import kiln s", "eager 1st s", "kiln 1st s",
            "kiln 1st CPU s", "kiln steady s", "compile s", "dynamo imported", *stages]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, mode, label, phase, r in rows:
        cells = [name, mode, label, phase, f"{r.get('import_torch', float('nan')):.2f}",
                 f"{r.get('import_kiln', float('nan')):.2f}", f"{r['eager_first']:.2f}", f"{r['kiln_first']:.2f}",
                 f"{r['kiln_first_cpu']:.2f}", f"{r.get('kiln_steady', float('nan')):.2f}",
                 f"{r['kiln_first'] - r.get('kiln_steady', float('nan')):.2f}", str(r.get("dynamo_imported", "")),
                 *(f"{r['stages'][s]:.2f}" if s in r["stages"] else "" for s in stages)]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"`OMP_NUM_THREADS=1 python bench/warm_start.py --models {args.models} --modes {args.modes} "
                    f"--size {args.size} --batch {args.batch} --device {args.device} --precision {args.precision} --repeat {args.repeat} --repos {args.repos}`\n\n{table}\n")


if __name__ == "__main__":
    main()
