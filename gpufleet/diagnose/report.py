"""Render an :class:`~gpufleet.diagnose.attribution.Attribution`: the ranked text table and a self-contained HTML page.

Contract:
- :func:`text_table` is what ``gpufleet diagnose`` prints (from the report's JSON form): utilisation, then one
  row per cause with GPU time (lost causes ranked by GPU-hours first), its share and the likely fix.
- :func:`html_page` is one HTML document with no external resource (no script, font or stylesheet from a
  network; inline SVG only): the ranked attribution chart (one bar per cause) and a per-node timeline with
  one lane per GPU, each segment coloured by cause. Colour is never the only signal: every cause has a
  letter code written on its legend entry and on timeline segments wide enough to hold it, free-GPU causes
  are hatched, and every segment has a ``<title>`` (cause, job, seconds). The hatch patterns are defined
  once in the page (:func:`chart_svg` and :func:`timeline_svg` refer to them).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any

from gpufleet.diagnose.attribution import FIXES, Attribution, Cause

#: cause -> (colour, letter code)
STYLE: dict[Cause, tuple[str, str]] = {
    Cause.COMPUTING: ("#2e7d32", "C"),
    Cause.MODEL_LOAD: ("#c62828", "M"),
    Cause.STAGING: ("#ef6c00", "S"),
    Cause.CHECKPOINT: ("#6a1b9a", "K"),
    Cause.POST_PROCESSING: ("#ad1457", "P"),
    Cause.STARTING: ("#f9a825", "T"),
    Cause.HELD_IDLE: ("#8d6e63", "H"),
    Cause.UNREPORTED: ("#78909c", "U"),
    Cause.FREE_FRAGMENTATION: ("#1565c0", "F"),
    Cause.FREE_QUOTA: ("#00838f", "Q"),
    Cause.FREE_AFFINITY: ("#4527a0", "A"),
    Cause.FREE_SCHED_LATENCY: ("#0277bd", "L"),
    Cause.FREE_HEAD_OF_LINE: ("#283593", "B"),
    Cause.FREE_NO_WORK: ("#bdbdbd", "N"),
    Cause.DRAINED: ("#616161", "D"),
}


def _hatched(c: Cause) -> bool:
    return c.value.startswith("free_")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3f}"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def text_table(doc: Mapping[str, Any]) -> str:
    """The ranked table of an attribution's :meth:`~gpufleet.diagnose.attribution.Attribution.as_dict` (or the API's
    report, the same shape)."""
    lines = [f"window {_iso(doc['start'])} .. {_iso(doc['end'])}   GPUs {doc['gpus']}   "
             f"GPU-hours {_hours(doc['gpu_seconds'])}   computing {doc['utilisation']:.1%}", ""]
    head = ("CAUSE", "GPU_HOURS", "SHARE", "LOST", "LIKELY FIX")
    body = [(r["cause"], _hours(r["gpu_seconds"]), f"{r['share']:.1%}", "yes" if r["lost"] else "no", r["fix"])
            for r in doc["causes"]]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(4)]
    for row in [head, *body]:
        lines.append("  ".join(str(v).ljust(widths[i]) for i, v in enumerate(row[:4])) + "  " + row[4])
    if doc.get("truncated"):
        lines.append("\n(truncated: more attempts touched the window than were read)")
    return "\n".join(lines)


def _defs() -> str:
    out = ["<defs>"]
    for c, (colour, _) in STYLE.items():
        if _hatched(c):
            out.append(f'<pattern id="h-{c.value}" width="6" height="6" patternUnits="userSpaceOnUse" '
                       f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{colour}"/>'
                       f'<line x1="0" y1="0" x2="0" y2="6" stroke="#ffffff" stroke-width="2"/></pattern>')
    out.append("</defs>")
    return "".join(out)


def _fill(c: Cause) -> str:
    return f"url(#h-{c.value})" if _hatched(c) else STYLE[c][0]


def chart_svg(attr: Attribution) -> str:
    """One horizontal bar per cause with GPU time, in the table's order, labelled with name, code and GPU-hours."""
    rows = attr.table()
    bar_h, label_w, bar_w = 22, 230, 420
    top = max((r.gpu_seconds for r in rows), default=0.0) or 1.0
    h = bar_h * len(rows) + 10
    parts = [f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 240}" height="{h}" '
             f'role="img" aria-label="GPU-hours by cause">']
    for i, r in enumerate(rows):
        y = 5 + i * bar_h
        w = max(1.0, bar_w * r.gpu_seconds / top)
        colour, code = STYLE[r.cause]
        parts.append(f'<text x="0" y="{y + 15}" font-size="13">[{code}] {escape(r.cause.value)}</text>')
        parts.append(f'<rect class="bar" x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h - 6}" '
                     f'fill="{_fill(r.cause)}" stroke="#333" stroke-width="0.5"><title>{escape(r.cause.value)}: '
                     f'{_hours(r.gpu_seconds)} GPU-h ({r.share:.1%})</title></rect>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{_hours(r.gpu_seconds)} GPU-h '
                     f'({r.share:.1%}){"" if r.lost else " · not lost"}</text>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(attr: Attribution, width: int = 1000) -> str:
    """One lane per GPU (grouped by node), segments coloured and coded by cause, a time axis below."""
    lane_h, label_w, gap = 16, 150, 8
    span_ms = max(1, round(attr.end * 1000) - round(attr.start * 1000))
    t0 = round(attr.start * 1000)
    plot_w = width - label_w - 10
    parts, y, last_node = [], 4, None
    for lane in attr.lanes:
        if lane.node_id != last_node and last_node is not None:
            y += gap
        last_node = lane.node_id
        parts.append(f'<text x="0" y="{y + 12}" font-size="11">{escape(lane.node_id)} ({escape(lane.pool)}) '
                     f'gpu {lane.gpu}</text>')
        for s in lane.segments:
            x = label_w + plot_w * (s.start_ms - t0) / span_ms
            w = plot_w * (s.end_ms - s.start_ms) / span_ms
            colour, code = STYLE[s.cause]
            who = f" · {escape(s.job_id)}" if s.job_id else ""
            parts.append(f'<rect class="seg" x="{x:.2f}" y="{y}" width="{max(w, 0.5):.2f}" height="{lane_h - 2}" '
                         f'fill="{_fill(s.cause)}"><title>{escape(s.cause.value)}{who}: {s.seconds:.1f} s'
                         f'</title></rect>')
            if w >= 12:
                parts.append(f'<text x="{x + w / 2:.2f}" y="{y + 11}" font-size="10" text-anchor="middle" '
                             f'fill="#ffffff" stroke="#000" stroke-width="0.3">{code}</text>')
        y += lane_h
    y += 6
    for i in range(5):
        x = label_w + plot_w * i / 4
        t = attr.start + (attr.end - attr.start) * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x:.1f}" y2="{y}" stroke="#333"/>'
                     f'<text x="{x:.1f}" y="{y + 12}" font-size="10" text-anchor="{anchor}">'
                     f'{datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")}</text>')
    height = y + 18
    return (f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="per-GPU timeline">' + "".join(parts) + "</svg>")


def _legend() -> str:
    items = []
    for c, (_, code) in STYLE.items():
        meaning, _fix = FIXES[c]
        items.append(f'<li><svg width="28" height="14" aria-hidden="true"><rect width="28" height="14" '
                     f'fill="{_fill(c)}"/></svg> <b>{code}</b> {escape(c.value)}{" (free, hatched)" if _hatched(c) else ""}'
                     f' — {escape(meaning)}</li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"


def html_page(attr: Attribution, title: str = "gpufleet diagnose") -> str:
    rows = "".join(
        f"<tr><td>[{STYLE[r.cause][1]}] {escape(r.cause.value)}</td><td>{_hours(r.gpu_seconds)}</td>"
        f"<td>{r.share:.1%}</td><td>{'yes' if r.lost else 'no'}</td><td>{escape(r.fix)}</td></tr>"
        for r in attr.table())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5rem; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
.legend {{ list-style: none; padding: 0; columns: 2; font-size: 13px; }} .legend li {{ margin: 2px 0; }}
</style></head><body>
<svg width="0" height="0" style="position:absolute" aria-hidden="true">{_defs()}</svg>
<h1>{escape(title)}</h1>
<p>Window {_iso(attr.start)} to {_iso(attr.end)}: {len(attr.lanes)} GPUs, {_hours(attr.gpu_seconds)} GPU-hours,
computing {attr.utilisation:.1%}.</p>
<h2>Where the GPU time went (lost causes ranked by GPU-hours)</h2>
{chart_svg(attr)}
<table><thead><tr><th>cause</th><th>GPU-hours</th><th>share</th><th>lost</th><th>likely fix</th></tr></thead>
<tbody>{rows}</tbody></table>
<h2>Per-GPU timeline</h2>
{timeline_svg(attr)}
<h2>Legend</h2>
{_legend()}
</body></html>
"""
