"""Inline SVG charts of compile seconds: no script, no external asset, readable when printed.

`stage_bars(totals)`: one horizontal bar per stage, its seconds and share written beside it.
`frame_bars(rows)`: one stacked bar per compiled frame, a segment per stage (the stages' colours
are `COLOURS`, so both charts share a legend).
"""
from __future__ import annotations

from html import escape

COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#1f3b73", "#8cd17d", "#d37295")
UNCLAIMED = "#bab0ac"       # the grey of time no stage timer claims

LABEL_W, BAR_W, ROW_H = 190, 520, 22


def colour_of(stages: list, unclaimed: str = "") -> dict:
    """A colour per stage, in order; the stage named `unclaimed` is grey."""
    named = [s for s in stages if s != unclaimed]
    colours = {s: COLOURS[i % len(COLOURS)] for i, s in enumerate(named)}
    return {s: colours.get(s, UNCLAIMED) for s in stages}


def stage_bars(totals: dict, colours: dict) -> str:
    """Seconds per stage over the whole run."""
    total = sum(totals.values()) or 1.0
    top = max(totals.values(), default=0.0) or 1.0
    height = ROW_H * len(totals) + 10
    rows = []
    for i, (stage, seconds) in enumerate(totals.items()):
        y = 5 + i * ROW_H
        w = max(BAR_W * seconds / top, 1.0)
        rows.append(
            f'<g class="stage-bar" data-stage="{escape(stage)}">'
            f'<text x="{LABEL_W - 8}" y="{y + 15}" text-anchor="end">{escape(stage)}</text>'
            f'<rect x="{LABEL_W}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" fill="{colours[stage]}">'
            f'<title>{escape(stage)}: {seconds:.3f} s</title></rect>'
            f'<text x="{LABEL_W + w + 6:.1f}" y="{y + 15}">{seconds:.3f} s ({100 * seconds / total:.0f}%)</text></g>')
    return (f'<svg class="chart" role="img" aria-label="compile seconds per stage" width="{LABEL_W + BAR_W + 140}" '
            f'height="{height}" xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')


def frame_bars(rows: list, colours: dict) -> str:
    """`rows`: (label, {stage: seconds}) per frame, drawn to one scale."""
    top = max((sum(s.values()) for _, s in rows), default=0.0) or 1.0
    height = ROW_H * len(rows) + 10
    out = []
    for i, (label, stages) in enumerate(rows):
        y, x = 5 + i * ROW_H, float(LABEL_W)
        out.append(f'<text x="{LABEL_W - 8}" y="{y + 15}" text-anchor="end">{escape(_clip(label))}</text>')
        for stage, seconds in stages.items():
            w = BAR_W * seconds / top
            if w < 0.2:
                continue
            out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" fill="{colours[stage]}">'
                       f'<title>{escape(label)}: {escape(stage)} {seconds:.3f} s</title></rect>')
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + 15}">{sum(stages.values()):.3f} s</text>')
    return (f'<svg class="chart" role="img" aria-label="compile seconds per frame" width="{LABEL_W + BAR_W + 90}" '
            f'height="{height}" xmlns="http://www.w3.org/2000/svg">{"".join(out)}</svg>')


def legend(colours: dict) -> str:
    return "".join(f'<span class="key"><i style="background:{c}"></i>{escape(s)}</span>' for s, c in colours.items())


def _clip(text: str, n: int = 28) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1):]
