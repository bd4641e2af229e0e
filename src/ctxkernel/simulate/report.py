"""Reports of a comparison: a terminal table, stable JSON, and a self-contained HTML page.

The HTML page has no external resource (no script, font or stylesheet is fetched): an inline SVG
chart of the prompt tokens of every request for every profile on one axis, with each distinct
effective window drawn as a dashed line, then the same table as the terminal.
"""

from __future__ import annotations

import html
import math
from typing import Any

from .probes import KINDS

REPLAY_NOTE = (
    "Open-loop replay: the recorded assistant turns are replayed, not regenerated. Each profile "
    "changes what the model would have been shown, never what the recording's model answered; "
    "context-management tool calls come from the steward policy."
)

#: (heading, metric key, formatter) of the table columns
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("profile", "profile"),
    ("status", "status"),
    ("requests", "requests"),
    ("peak", "peak_prompt_tokens"),
    ("mean", "mean_prompt_tokens"),
    ("window", "effective_window"),
    ("overflows", "overflows"),
    ("compactions", "compactions"),
    ("summaries", "summary_calls"),
    ("summarizer", "summarizer"),
    ("billed in", "billed_input_tokens"),
    ("cached in", "cached_input_tokens"),
    ("cost", "cost"),
    ("violations", "invariant_violations"),
    ("instr. visible", "instructions_visible"),
    ("recoverable", "history_recoverable"),
    ("recall calls", "recall_calls"),
    ("seconds", "wall_seconds"),
)

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "compactions":
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "0"
    if key in ("instructions_visible", "history_recoverable"):
        return f"{value:.0%}"
    if key == "cost":
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = [[heading for heading, _ in _COLUMNS]]
    for metrics in report["profiles"]:
        rows.append([_cell(key, metrics.get(key)) for _, key in _COLUMNS])
    return rows


def probe_rows(report: dict[str, Any]) -> list[list[str]]:
    """The retention probes per profile: ``visible / recoverable`` per kind (``-`` without probes)."""
    rows = [["probes: visible / recoverable", *(f"{k} ({_probe_count(report, k)})" for k in KINDS)]]
    for metrics in report["profiles"]:
        kinds = metrics.get("probes") or {}
        cells = []
        for kind in KINDS:
            figures = kinds.get(kind) or {}
            if figures.get("visible") is None:
                cells.append("-")
            else:
                cells.append(f"{figures['visible']:.0%} / {figures['recoverable']:.0%}")
        rows.append([str(metrics["profile"]), *cells])
    return rows


def _probe_count(report: dict[str, Any], kind: str) -> int:
    counts = [((p.get("probes") or {}).get(kind) or {}).get("count") for p in report["profiles"]]
    return max((c for c in counts if isinstance(c, int)), default=0)


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 or n == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def render_table(report: dict[str, Any]) -> str:
    """The terminal table and the retention probes, then the replay note and any profile that could not run."""
    lines = _aligned(table_rows(report))
    lines.append("")
    lines += _aligned(probe_rows(report))
    source = report["source"]
    lines.append("")
    lines.append(f"source: {describe_source(source)}")
    for metrics in report["profiles"]:
        if metrics.get("error"):
            lines.append(f"{metrics['profile']}: {metrics['status']}: {metrics['error']}")
    lines.append(REPLAY_NOTE)
    return "\n".join(lines)


def describe_source(source: dict[str, Any]) -> str:
    if source.get("kind") == "workload":
        text = f"workload {source.get('workload')} (seed {source.get('seed')})"
    else:
        text = f"{source.get('format')} transcript {source.get('file')}"
        if source.get("run") is not None:
            text += f" run {source['run']} of {source.get('runs')}"
    text += f", {source.get('recorded_requests')} recorded requests, {source.get('tool_calls')} tool calls"
    if source.get("skipped_lines"):
        text += f", {source['skipped_lines']} malformed lines skipped (--lenient)"
    return text


def _nice_step(span: float) -> float:
    raw = span / 5 or 1
    power = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * power:
            return mult * power
    return 10 * power


def render_chart(report: dict[str, Any], *, width: int = 900, height: int = 360) -> str:
    """An inline SVG line chart: prompt tokens per request, one line per profile."""
    left, right, top, bottom = 70, 20, 20, 40
    profiles = [p for p in report["profiles"] if p.get("prompt_tokens")]
    windows = sorted({p["effective_window"] for p in profiles if p.get("effective_window")})
    longest = max((len(p["prompt_tokens"]) for p in profiles), default=1)
    top_value = max([max(p["prompt_tokens"]) for p in profiles] + windows + [1])
    step = _nice_step(top_value)
    y_max = math.ceil(top_value * 1.05 / step) * step
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (plot_w * i / max(1, longest - 1))

    def y(v: float) -> float:
        return top + plot_h - plot_h * v / y_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="prompt tokens per request">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#999"/>',
    ]
    tick = 0.0
    while tick <= y_max + 1e-9:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e4e4e4"/>')
        parts.append(
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end">{int(tick):,}</text>'
        )
        tick += step
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" font-size="12" text-anchor="middle">request</text>')
    for w in windows:
        parts.append(
            f'<line class="window" x1="{left}" x2="{left + plot_w}" y1="{y(w):.1f}" y2="{y(w):.1f}" stroke="#000" stroke-dasharray="6 4" stroke-width="1.5"/>'
            f'<text x="{left + plot_w - 4}" y="{y(w) - 5:.1f}" font-size="11" text-anchor="end">effective window {w:,}</text>'
        )
    for i, p in enumerate(profiles):
        color = _COLORS[i % len(_COLORS)]
        points = " ".join(f"{x(j):.1f},{y(v):.1f}" for j, v in enumerate(p["prompt_tokens"]))
        parts.append(
            f'<polyline class="profile" data-profile="{html.escape(p["profile"])}" fill="none" stroke="{color}" stroke-width="1.6" points="{points}"/>'
        )
        parts.append(f'<rect x="{left + 10}" y="{top + 8 + 16 * i}" width="12" height="4" fill="{color}"/>')
        parts.append(f'<text x="{left + 28}" y="{top + 13 + 16 * i}" font-size="12">{html.escape(p["profile"])}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _html_table(table_id: str, rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'


def render_html(report: dict[str, Any]) -> str:
    errors = "".join(
        f"<li>{html.escape(p['profile'])}: {html.escape(str(p['status']))}: {html.escape(str(p['error']))}</li>"
        for p in report["profiles"]
        if p.get("error")
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ctxkernel simulate</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-top: 16px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; font-size: 13px; }}
th:first-child, td:first-child {{ text-align: left; }}
.note {{ color: #555; max-width: 900px; }}
</style></head>
<body>
<h1>ctxkernel simulate</h1>
<p>{html.escape(describe_source(report["source"]))}</p>
<h2>Prompt tokens per request</h2>
{render_chart(report)}
<h2>Comparison</h2>
{_html_table("metrics", table_rows(report))}
<h2>Retention probes</h2>
<p class="note">Per kind, the share of the probes extracted from the recording still visible at the end / recoverable through the strategy's tools.</p>
{_html_table("probes", probe_rows(report))}
{"<ul>" + errors + "</ul>" if errors else ""}
<p class="note">{html.escape(REPLAY_NOTE)}</p>
</body></html>
"""
