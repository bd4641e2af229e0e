"""Regenerate the tables of docs/simulate.md, "How to read the figures", from real runs.

    .venv/bin/python scripts/simulate_figures.py [--transcripts ../shared/transcripts] [--jobs 2]

Runs, offline, the commands the tables come from and prints the tables as markdown:

1. ``ctxkernel simulate --workload coding-long --profile none,all`` (what ``make demo`` shows);
2. ``ctxkernel simulate --transcripts DIR --profile none,all --window 0.5x`` and ``--window 32000``
   (the corpus of real recordings; skipped with a note when the folder is absent).

Each command's JSON is kept beside the tables (``--keep DIR``) so a figure can be traced back;
``--from DIR`` prints the tables again from JSON kept that way, without replaying anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ctxkernel.simulate.report import share_text

REPO = Path(__file__).resolve().parents[1]
_MAIN = "import sys; from ctxkernel.cli import main; sys.exit(main(sys.argv[1:]))"


def simulate(args: list[str], keep: Path | None, name: str) -> dict[str, Any]:
    command = [sys.executable, "-c", _MAIN, "simulate", *args, "--format", "json", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    if keep is not None:
        (keep / f"{name}.json").write_text(done.stdout)
    return json.loads(done.stdout)


def pct(value: float | None) -> str:
    return "-" if value is None else share_text(value)  # short of all never reads 100%


def money(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.4f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def workload_table(report: dict[str, Any]) -> str:
    rows = [
        "| profile | peak | overflows | compactions | billed input | cache read | cache write | cost $ | vs basic "
        "| recall $ | vs basic, recall priced | instructions visible (end / min) | recall cued (found / needs) "
        "| reachable |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    basic = next((p for p in report["profiles"] if p["profile"] == "basic"), {})

    def vs_basic(p: dict[str, Any], key: str) -> float | None:
        return p[key] / basic[key] if p[key] is not None and basic.get(key) else None

    for p in report["profiles"]:
        if p["status"] != "ok":  # no figures: the row says why (failures() lists it again)
            rows.append(f"| `{p['profile']}` | {p['status']}: {p['error']} |" + " |" * 12)
            continue
        compactions = ", ".join(f"{k} {v}" for k, v in p["compactions"].items()) or "0"
        cued = f"{pct(p['recall_cued'])} ({p['recall_found']} / {p['recall_needs']})"
        rows.append(
            f"| `{p['profile']}` | {p['peak_prompt_tokens']:,} | {p['overflows']} | {compactions} "
            f"| {p['billed_input_tokens']:,} | {p['cache_read_tokens']:,} | {p['cache_write_tokens']:,} "
            f"| {money(p['cost_usd'])} | {ratio(vs_basic(p, 'cost_usd'))} | {money(p['recall_cost_usd'])} "
            f"| {ratio(vs_basic(p, 'cost_with_recall_usd'))} | {pct(p['instructions_visible'])} / "
            f"{pct(p['instructions_visible_min'])} | {cued} | {pct(p['history_reachable'])} |"
        )
    return "\n".join(rows)


def corpus_table(report: dict[str, Any]) -> str:
    rows = [
        "| profile | sessions ok | overflows | cost $ (sum) | vs basic (pooled) | vs basic median / p90 "
        "| recall $ (sum) | vs basic, recall priced (pooled) "
        "| instructions min: median / p10 | recall cued: median / p10 | reachable median |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, agg in report["aggregate"].items():
        f = agg["figures"]

        def stat(key: str, which: str, fmt: Any, figures: dict[str, Any] = f, ok: int = agg["ok"]) -> str:
            figure = figures.get(key)
            if figure is None:
                return "-"
            fewer = which == "sum" and figure.get("sessions", ok) < ok  # a sum over fewer sessions says so
            return fmt(figure[which]) + (f" ({figure['sessions']:,} of {ok:,})" if fewer else "")

        rows.append(
            f"| `{name}` | {agg['ok']} | {agg['overflows']:,} | {stat('cost_usd', 'sum', money)} "
            f"| {ratio(agg.get('cost_vs_basic_pooled'))} "
            f"| {stat('cost_vs_basic', 'median', ratio)} / {stat('cost_vs_basic', 'p90', ratio)} "
            f"| {stat('recall_cost_usd', 'sum', money)} | {ratio(agg.get('cost_with_recall_vs_basic_pooled'))} "
            f"| {stat('instructions_visible_min', 'median', pct)} / {stat('instructions_visible_min', 'p10', pct)} "
            f"| {stat('recall_cued', 'median', pct)} / {stat('recall_cued', 'p10', pct)} "
            f"| {stat('history_reachable', 'median', pct)} |"
        )
    return "\n".join(rows)


def done_when_table(report: dict[str, Any]) -> str:
    """Issue 38's yardstick per profile: cost against ``basic`` (pooled), cued recall and the
    retention probes pooled over every session the profile replayed, overflows, the lowest share
    of instructions visible, and files changed visible at the end (pooled and worst session)."""
    rows = [
        "| profile | sessions ok / refused | overflows | vs basic (pooled) | vs basic, recall priced (pooled) "
        "| recall cued: pooled (found / needs) "
        "| recall cued where basic replayed too "
        "| probes visible, pooled: files changed / errors seen / commands worked | instructions min: median / worst "
        "| files changed visible: worst session |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    basic_ok = {
        i
        for i, s in enumerate(report["sessions"])
        for r in s["profiles"]
        if r["profile"] == "basic" and r["status"] == "ok"
    }
    for name, agg in report["aggregate"].items():
        f = agg["figures"]
        found = (f.get("recall_found") or {}).get("sum")
        needs = (f.get("recall_needs") or {}).get("sum")
        cued = "-" if not needs else f"{pct(found / needs)} ({found:,} / {needs:,})"
        probes = agg.get("probes") or {}
        shares = " / ".join(pct((probes.get(kind) or {}).get("visible")) for kind in PROBE_KINDS)
        rows_of = [
            row for s in report["sessions"] for row in s["profiles"] if row["profile"] == name and row["status"] == "ok"
        ]
        mins = [r["instructions_visible_min"] for r in rows_of if r["instructions_visible_min"] is not None]
        files = [
            r["probes"]["files_changed"]["visible"]
            for r in rows_of
            if (r.get("probes") or {}).get("files_changed", {}).get("count")
        ]
        shared = [
            r
            for i, s in enumerate(report["sessions"])
            if i in basic_ok
            for r in s["profiles"]
            if r["profile"] == name and r["status"] == "ok"
        ]
        shared_needs = sum(r["recall_needs"] or 0 for r in shared)
        shared_found = sum(r["recall_found"] or 0 for r in shared)
        both = "-" if not shared_needs else f"{pct(shared_found / shared_needs)} ({shared_found:,} / {shared_needs:,})"
        median = (f.get("instructions_visible_min") or {}).get("median")
        rows.append(
            f"| `{name}` | {agg['ok']} / {agg.get('refused', 0)} | {agg['overflows']:,} "
            f"| {ratio(agg.get('cost_vs_basic_pooled'))} | {ratio(agg.get('cost_with_recall_vs_basic_pooled'))} "
            f"| {cued} | {both} | {shares} "
            f"| {pct(median)} / {pct(min(mins) if mins else None)} | {pct(min(files) if files else None)} |"
        )
    return "\n".join(rows)


def format_table(report: dict[str, Any]) -> str:
    """Cost against ``basic`` per recording format (the report's ``by_format``), pooled over
    that format's sessions: without / with the recall calls priced, and the sessions replayed."""
    formats = report.get("by_format") or {}
    rows = [
        "| profile | " + " | ".join(f"{name} ({group['sessions']})" for name, group in formats.items()) + " |",
        "|---|" + "---|" * len(formats),
    ]
    for name in report["aggregate"]:
        cells = []
        for group in formats.values():
            agg = group["aggregate"][name]
            cost, with_recall = agg.get("cost_vs_basic_pooled"), agg.get("cost_with_recall_vs_basic_pooled")
            cells.append(f"{ratio(cost)} / {ratio(with_recall)} ({agg['ok']})")
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def managed_table(report: dict[str, Any]) -> str:
    """Cost against ``basic`` pooled over the sessions ``basic`` compacted (the report's
    ``managed``): those that needed managing at this window. Without / with the recall calls priced."""
    managed = report.get("managed") or {"sessions": 0, "aggregate": {}}
    rows = [
        f"| profile | vs basic over the {managed['sessions']} sessions `basic` compacted | same, recall priced |",
        "|---|---|---|",
    ]
    for name, agg in managed["aggregate"].items():
        if name != "none":
            rows.append(
                f"| `{name}` | {ratio(agg['cost_vs_basic_pooled'])} | {ratio(agg['cost_with_recall_vs_basic_pooled'])} |"
            )
    return "\n".join(rows)


def failures(report: dict[str, Any]) -> str:
    """What the tables leave out, by name: each profile that failed or was unavailable (on which
    sessions, with the error), and each session that could not be read; '' when nothing was. The
    tables pool over the sessions a profile replayed, so a failure is never dropped silently."""
    lines: list[str] = []
    if "sessions" not in report:  # one recording
        for p in report["profiles"]:
            if p["status"] in ("failed", "unavailable"):
                lines.append(f"- `{p['profile']}` {p['status']}: {p['error']}")
        return "\n".join(lines)
    for name in report["aggregate"]:
        for status in ("failed", "unavailable"):
            where = [
                (session, row)
                for session in report["sessions"]
                for row in session["profiles"]
                if row["profile"] == name and row["status"] == status
            ]
            if where:
                lines.append(f"- `{name}` {status} on {len(where)} session{'s' if len(where) > 1 else ''}:")
                lines += [f"  - {label(session)}: {row['error']}" for session, row in where]
    lines += [f"- {label(s)}: unreadable: {s['error']}" for s in report["sessions"] if s["error"]]
    return "\n".join(lines)


def label(session: dict[str, Any]) -> str:
    run = session.get("run")
    return str(session["file"]) + (f" #{run}" if run is not None else "")


def print_failures(report: dict[str, Any]) -> None:
    notes = failures(report)
    if notes:
        print("\nNot in the tables above (failed, unavailable or unreadable):\n")
        print(notes)


#: the retention probes the yardstick table shows, in its column's order
PROBE_KINDS = ("files_changed", "errors_seen", "commands_worked")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcripts", default=str(REPO.parent / "shared" / "transcripts"))
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--keep", help="a folder for each command's JSON")
    parser.add_argument("--from", dest="source", help="print the corpus tables from JSON kept with --keep")
    args = parser.parse_args()
    if args.source:
        for window in ("0.5x", "32000"):
            path = Path(args.source) / f"corpus-{window}.json"
            if path.exists():
                report = json.loads(path.read_text())
                print(f"\n`--window {window}`:\n")
                print(corpus_table(report))
                print()
                print(done_when_table(report))
                print()
                print(format_table(report))
                print()
                print(managed_table(report))
                print_failures(report)
        return 0
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    demo = simulate(["--workload", "coding-long", "--profile", "none,all"], keep, "coding-long")
    print("`ctxkernel simulate --workload coding-long --profile none,all` (priced as", demo["settings"]["model"] + "):")
    print()
    print(workload_table(demo))
    print_failures(demo)
    folder = Path(args.transcripts)
    if not folder.is_dir():
        print(f"\n(no transcripts at {folder}: the corpus tables need them)")
        return 0
    for window in ("0.5x", "32000"):
        report = simulate(
            ["--transcripts", str(folder), "--profile", "none,all", "--window", window, "--jobs", args.jobs],
            keep,
            f"corpus-{window}",
        )
        corpus = report["corpus"]
        print(
            f"\n`ctxkernel simulate --transcripts DIR --profile none,all --window {window} --jobs {args.jobs}` "
            f"({corpus['sessions']} sessions from {corpus['files']} files, {corpus['unreadable']} unreadable; "
            "each priced as its format's default model):"
        )
        print()
        print(corpus_table(report))
        print()
        print(done_when_table(report))
        print()
        print(format_table(report))
        print()
        print(managed_table(report))
        print_failures(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
