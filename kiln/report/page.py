"""One `Run` to one self-contained HTML page: inline CSS, inline SVG, a few lines of inline script.

Sections, in the order a user asks the questions: the summary (counts, every graph break with its
reason and line, every recompile with the guard that failed), where the compile time went (per
stage, per frame), each compiled frame (its source with the break lines marked, its guards, its
graphs after capture and aot with node counts), and the kernels (source, launch, the fusions the
scheduler refused around each). Everything is escaped text; the page loads nothing.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from html import escape

from kiln.report import chart
from kiln.report.assets import CSS, SCRIPT
from kiln.report.run import BACKEND_OTHER, FrameCompile, Run, order_stages


def render(run: Run, title: str = "kiln report") -> str:
    frames = run.frames
    body = [f"<header><h1>{escape(title)}</h1>{_processes(run)}</header>",
            '<nav><a href="#summary">summary</a> <a href="#time">time</a> <a href="#frames">frames</a> '
            '<a href="#kernels">kernels</a> <button type="button" id="expand">expand all</button> '
            '<button type="button" id="collapse">collapse all</button></nav>',
            _summary(run), _time(run), _frames(frames), _kernels(frames)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n" + "\n".join(body)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def _processes(run: Run) -> str:
    items = "".join(f"<li>pid {p.pid}: <code>{escape(' '.join(p.argv))}</code></li>" for p in run.processes)
    return f'<ul class="processes">{items}</ul>'


def _short(path: str) -> str:
    return os.path.relpath(path) if path and not os.path.relpath(path).startswith("..") else path


def _frame_id(i: int) -> str:
    return f"frame-{i}"


_RESUME = re.compile(r"^__kiln_resume_(?P<name>.+)_at_(?P<offset>\d+)$")


def _pretty(function: str) -> str:
    """`__kiln_resume_f_at_70` (the rest of f after a break, from bytecode offset 70) as `f (resumed @70)`."""
    match = _RESUME.match(function)
    return f"{_pretty(match['name'])} (resumed @{match['offset']})" if match else function


def _frame_label(f: FrameCompile) -> str:
    return _pretty(f.function) + (f" #{f.index + 1}" if f.index else "")


# --------------------------------------------------------------------------------------- summary

def _summary(run: Run) -> str:
    s = run.summary()
    rows = "".join(f'<div class="stat" data-key="{escape(k)}"><b>{_number(v)}</b><span>{escape(k)}</span></div>'
                   for k, v in s.items())
    frames = run.frames
    breaks = []
    seen = set()
    for i, f in enumerate(frames):
        for b in f.breaks:
            key = (b.get("where"), b["reason"])
            if key in seen:
                continue
            seen.add(key)
            breaks.append(f'<li class="break-site"><a href="#{_frame_id(i)}">{escape(_frame_label(f))}</a>: '
                          f'<span class="reason">{escape(b["reason"])}</span>{_where(b)}</li>')
    recompiles = [f'<li class="recompile-reason"><a href="#{_frame_id(i)}">{escape(_frame_label(f))}</a>: '
                  f'{escape(f.recompile)}</li>' for i, f in enumerate(frames) if f.recompile]
    eager = [f'<li class="eager">{escape(e["function"])}: {escape(e["reason"])}</li>'
             for p in run.processes for e in p.eager]
    failed = [f'<li class="failed"><a href="#{_frame_id(i)}">{escape(_frame_label(f))}</a>: the compile did not finish '
              '(an error was raised; see the program\'s output)</li>' for i, f in enumerate(frames) if not f.done]
    return (f'<section id="summary"><h2>Summary</h2><div class="summary">{rows}</div>'
            + _list("Graph breaks", "breaks", breaks) + _list("Recompiles", "recompiles", recompiles)
            + _list("Run eagerly (cache-size limit)", "eager", eager) + _list("Failed compiles", "failed", failed)
            + "</section>")


def _list(title: str, cls: str, items: list) -> str:
    if not items:
        return f'<p class="none-list"><b>{escape(title)}:</b> <span class="none">none</span></p>'
    return f'<h3>{escape(title)}</h3><ul class="{cls}">{"".join(items)}</ul>'


def _number(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _where(b: dict) -> str:
    if not b.get("where"):
        return ""
    loc = f'{_short(b.get("file", ""))}:{b["line"]}' if b.get("file") else b["where"]
    text = f' <code class="user-line">{escape(b["line_text"])}</code>' if b.get("line_text") else ""
    return f' <span class="where">at {escape(loc)}</span>{text}'


# ------------------------------------------------------------------------------------------ time

def _time(run: Run) -> str:
    totals = run.stage_totals()
    if not totals:
        return '<section id="time"><h2>Compile time</h2><p class="none">no compile</p></section>'
    colours = chart.colour_of(list(totals), BACKEND_OTHER)
    rows = [(_frame_label(f), order_stages(f.stage_seconds())) for f in run.frames if f.seconds or f.stages]
    rows.sort(key=lambda r: -sum(r[1].values()))
    shown = rows[:40]
    more = f'<p class="none">{len(rows) - len(shown)} shorter frames not drawn</p>' if len(rows) > len(shown) else ""
    return ('<section id="time"><h2>Compile time</h2>'
            '<p>Seconds per stage (kiln.log\'s stages, as <code>KILN_LOG=perf</code> prints them), summed over '
            'every compiled frame: each second counts once, in the innermost stage running (the decomposition '
            'into prims inside the aot trace is <em>decompose</em>); <em>backend other</em> is the backend\'s '
            'time no stage claims.</p>'
            f'{chart.stage_bars(totals, colours)}<h3>Per frame</h3><p class="legend">{chart.legend(colours)}</p>'
            f'{chart.frame_bars(shown, colours)}{more}</section>')


# ---------------------------------------------------------------------------------------- frames

def _frames(frames: list) -> str:
    parts = ['<section id="frames"><h2>Compiled frames</h2>']
    for i, f in enumerate(frames):
        parts.append(_frame(i, f))
    return "".join(parts) + "</section>"


def _frame(i: int, f: FrameCompile) -> str:
    head = (f'<h3 title="{escape(f.function)}">{escape(_frame_label(f))} <span class="where">{escape(_short(f.file))}:{f.line}</span> '
            f'<span class="secs">{f.seconds:.3f} s</span></h3>')
    notes = []
    if f.recompile:
        notes.append(f'<p class="recompile">recompiled because a guard failed: <code>{escape(f.recompile)}</code></p>')
    if not f.done:
        notes.append('<p class="failed">this compile did not finish: an error was raised</p>')
    if f.eager:
        notes.append('<p class="eager">the whole function runs eagerly</p>')
    notes += [f'<pre class="split">{escape(text)}</pre>' for text in f.splits]   # DDP's buckets
    body = [head, *notes, _source(f), _outside_breaks(f), _guards(f)]
    body += [_graph(i, j, g) for j, g in enumerate(f.graphs)]
    return f'<article class="frame" id="{_frame_id(i)}" data-function="{escape(f.function)}">{"".join(body)}</article>'


def _source(f: FrameCompile) -> str:
    if not f.source:
        return ""
    marks: dict[int, list] = {}
    for b in f.breaks:
        if b.get("file") == f.file and f.line <= b.get("line", 0) < f.line + len(f.source):
            marks.setdefault(b["line"], []).append(b["reason"])
    rows = []
    for k, text in enumerate(f.source):
        n = f.line + k
        cls = ' class="brk"' if n in marks else ""
        rows.append(f'<tr{cls} data-line="{n}"><td class="ln">{n}</td><td><code>{escape(text) or " "}</code></td></tr>')
        for reason in marks.get(n, ()):
            rows.append(f'<tr class="brk-note"><td></td><td>graph break: <span class="reason">{escape(reason)}'
                        '</span></td></tr>')
    return f'<table class="source">{"".join(rows)}</table>'


def _outside_breaks(f: FrameCompile) -> str:
    """Breaks inside functions this frame called (their lines are not in its source)."""
    items = [f'<li class="break-site"><span class="reason">{escape(b["reason"])}</span>{_where(b)}</li>'
             for b in f.breaks
             if not (b.get("file") == f.file and f.line <= b.get("line", 0) < f.line + len(f.source))]
    return f'<p>graph breaks in functions it calls:</p><ul class="breaks">{"".join(items)}</ul>' if items else ""


def _guards(f: FrameCompile) -> str:
    if not f.guards:
        return ""
    items = "".join(f"<li><code>{escape(g)}</code></li>" for g in f.guards)
    return f'<details class="guards"><summary>{len(f.guards)} guards</summary><ul>{items}</ul></details>'


def _graph(i: int, j: int, g) -> str:
    ops = ", ".join(f"{n} {escape(space)}" for space, n in sorted(g.ops.items(), key=lambda kv: -kv[1]))
    summary = f'{escape(g.stage)} graph: <span class="nodes">{g.nodes}</span> nodes' + (f" ({ops})" if ops else "")
    note = f'<p class="note">{escape(g.note)}</p>' if g.note else ""
    code = f'<pre><code>{escape(g.code.strip())}</code></pre>' if g.code else ""
    program = _program(i, j, g.schedule) if g.schedule else (
        '<p class="program none">its program came from the warm-start cache: no kernels were generated</p>'
        if g.cached else "")
    return (f'<details class="graph" data-stage="{escape(g.stage)}" data-nodes="{g.nodes}"><summary>{summary}</summary>'
            f'{note}{code}</details>{program}')


def _program(i: int, j: int, s: dict) -> str:
    links = ", ".join(f'<a href="#{_kernel_id(i, j, k["name"])}">{escape(k["name"])}</a>' for k in s["kernels"])
    externs = ", ".join(f"{escape(op)} ×{n}" if n > 1 else escape(op)
                        for op, n in Counter(e["op"] for e in s["externs"]).most_common())
    return (f'<div class="program"><p>{len(s["kernels"])} kernels ({escape(s["printer"])}): {links or "none"}'
            + (f'; extern calls: {externs}' if externs else "") + f'; {len(s["refused"])} refused fusions</p>'
            + _matmuls(s.get("matmuls") or []) +
            f'<details class="ir"><summary>loop IR</summary><pre><code>{escape(s["ir"])}</code></pre></details>'
            f'<details class="host"><summary>host program</summary><pre><code>{escape(s["host"])}</code></pre></details>'
            '</div>')


def _matmuls(decisions: list) -> str:
    """max-autotune's choice for each matrix product ([Note: matmul autotuning]): what won, how many
    configurations this compile benchmarked (0 when the choice came from the cache), the timings."""
    if not decisions:
        return ""
    items = []
    for d in decisions:
        choice = "extern" if d["choice"] == "extern" else f'template {d["choice"]}'
        epilogue = f' + {", ".join(d["epilogue"])}' if d["epilogue"] else ""
        times = "; ".join(f"{label} {ms:.4f} ms" for label, ms in d["timings"].items())
        items.append(f'<li><code>{escape(d["product"])}</code> = {escape(d["op"])} {escape(d["shape"])} '
                     f'{escape(d["dtype"])}{escape(epilogue)}: <b>{escape(choice)}</b> ({escape(d["how"])}; '
                     f'<span class="benchmarked">{d["benchmarked"]}</span> configurations benchmarked)'
                     + (f'<br><span class="timings">{escape(times)}</span>' if times else "") + "</li>")
    total = sum(d["benchmarked"] for d in decisions)
    return (f'<details class="matmuls" open><summary>max-autotune: {len(decisions)} matrix products, '
            f'{total} configurations benchmarked</summary><ul>{"".join(items)}</ul></details>')


# --------------------------------------------------------------------------------------- kernels

def _kernel_id(i: int, j: int, name: str) -> str:
    return f"kernel-{i}-{j}-{name}"


def _kernels(frames: list) -> str:
    rows = []
    for i, f in enumerate(frames):
        for j, g in enumerate(f.graphs):
            if not g.schedule:
                continue
            for k in g.schedule["kernels"]:
                rows.append(_kernel(i, j, f, g, k))
    if not rows:
        return '<section id="kernels"><h2>Kernels</h2><p class="none">no kernel was generated</p></section>'
    return ('<section id="kernels"><h2>Kernels</h2><p><label>filter <input id="kernel-filter" type="search" '
            'placeholder="name, fused node or source text"></label> <span id="kernel-count"></span></p>'
            + "".join(rows) + "</section>")


def _kernel(i: int, j: int, f: FrameCompile, g, k: dict) -> str:
    fused = set(k["origins"])
    reasons = []
    for r in g.schedule["refused"]:
        if r["node"] in fused:
            reasons.append(f'{escape(r["node"])} not fused into [{escape(", ".join(r["group"]))}]: '
                           f'<span class="reason">{escape(r["reason"])}</span>')
        elif fused & set(r["group"]):
            reasons.append(f'did not take {escape(r["node"])}: <span class="reason">{escape(r["reason"])}</span>')
    why = (f'<ul class="fusion">{"".join(f"<li>{x}</li>" for x in reasons)}</ul>' if reasons
           else '<p class="none">no fusion refused around this kernel</p>')
    return (f'<article class="kernel" id="{_kernel_id(i, j, k["name"])}"><h3>{escape(k["name"])} '
            f'<span class="where"><a href="#{_frame_id(i)}">{escape(_frame_label(f))}</a>, {escape(g.stage)}</span></h3>'
            f'<p>fuses {len(fused)}: <code>{escape(", ".join(k["origins"]))}</code></p>'
            f'<p class="launch">launch: {escape(k["launch"])}</p>{why}'
            f'<details class="kernel-source"><summary>source</summary><pre><code>{escape(k["source"])}</code></pre>'
            '</details></article>')
