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

#: each cost figure and its ratio to the ``basic`` row's, computed from the rows (in corpus mode
#: per session, and ``<ratio>_pooled`` over the sums)
COST_RATIOS: dict[str, str] = {
    "cost_usd": "cost_vs_basic",
    "cost_with_recall_usd": "cost_with_recall_vs_basic",
}
#: figures in US dollars
MONEY = frozenset({"cost_usd", "recall_cost_usd", "cost_with_recall_usd"})
#: (heading, metric key) of the table columns; the cost ratios are computed from the rows
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
    ("billed in", "billed_input_tokens"),
    ("cache read", "cache_read_tokens"),
    ("cache write", "cache_write_tokens"),
    ("cost $", "cost_usd"),
    ("vs basic", "cost_vs_basic"),
    ("recall $", "recall_cost_usd"),
    ("+recall vs basic", "cost_with_recall_vs_basic"),
    ("violations", "invariant_violations"),
    ("instr. visible", "instructions_visible"),
    ("instr. min", "instructions_visible_min"),
    ("recall cued", "recall_cued"),
    ("reachable", "history_reachable"),
    ("recall calls", "recall_calls"),
    ("seconds", "wall_seconds"),
)
#: shares shown as whole percentages
SHARES = frozenset(
    {
        "instructions_visible",
        "instructions_visible_min",
        "instructions_visible_mean",
        "history_reachable",
        "history_reachable_declared",
        "recall_cued",
    }
)

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def share_text(value: float) -> str:
    """A share as a whole percentage; one short of all (or above none) never reads ``100%`` (or
    ``0%``): 997 of 1,000 reads ``>99%``, 3 of 1,000 ``<1%``."""
    text = f"{value:.0%}"
    if text == "100%" and value < 1:
        return ">99%"
    if text == "0%" and value > 0:
        return "<1%"
    return text


def _cell(key: str, value: Any) -> str:
    """One figure as the tables show it: counts with thousands separators, shares as whole
    percentages (:func:`share_text`), money to four decimals, ratios to two, seconds to one."""
    if key in MONEY and value is None:
        return "n/a"
    if value is None:
        return "-"
    if key == "compactions":
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "0"
    if key in SHARES:
        return share_text(value)
    if key in MONEY:
        return f"{value:,.4f}"
    if key in COST_RATIOS.values():
        return f"{value:.2f}x"
    if key == "wall_seconds":
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def with_cost_ratio(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The profile rows, each with ``cost_vs_basic``: its cost over the ``basic`` row's, and
    ``cost_with_recall_vs_basic``: the same with the recall calls priced on both sides (None when
    either has no cost)."""
    basic: dict[str, Any] = next((p for p in report["profiles"] if p["profile"] == "basic"), {})
    rows = []
    for metrics in report["profiles"]:
        row = dict(metrics)
        for key, ratio in COST_RATIOS.items():
            cost, of_basic = metrics.get(key), basic.get(key)
            row[ratio] = round(cost / of_basic, 4) if cost is not None and of_basic else None
        rows.append(row)
    return rows


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = [[heading for heading, _ in _COLUMNS]]
    for metrics in with_cost_ratio(report):
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
                cells.append(f"{share_text(figures['visible'])} / {share_text(figures['recoverable'])}")
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
    lines.append(f"priced as: {describe_prices(report['settings'])}")
    missing = describe_accounting(source.get("accounting"))
    if missing:
        lines.append(missing)
    if no_pressure(report["profiles"]):
        lines.append(NO_PRESSURE)
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


NO_PRESSURE = (
    "no profile reached pressure (no compaction, no overflow): the window is larger than this session needs, "
    "so the profiles differ only by their fixed overhead; try --window 0.5x (half of its unmanaged peak)"
)


def no_pressure(profiles: list[dict[str, Any]]) -> bool:
    """No profile that ran compacted, continued, took a steward step or overflowed."""
    ran = [p for p in profiles if p.get("status") == "ok"]
    return bool(ran) and not any(
        sum((p.get("compactions") or {}).values()) or p.get("overflows") or p.get("steward_requests") for p in ran
    )


def describe_prices(settings: dict[str, Any]) -> str:
    price = settings.get("prices")
    if not price:
        return "each session's format default model"
    text = (
        f"{price['model']} (${price['input']:g} in, ${price['cache_read']:g} cache read, "
        f"${price['cache_write']:g} cache write, ${price['output']:g} out per million tokens; "
        f"cache TTL {price['cache_ttl_seconds']:g} s; price table {settings.get('price_table')})"
    )
    return text + (", --prices given" if settings.get("prices_given") else "")


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
    power: float = 10 ** math.floor(math.log10(raw))
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
        at: float = top + plot_h - plot_h * v / y_max
        return at

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
    return f'<div class="wide"><table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table></div>'


def render_html(report: dict[str, Any]) -> str:
    errors = "".join(
        f"<li>{html.escape(p['profile'])}: {html.escape(str(p['status']))}: {html.escape(str(p['error']))}</li>"
        for p in report["profiles"]
        if p.get("error")
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>ctxkernel simulate</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-top: 16px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; font-size: 13px; }}
th:first-child, td:first-child {{ text-align: left; }}
.note {{ color: #555; max-width: 900px; }}
.wide {{ overflow-x: auto; max-width: 100%; }}
svg {{ display: block; max-width: 900px; height: auto; }}
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
    ("cost $", "cost_usd"),
    ("vs basic", "cost_vs_basic"),
    ("recall $", "recall_cost_usd"),
    ("+recall vs basic", "cost_with_recall_vs_basic"),
    ("violations", "invariant_violations"),
    ("instr. min", "instructions_visible_min"),
    ("recall cued", "recall_cued"),
    ("reachable", "history_reachable"),
)
#: (heading, figure, statistic) of the aggregate rows
_AGGREGATE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("peak median", "peak_prompt_tokens", "median"),
    ("peak p90", "peak_prompt_tokens", "p90"),
    ("billed in sum", "billed_input_tokens", "sum"),
    ("cost $ sum", "cost_usd", "sum"),
    ("vs basic median", "cost_vs_basic", "median"),
    ("recall $ sum", "recall_cost_usd", "sum"),
    ("+recall vs basic median", "cost_with_recall_vs_basic", "median"),
    ("summaries sum", "summary_calls", "sum"),
    ("instr. min median", "instructions_visible_min", "median"),
    ("instr. min p10", "instructions_visible_min", "p10"),
    ("recall cued median", "recall_cued", "median"),
    ("recall cued p10", "recall_cued", "p10"),
    ("reachable median", "history_reachable", "median"),
    ("recall calls sum", "recall_calls", "sum"),
)
#: what the per-format table shows (``format_rows``)
FORMAT_HEADING = (
    "cost against basic by recording format, pooled over its sessions: without / with the recall calls "
    "priced (sessions the profile replayed)"
)
#: what the table of the sessions basic compacted shows (``managed_rows``)
MANAGED_HEADING = (
    "cost against basic over the sessions basic compacted, those that needed managing at this window: "
    "without / with the recall calls priced (sessions the profile replayed)"
)
#: the figures drawn as distributions in the corpus HTML report
DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    ("peak_prompt_tokens", "Peak prompt tokens per session"),
    ("cost_vs_basic", "Cost against basic per session (with the prompt cache)"),
    ("cost_with_recall_vs_basic", "Cost against basic per session, the recall calls priced on both sides"),
    ("instructions_visible_min", "Lowest share of instructions visible at any request"),
    ("recall_cued", "Share of recall needs found through the strategy's tools (cued)"),
    ("history_reachable", "Share of history reachable (exhaustive fetch)"),
)


def session_label(session: dict[str, Any]) -> str:
    file: str = session["file"]
    return file + (f" #{session['run']}" if session.get("run") is not None else "")


def session_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = [["session", *(h for h, _ in _SESSION_COLUMNS)]]
    for session in report["sessions"]:
        label = session_label(session)
        if session["error"]:
            rows.append([label, "", "unreadable", *([""] * (len(_SESSION_COLUMNS) - 2))])
        for metrics in with_cost_ratio(session) if session["profiles"] else []:
            rows.append([label, *(_cell(key, metrics.get(key)) for _, key in _SESSION_COLUMNS)])
    return rows


def aggregate_rows(report: dict[str, Any]) -> list[list[str]]:
    # refused sessions (a header or a message the window cannot hold) are counted beside ok and failed
    rows = [["profile", "ok", "refused", "failed", "overflows", "violations", *(h for h, _, _ in _AGGREGATE_COLUMNS)]]
    for name, agg in report["aggregate"].items():
        cells = [
            name,
            f"{agg['ok']:,}",
            f"{agg['refused']:,}",
            f"{agg['failed']:,}",
            f"{agg['overflows']:,}",
            f"{agg['invariant_violations']:,}",
        ]
        for _, key, stat in _AGGREGATE_COLUMNS:
            figure = agg["figures"].get(key)
            cell = "-" if figure is None else _cell(key, figure[stat])
            if figure is not None and figure.get("sessions", agg["ok"]) < agg["ok"]:
                cell += f" ({figure['sessions']:,} of {agg['ok']:,})"  # the others have no value
            cells.append(cell)
        rows.append(cells)
    return rows


def format_rows(report: dict[str, Any]) -> list[list[str]]:
    """Per profile and recording format: the cost against ``basic`` pooled over that format's
    sessions, without and with the recall calls priced, and the sessions the profile replayed."""
    formats = report.get("by_format") or {}
    rows = [["profile", *(f"{name} ({group['sessions']:,})" for name, group in formats.items())]]
    for profile in report["aggregate"]:
        cells = [profile]
        for group in formats.values():
            cells.append(_pooled_cell(group["aggregate"][profile]))
        rows.append(cells)
    return rows


def _pooled_cell(agg: dict[str, Any]) -> str:
    """A profile's cost against ``basic``, pooled, without / with the recall calls priced, and
    the sessions it replayed."""
    cost = _cell("cost_vs_basic", agg["cost_vs_basic_pooled"])
    with_recall = _cell("cost_with_recall_vs_basic", agg["cost_with_recall_vs_basic_pooled"])
    return f"{cost} / {with_recall} ({agg['ok']:,})"


def managed_rows(report: dict[str, Any]) -> list[list[str]]:
    """Per profile: the cost against ``basic`` pooled over the sessions ``basic`` compacted
    (the report's ``managed``), without and with the recall calls priced; empty without it."""
    managed = report.get("managed")
    if not managed:
        return []
    rows = [["profile", f"sessions basic compacted ({managed['sessions']:,})"]]
    rows += [[profile, _pooled_cell(agg)] for profile, agg in managed["aggregate"].items()]
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
    lines += ["", FORMAT_HEADING + ":"]
    lines += _aligned(format_rows(report))
    if managed_rows(report):
        lines += ["", MANAGED_HEADING + ":"]
        lines += _aligned(managed_rows(report))
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


def distribution_values(report: dict[str, Any], key: str) -> dict[str, list[tuple[str, float]]]:
    """Per profile, ``(session label, value)`` of every session it replayed with a value;
    the cost ratios are each session's cost over its own ``basic`` row's."""
    out: dict[str, list[tuple[str, float]]] = {name: [] for name in report["aggregate"]}
    for session in report["sessions"]:
        rows = with_cost_ratio(session) if session["profiles"] else []
        for row in rows:
            value = row.get(key)
            if row["status"] == "ok" and isinstance(value, int | float) and row["profile"] in out:
                out[row["profile"]].append((session_label(session), float(value)))
    return out


def render_distribution(report: dict[str, Any], key: str, title: str, *, width: int = 900, height: int = 280) -> str:
    """An inline SVG strip chart: one column per profile, a dot per session (its name and value on
    hover), the median as a solid bar, and the bad tail as a dashed one: the p10 of a share (what
    the worst sessions kept), the p90 of anything else (what the worst sessions cost)."""
    left, right, top, bottom = 76, 20, 30, 40
    names = list(report["aggregate"])
    values = distribution_values(report, key)
    share = key in SHARES
    found = [v for vs in values.values() for _, v in vs]
    top_value = 1.0 if share else max([*found, 1e-9])
    step = 0.25 if share else _nice_step(top_value)
    y_max = 1.0 if share else math.ceil(top_value * 1.05 / step) * step
    plot_w, plot_h = width - left - right, height - top - bottom
    column = plot_w / max(1, len(names))
    tail = "p10" if share else "p90"

    def y(v: float) -> float:
        at: float = top + plot_h - plot_h * v / y_max
        return at

    def label(v: float) -> str:
        if share:
            return share_text(v)
        if key in COST_RATIOS.values():
            return f"{v:.2f}x"
        return f"{v:,.0f}" if step >= 1 else f"{v:,.2f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="distribution" data-figure="{key}" viewBox="0 0 {width} {height}" '
        f'width="100%" preserveAspectRatio="xMinYMin meet" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="18" font-size="13">{html.escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#999"/>',
    ]
    tick = 0.0
    while tick <= y_max + 1e-9:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e4e4e4"/>')
        parts.append(
            f'<line class="tick" x1="{left - 5}" x2="{left}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#555"/>'
        )
        parts.append(
            f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end">{label(tick)}</text>'
        )
        tick += step
    for i, name in enumerate(names):
        color = _COLORS[i % len(_COLORS)]
        center = left + column * (i + 0.5)
        parts.append(
            f'<line class="tick" x1="{center:.1f}" x2="{center:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 5}" stroke="#555"/>'
        )
        for j, (session, v) in enumerate(values[name]):
            jitter = ((j * 37) % 21 - 10) / 10 * min(column * 0.3, 40)  # deterministic spread
            parts.append(
                f'<circle class="session" cx="{center + jitter:.1f}" cy="{y(v):.1f}" r="3" fill="{color}" '
                f'fill-opacity="0.6"><title>{html.escape(session)} · {html.escape(name)}: {label(v)}</title></circle>'
            )
        figure = report["aggregate"][name]["figures"].get(key)
        if figure is not None:
            half = min(column * 0.4, 60)
            parts.append(
                f'<line class="median" x1="{center - half:.1f}" x2="{center + half:.1f}" y1="{y(figure["median"]):.1f}" '
                f'y2="{y(figure["median"]):.1f}" stroke="#000" stroke-width="2"><title>{html.escape(name)} median: '
                f"{label(figure['median'])}</title></line>"
                f'<line class="{tail}" x1="{center - half:.1f}" x2="{center + half:.1f}" y1="{y(figure[tail]):.1f}" '
                f'y2="{y(figure[tail]):.1f}" stroke="#000" stroke-dasharray="4 3"><title>{html.escape(name)} {tail}: '
                f"{label(figure[tail])}</title></line>"
            )
        parts.append(
            f'<text x="{center:.1f}" y="{height - 16}" font-size="12" text-anchor="middle">{html.escape(name)} ({len(values[name])})</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render_corpus_html(report: dict[str, Any]) -> str:
    charts = "\n".join(render_distribution(report, key, title) for key, title in DISTRIBUTIONS)
    # as the terminal table: each unreadable session, and each replay that did not run, with why
    errors = "".join(
        f"<li>{html.escape(session_label(s))}: unreadable: {html.escape(str(s['error']))}</li>"
        if s["error"]
        else "".join(
            f"<li>{html.escape(session_label(s))}: {html.escape(str(m['profile']))}: "
            f"{html.escape(str(m['status']))}: {html.escape(str(m['error']))}</li>"
            for m in s["profiles"]
            if m.get("error")
        )
        for s in report["sessions"]
    )
    managed = ""
    if managed_rows(report):
        managed = (
            "<h2>Cost against basic where managing was needed</h2>\n"
            f'<p class="note">{html.escape(MANAGED_HEADING)}.</p>\n{_html_table("managed", managed_rows(report))}'
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>ctxkernel simulate: corpus</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-top: 16px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; font-size: 13px; }}
th:first-child, td:first-child {{ text-align: left; }}
.note {{ color: #555; max-width: 900px; }}
.wide {{ overflow-x: auto; max-width: 100%; }}
svg {{ display: block; max-width: 900px; height: auto; }}
</style></head>
<body>
<h1>ctxkernel simulate: corpus</h1>
<p>{html.escape(describe_corpus(report))}</p>
<h2>Distributions</h2>
<p class="note">One dot per session (hover for its name and value); the solid bar is the median, the dashed one the bad tail: the p10 of a share (what the worst tenth of the sessions kept), the p90 of anything else.</p>
{charts}
<h2>Aggregate per profile</h2>
{_html_table("aggregate", aggregate_rows(report))}
<h2>Cost against basic by recording format</h2>
<p class="note">{html.escape(FORMAT_HEADING)}.</p>
{_html_table("by-format", format_rows(report))}
{managed}
<h2>Retention probes (pooled)</h2>
{_html_table("probes", aggregate_probe_rows(report))}
<h2>Sessions</h2>
{_html_table("sessions", session_rows(report))}
{"<ul>" + errors + "</ul>" if errors else ""}
<p class="note">{html.escape(REPLAY_NOTE)}</p>
</body></html>
"""
