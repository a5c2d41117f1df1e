"""The markdown of an hf_corpus run: totals per compiler, failure groups by reason, one row per model.

`write_markdown(jsonl_path)` writes `<run>.md` next to the JSON lines and returns its text.
Reasons are grouped after dropping what differs between sites of one cause (file paths, line
numbers, quoted names of values), so each group is one thing to fix, largest first.
"""
from __future__ import annotations

import collections
import json
import re

COMPILERS = ("kiln", "torch.compile")
FULLGRAPH = "kiln fullgraph"  # rows rerun with fullgraph=True: one graph, or `raised` naming the line
TORCH_FULLGRAPH = "torch.compile fullgraph"   # torch.compile's, to compare with (issue #39)
# outputs that differ from eager's by the model's own doing (hf_corpus._status)
MODEL_DIFFERENCES = {"eager_varies": "eager varies", "compile_path": "model's compile path"}


def load(path: str) -> list[dict]:
    rows = {}
    for line in open(path):
        if line.strip():
            row = json.loads(line)
            rows[row["model"]] = row  # a resumed run's later row wins
    return list(rows.values())


def one_graph(result: dict) -> bool:
    return result["status"] == "correct" and result["graphs"] == 1 and not result["breaks"]


def reason_group(reason: str) -> str:
    reason = (reason.strip().splitlines() or [""])[0]  # dynamo's reasons go on with an explanation
    reason = re.sub(r"\S+\.py:\d+ in \S+", "<site>", reason)
    reason = re.sub(r"(at|in) <site>", "", reason)
    reason = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    reason = re.sub(r"\b\d+\b", "N", reason)
    return reason.strip()[:160]


def totals(rows: list[dict]) -> dict:
    ran = [r for r in rows if "skipped" not in r]
    out = {"models": len(rows), "ran": len(ran), "skipped": len(rows) - len(ran)}
    for c in COMPILERS:
        results = [r[c] for r in ran if c in r]
        out[c] = {"correct": sum(x["status"] == "correct" for x in results),
                  "wrong": sum(x["status"] == "wrong" for x in results),
                  "model": sum(x["status"] in MODEL_DIFFERENCES for x in results),
                  "error": sum(x["status"] == "error" for x in results),
                  "one_graph": sum(one_graph(x) for x in results),
                  "graphs": sum(x["graphs"] or 0 for x in results),
                  "breaks": sum(len(x["breaks"]) for x in results)}
    return out


def _groups(rows: list[dict], compiler: str) -> list[tuple[str, int, list[str]]]:
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for r in rows:
        x = r.get(compiler)
        if x is None:
            continue
        reasons = [b["reason"] for b in x["breaks"]]
        if x["status"] != "correct":
            reasons.append(f"{x['status']}: {x['detail']}")
        for reason in dict.fromkeys(reason_group(s) for s in reasons):
            groups[reason].append(r["model"])
    return sorted(((k, len(v), v) for k, v in groups.items()), key=lambda g: -g[1])


def _cell(x: dict | None) -> str:
    if x is None:
        return "-"
    mark = {"correct": "ok", "wrong": "**WRONG**", "error": "error", "raised": "raised",
            **MODEL_DIFFERENCES}[x["status"]]
    return f"{mark} {x['graphs'] if x['graphs'] is not None else '-'}g/{len(x['breaks'])}b"


def _fullgraph_lines(rows: list[dict]) -> list[str]:
    """`fullgraph=True` over the rows rerun so: one graph, or an error naming the user's line."""
    results = [(r["model"], r[FULLGRAPH]) for r in rows if FULLGRAPH in r]
    if not results:
        return []
    # one graph whatever its outputs (a model's own differences are counted in the table above)
    one = [m for m, x in results if x["graphs"] == 1 and not x["breaks"] and x["status"] not in ("error", "raised")]
    raised = [m for m, x in results if x["status"] == "raised"]
    other = [f"{m} ({x['status']}: {x['detail'] or ''})"[:160] for m, x in results if m not in one and m not in raised]
    lines = ["", f"With `fullgraph=True` (`--compilers '{FULLGRAPH}'`), {len(results)} models: {len(one)} one graph, "
                 f"{len(raised)} raised `Unsupported` naming the line (`file:line in function: reason`), "
                 f"{len(other)} neither{': ' + '; '.join(other) if other else ''}."]
    both = [r for r in rows if FULLGRAPH in r and TORCH_FULLGRAPH in r]
    if both:
        def whole(x):
            return x["graphs"] == 1 and not x["breaks"] and x["status"] not in ("error", "raised")
        torch_one = [r["model"] for r in both if whole(r[TORCH_FULLGRAPH])]
        missed = [f"{r['model']} ({r[FULLGRAPH]['status']}: {(r[FULLGRAPH]['detail'] or '')[:120]})"
                  for r in both if whole(r[TORCH_FULLGRAPH]) and not whole(r[FULLGRAPH])]
        kiln_only = [r["model"] for r in both if whole(r[FULLGRAPH]) and not whole(r[TORCH_FULLGRAPH])]
        lines += ["", f"Against torch.compile's `fullgraph=True` on the same {len(both)} models "
                      f"(`--compilers '{FULLGRAPH},{TORCH_FULLGRAPH}'`): torch.compile one graph on {len(torch_one)}, "
                      f"kiln on {len(torch_one) - len(missed) + len(kiln_only)}; where torch.compile keeps one graph "
                      f"and kiln does not: {len(missed)}{': ' + '; '.join(missed) if missed else ''}; kiln only: "
                      f"{len(kiln_only)}{': ' + ', '.join(kiln_only) if kiln_only else ''}."]
    return lines


def markdown(rows: list[dict], title: str) -> str:
    t = totals(rows)
    lines = [f"# {title}", "",
             f"{t['models']} model classes from transformers' auto mappings; {t['ran']} ran (tiny config, "
             f"random weights, CPU, eval, no_grad), {t['skipped']} skipped (no tiny config, no inputs the corpus "
             "makes, eager fails, or the worker crashed). Each compiler uses one counting backend that runs "
             "its graphs as FX Python; `one graph` = correct, 1 graph, 0 breaks. `model differs`: outputs "
             "unlike eager's by the model's own doing, not the compiler's: eager differs from itself on a second "
             "call (`eager varies`), or eager run with `torch.compiler.is_compiling()` True gives the compiled "
             "output (`model's compile path`).", "",
             "| compiler | correct | one graph | wrong results | model differs | errors | graphs | breaks |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in COMPILERS:
        x = t[c]
        lines.append(f"| {c} | {x['correct']} | {x['one_graph']} | {x['wrong']} | {x['model']} | {x['error']} "
                     f"| {x['graphs']} | {x['breaks']} |")
    lines += _fullgraph_lines(rows)
    for c in COMPILERS:
        lines += ["", f"## {c}: break and failure groups", "", "| models | reason | examples |", "| --- | --- | --- |"]
        for reason, n, models in _groups(rows, c)[:40]:
            lines.append(f"| {n} | {reason.replace('|', '/')} | {', '.join(models[:4])} |")
    skipped = collections.Counter(reason_group(r["skipped"]) for r in rows if "skipped" in r)
    lines += ["", "## skipped", "", "| models | reason |", "| --- | --- |"]
    lines += [f"| {n} | {reason.replace('|', '/')} |" for reason, n in skipped.most_common(25)]
    lines += ["", "## per model", "", "| model | kiln | torch.compile | kiln's first break |", "| --- | --- | --- | --- |"]
    for r in rows:
        if "skipped" in r:
            continue
        k = r.get("kiln") or {}
        first = (k.get("breaks") or [{}])[0].get("reason") or (k.get("detail") if k.get("status") != "correct" else "")
        lines.append(f"| {r['model']} | {_cell(r.get('kiln'))} | {_cell(r.get('torch.compile'))} "
                     f"| {(first or '')[:120].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_markdown(path: str) -> str:
    text = markdown(load(path), f"transformers capture corpus ({path.rsplit('/', 1)[-1]})")
    with open(path.rsplit(".", 1)[0] + ".md", "w") as f:
        f.write(text)
    return text
