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
    missing = describe_accounting(source.get("accounting"))
    if missing:
        lines.append(missing)
    for metrics in report["profiles"]:
        if metrics.get("error"):
            lines.append(f"{metrics['profile']}: {metrics['status']}: {metrics['error']}")
    lines.append(REPLAY_NOTE)
    return "\n".join(lines)


_KEY_WORDS = {
    "tool_calls": ("tool call", "tool calls"),
    "tool_results": ("tool result", "tool results"),
    "user_messages": ("user message", "user messages"),
    "assistant_messages": ("assistant message", "assistant messages"),
    "sidechain_calls": ("sidechain call", "sidechain calls"),
}


def describe_accounting(accounting: dict[str, Any] | None) -> str | None:
    """One line naming what the recording holds and the replay left out, by reason; None when
    everything was replayed."""
    if not accounting or accounting.get("complete"):
        return None
    parts = []
    for key, (one, many) in _KEY_WORDS.items():
        missing = accounting["raw"][key] - accounting["replayed"][key]
        if missing:
            why = ", ".join(
                f"{reason} {of[key]:,}"
                if len([r for r in accounting["reasons"].values() if r.get(key)]) > 1
                else reason
                for reason, of in accounting["reasons"].items()
                if of.get(key)
            )
            parts.append(f"{missing:,} {one if missing == 1 else many} ({why})")
    return "not replayed: " + "; ".join(parts) + " (see source.accounting; --strict refuses such a recording)"


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


# -- corpus mode ------------------------------------------------------------------------------------------
#: (heading, metric key) of the per-session rows of a corpus
_SESSION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("profile", "profile"),
    ("status", "status"),
    ("window", "effective_window"),
    ("peak", "peak_prompt_tokens"),
    ("overflows", "overflows"),
    ("compactions", "compactions"),
    ("billed in", "billed_input_tokens"),
    ("cost", "cost"),
    ("violations", "invariant_violations"),
    ("instr. visible", "instructions_visible"),
    ("recoverable", "history_recoverable"),
)
#: (heading, figure, statistic) of the aggregate rows
_AGGREGATE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("peak median", "peak_prompt_tokens", "median"),
    ("peak p90", "peak_prompt_tokens", "p90"),
    ("billed in sum", "billed_input_tokens", "sum"),
    ("billed in p90", "billed_input_tokens", "p90"),
    ("cost sum", "cost", "sum"),
    ("summaries sum", "summary_calls", "sum"),
    ("instr. visible median", "instructions_visible", "median"),
    ("recoverable median", "history_recoverable", "median"),
    ("recoverable p90", "history_recoverable", "p90"),
    ("recall calls sum", "recall_calls", "sum"),
)
#: the figures drawn as distributions in the corpus HTML report
DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    ("peak_prompt_tokens", "Peak prompt tokens per session"),
    ("billed_input_tokens", "Billed input tokens per session"),
    ("instructions_visible", "Share of instructions visible at the end"),
    ("history_recoverable", "Share of history recoverable (measured)"),
)


def session_label(session: dict[str, Any]) -> str:
    return session["file"] + (f" #{session['run']}" if session.get("run") is not None else "")


def session_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = [["session", *(h for h, _ in _SESSION_COLUMNS)]]
    for session in report["sessions"]:
        label = session_label(session)
        if session["error"]:
            rows.append([label, "", "unreadable", *([""] * (len(_SESSION_COLUMNS) - 2))])
        for metrics in session["profiles"]:
            rows.append([label, *(_cell(key, metrics.get(key)) for _, key in _SESSION_COLUMNS)])
    return rows


def aggregate_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = [["profile", "ok", "failed", "overflows", "violations", *(h for h, _, _ in _AGGREGATE_COLUMNS)]]
    for name, agg in report["aggregate"].items():
        cells = [
            name,
            f"{agg['ok']:,}",
            f"{agg['failed']:,}",
            f"{agg['overflows']:,}",
            f"{agg['invariant_violations']:,}",
        ]
        for _, key, stat in _AGGREGATE_COLUMNS:
            figure = agg["figures"].get(key)
            cells.append("-" if figure is None else _cell(key, figure[stat]))
        rows.append(cells)
    return rows


def aggregate_probe_rows(report: dict[str, Any]) -> list[list[str]]:
    return probe_rows({"profiles": [{"profile": n, "probes": a["probes"]} for n, a in report["aggregate"].items()]})


def describe_corpus(report: dict[str, Any]) -> str:
    c = report["corpus"]
    window = report["settings"].get("window_share")
    text = f"corpus {c['transcripts']}: {c['sessions']} sessions from {c['files']} files, {c['jobs']} worker(s)"
    if window:
        text += f", each session's window {window:g}x its unmanaged peak"
    if c["unreadable"]:
        text += f", {c['unreadable']} unreadable"
    return text


def render_corpus_table(report: dict[str, Any]) -> str:
    """Per-session rows, the aggregate per profile, the pooled probes, then errors and the note."""
    lines = _aligned(session_rows(report))
    lines += ["", "aggregate over the sessions each profile replayed:"]
    lines += _aligned(aggregate_rows(report))
    lines.append("")
    lines += _aligned(aggregate_probe_rows(report))
    lines += ["", describe_corpus(report)]
    for session in report["sessions"]:
        if session["error"]:
            lines.append(f"{session_label(session)}: unreadable: {session['error']}")
        for metrics in session["profiles"]:
            if metrics.get("error"):
                lines.append(f"{session_label(session)}: {metrics['profile']}: {metrics['status']}: {metrics['error']}")
    lines.append(REPLAY_NOTE)
    return "\n".join(lines)


def render_distribution(report: dict[str, Any], key: str, title: str, *, width: int = 900, height: int = 260) -> str:
    """An inline SVG strip chart: one column per profile, a dot per session, the median as a solid
    bar and the p90 as a dashed one."""
    left, right, top, bottom = 70, 20, 28, 36
    names = list(report["aggregate"])
    values = {
        n: [p[key] for s in report["sessions"] for p in s["profiles"] if p["profile"] == n and p["status"] == "ok"]
        for n in names
    }
    share = key in ("instructions_visible", "history_recoverable")
    top_value = 1.0 if share else max([v for vs in values.values() for v in vs if v is not None] + [1])
    step = 0.25 if share else _nice_step(top_value)
    y_max = 1.0 if share else math.ceil(top_value * 1.05 / step) * step
    plot_w, plot_h = width - left - right, height - top - bottom
    column = plot_w / max(1, len(names))

    def y(v: float) -> float:
        return top + plot_h - plot_h * v / y_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="distribution" data-figure="{key}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="16" font-size="13">{html.escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#999"/>',
    ]
    tick = 0.0
    while tick <= y_max + 1e-9:
        label = f"{tick:.0%}" if share else f"{int(tick):,}"
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end">{label}</text>')
        tick += step
    for i, name in enumerate(names):
        color = _COLORS[i % len(_COLORS)]
        center = left + column * (i + 0.5)
        vs = [v for v in values[name] if v is not None]
        for j, v in enumerate(vs):
            jitter = ((j * 37) % 21 - 10) / 10 * min(column * 0.3, 40)  # deterministic spread
            parts.append(
                f'<circle class="session" cx="{center + jitter:.1f}" cy="{y(v):.1f}" r="2.5" fill="{color}" fill-opacity="0.6"/>'
            )
        figure = report["aggregate"][name]["figures"].get(key)
        if figure is not None:
            half = min(column * 0.4, 60)
            parts.append(
                f'<line class="median" x1="{center - half:.1f}" x2="{center + half:.1f}" y1="{y(figure["median"]):.1f}" y2="{y(figure["median"]):.1f}" stroke="#000" stroke-width="2"/>'
                f'<line class="p90" x1="{center - half:.1f}" x2="{center + half:.1f}" y1="{y(figure["p90"]):.1f}" y2="{y(figure["p90"]):.1f}" stroke="#000" stroke-dasharray="4 3"/>'
            )
        parts.append(
            f'<text x="{center:.1f}" y="{height - 14}" font-size="12" text-anchor="middle">{html.escape(name)} ({len(vs)})</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render_corpus_html(report: dict[str, Any]) -> str:
    charts = "\n".join(render_distribution(report, key, title) for key, title in DISTRIBUTIONS)
    errors = "".join(
        f"<li>{html.escape(session_label(s))}: unreadable: {html.escape(str(s['error']))}</li>"
        for s in report["sessions"]
        if s["error"]
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ctxkernel simulate: corpus</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-top: 16px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; font-size: 13px; }}
th:first-child, td:first-child {{ text-align: left; }}
.note {{ color: #555; max-width: 900px; }}
</style></head>
<body>
<h1>ctxkernel simulate: corpus</h1>
<p>{html.escape(describe_corpus(report))}</p>
<h2>Distributions</h2>
<p class="note">One dot per session; the solid bar is the median, the dashed one the p90.</p>
{charts}
<h2>Aggregate per profile</h2>
{_html_table("aggregate", aggregate_rows(report))}
<h2>Retention probes (pooled)</h2>
{_html_table("probes", aggregate_probe_rows(report))}
<h2>Sessions</h2>
{_html_table("sessions", session_rows(report))}
{"<ul>" + errors + "</ul>" if errors else ""}
<p class="note">{html.escape(REPLAY_NOTE)}</p>
</body></html>
"""
