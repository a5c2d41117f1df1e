"""What the event log costs when it is off: the zoo's GPT-2 (test size, one training step) compiled
and run in fresh processes, alternating this checkout with another (the commit before the log),
both with KILN_TRACE unset and the program cache off (g++ libraries stay cached: same sources).

    git archive <commit> | tar -x -C /tmp/kiln-base
    OMP_NUM_THREADS=1 python bench/trace_overhead.py --base /tmp/kiln-base --runs 8

Also prints what a no-op `trace.emit` costs and how many events one GPT-2 compile emits (a run
with KILN_TRACE set), which bound the log's cost when off: events x cost per call.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit

CHILD = r'''
import json, time, torch, kiln
from kiln.bench.zoo import ZOO, loss_of
model, inputs = ZOO["gpt2"].make("cpu")
model.train()
fast = kiln.compile(model)
def step():
    loss_of(fast(*inputs)).backward()
t = time.perf_counter(); step(); first = time.perf_counter() - t
times = []
for _ in range(30):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
times.sort()
print("RESULT " + json.dumps({"file": kiln.__file__, "compile": first, "run_ms": 1e3 * times[len(times) // 2]}))
'''
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(root: str, trace: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "KILN_DISABLE_CACHE": "1"}
    env.pop("KILN_TRACE", None)
    env.pop("KILN_LOG", None)
    if trace:
        env["KILN_TRACE"] = trace
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(out.stderr[-3000:])
    result = json.loads(line[7:])
    assert result["file"].startswith(root), result
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="a checkout of kiln without the event log")
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    trees = [("before", os.path.abspath(args.base)), ("after", HERE)]
    rows: dict[str, list] = {name: [] for name, _ in trees}
    for i in range(args.runs):
        for name, root in trees if i % 2 == 0 else trees[::-1]:
            r = child(root)
            rows[name].append(r)
            print(f"{name}: compile {r['compile']:.2f} s, step {r['run_ms']:.2f} ms", file=sys.stderr)
    lines = ["| kiln | compile s, median (min-max) | training step ms, median (min-max) |", "|---|---|---|"]
    for name, rs in rows.items():
        c, m = [r["compile"] for r in rs], [r["run_ms"] for r in rs]
        lines.append(f"| {name} | {statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f}) | "
                     f"{statistics.median(m):.2f} ({min(m):.2f}-{max(m):.2f}) |")
    with tempfile.TemporaryDirectory() as folder:
        on = child(HERE, folder)
        with open(os.path.join(folder, "kiln-trace.jsonl")) as f:
            events = sum(1 for _ in f)
    sys.path.insert(0, HERE)
    from kiln import trace
    trace.configure(folder="", log="")
    per_call = min(timeit.repeat(lambda: trace.emit("stage", stage="lower", seconds=0.1), number=100000, repeat=5)) / 1e5
    lines += ["", f"With KILN_TRACE set: compile {on['compile']:.2f} s, step {on['run_ms']:.2f} ms, {events} events.",
              f"A no-op emit: {per_call * 1e9:.0f} ns; {events} events: {events * per_call * 1e6:.0f} µs per GPT-2 compile."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
