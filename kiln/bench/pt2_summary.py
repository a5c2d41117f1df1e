"""The CPU sweep of PyTorch 2.0's suites in one page: `python -m kiln.bench.pt2_summary FILE.jsonl ... -o OUT.md`.

Reads the results files of `kiln bench --suite pt2-... --compilers eager,kiln` (one per suite, each
grown by `--resume`), and writes per suite: models run, kiln's passes in inference and training, and
the failures grouped by cause from `kiln.bench.pt2_expected_failures`; a failing row with no entry
there is listed as unexplained (add it), and an entry whose row now passes as stale (remove it).
"""
from __future__ import annotations

import argparse
import sys

from kiln.bench.pt2_expected_failures import CAUSES, expected_failure
from kiln.bench.report import read_rows


def summarize(paths: list[str], compiler: str = "kiln") -> str:
    _, rows = read_rows(paths)
    kiln_rows = [r for r in rows.values() if r.get("compiler") == compiler]
    suites = sorted({r["suite"] for r in kiln_rows})
    text = ["# PyTorch 2.0's suites on the CPU: kiln against eager, batch 2, fp32", "",
            "Status by the benchmark's rule (allclose at the suite's tolerance, else RMSE against float64 at most "
            "2x eager's); train compares one step's loss and every gradient. Files: "
            + ", ".join(f"`{p}`" for p in paths) + ". Made, one suite after another, by", "",
            "```sh", "nice -n 10 kiln bench --device cpu --suite pt2-timm --compilers eager,kiln --modes infer,train \\",
            "    --steps 1 --warmup 0 --timeout 600 --resume bench/results/pt2-suites/cpu_pt2-timm.jsonl "
            "--out bench/results/pt2-suites", "python -m kiln.bench.pt2_summary bench/results/pt2-suites/cpu_*.jsonl "
            "-o bench/results/pt2-suites/README.md", "```", "",
            "Add `--shard I/N` to split a suite over several machines or windows. Models not yet run are not in "
            "the table.", "",
            "| suite | models run | pass infer | pass train | unavailable | other failures |", "|---|---|---|---|---|---|"]
    causes: dict[str, set[str]] = {}
    unexplained, stale = [], []
    for suite in suites:
        mine = [r for r in kiln_rows if r["suite"] == suite]
        models = {r["model"] for r in mine}
        passed = {mode: sum(r["status"] == "pass" for r in mine if r["mode"] == mode) for mode in ("infer", "train")}
        ran = {mode: sum(1 for r in mine if r["mode"] == mode) for mode in ("infer", "train")}
        unavailable = {r["model"] for r in mine if r["status"] == "unavailable"}
        failing = [r for r in mine if r["status"] not in ("pass", "unavailable")]
        text.append(f"| {suite} | {len(models)} | {passed['infer']}/{ran['infer']} | {passed['train']}/{ran['train']} "
                    f"| {len(unavailable)} | {len(failing)} |")
        for r in mine:
            expected = expected_failure(suite, r["model"], r["mode"])
            if r["status"] == "pass":
                if expected is not None:
                    stale.append(f"{suite}/{r['model']} {r['mode']}: passes now; remove its entry ({expected.cause})")
                continue
            if expected is None:
                unexplained.append(f"{suite}/{r['model']} {r['mode']}: {r['status']}: {r.get('error', '')[:200]}")
                continue
            causes.setdefault(expected.cause, set()).add(f"{suite}/{r['model']} {r['mode']}")
    text += ["", "## Failures by cause (most rows first)", ""]
    for cause, cases in sorted(causes.items(), key=lambda c: (-len(c[1]), c[0])):
        text.append(f"- **{cause}** ({len(cases)} rows, {len({c.split()[0] for c in cases})} models): {CAUSES[cause]}")
        text.append(f"  - {', '.join(sorted(cases))}")
    if unexplained:
        text += ["", "## Failing rows without an entry in kiln/bench/pt2_expected_failures.py", ""]
        text += [f"- {line}" for line in unexplained]
    if stale:
        text += ["", "## Entries whose rows pass now", ""] + [f"- {line}" for line in stale]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln.bench.pt2_summary", description=__doc__.splitlines()[0])
    p.add_argument("jsonl", nargs="+")
    p.add_argument("-o", "--out", default=None, help="markdown file (default: print)")
    args = p.parse_args(argv)
    text = summarize(args.jsonl)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
