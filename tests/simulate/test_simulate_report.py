"""The HTML report: self-contained, and rendered by headless Chromium into a real chart."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from ctxkernel.cli import main

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: the first profile's line colour in the chart (report._COLORS[0])
FIRST_LINE = (0x1F, 0x77, 0xB4)


def chromium() -> str | None:
    found = os.environ.get("CTXKERNEL_TEST_CHROMIUM")
    if found and Path(found).exists():
        return found
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    return None


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and unfiltered rows of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), f"unexpected PNG format depth={depth} color={color}"
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[x] = (line[x] + pred) & 0xFF
        rows.append(bytes(line) if channels == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
        previous = line
    return width, height, rows


def test_report_is_self_contained(tmp_path, capsys):
    page = tmp_path / "report.html"
    assert (
        main(["simulate", "--workload", "chat-short", "--profile", "basic", "--report", str(page), "--no-progress"])
        == 0
    )
    capsys.readouterr()
    text = page.read_text()
    assert "<svg" in text and 'class="profile"' in text and 'class="window"' in text
    assert 'id="metrics"' in text
    # the retention probes: chat-short's two decisions, both still visible with a large window
    assert 'id="probes"' in text and "decisions (2)" in text and "100% / 100%" in text
    # nothing is fetched: no scripts, links or remote URLs (the SVG namespace is an identifier)
    assert "<script" not in text and "<link" not in text
    assert "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.slow
def test_report_renders_in_headless_chromium(tmp_path, capsys):
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium: install Debian's chromium (scripts/test-services.sh does it where apt is available)")
    page = tmp_path / "report.html"
    code = main(
        [
            "simulate",
            "--workload",
            "coding-long",
            "--profile",
            "basic",
            "--window",
            "60000",
            "--report",
            str(page),
            "--no-progress",
        ]
    )
    assert code == 0
    capsys.readouterr()
    shot = tmp_path / "shot.png"
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1000,700", page.as_uri()],
        check=True,
        capture_output=True,
        timeout=120,
    )
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], check=True, capture_output=True, timeout=120, text=True
    ).stdout
    # the browser parsed the chart: one line per profile and the window line are in its DOM
    assert dom.count('class="profile"') == 1 and 'class="window"' in dom and "<table" in dom
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1000, 700)
    colours = {row[i : i + 3] for row in rows for i in range(0, len(row), 3)}
    assert len(colours) > 20, "the screenshot is (nearly) blank"
    # the profile's line was drawn: its exact colour appears in enough pixels to be a polyline
    target = bytes(FIRST_LINE)
    hits = sum(1 for row in rows for i in range(0, len(row), 3) if row[i : i + 3] == target)
    assert hits > 200, f"only {hits} pixels of the profile's line colour"


def test_the_table_says_when_no_profile_reached_pressure(capsys):
    from ctxkernel.simulate.report import NO_PRESSURE

    assert main(["simulate", "--workload", "chat-short", "--profile", "none,basic", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert NO_PRESSURE in out and "--window 0.5x" in out
    assert (
        main(["simulate", "--workload", "coding-long", "--profile", "basic", "--window", "0.5x", "--no-progress"]) == 0
    )
    assert NO_PRESSURE not in capsys.readouterr().out  # basic summarised: there was pressure


def test_columns_keep_one_precision_each():
    from ctxkernel.simulate.report import _cell

    assert [_cell("cost_usd", v) for v in (0.0132431, 12.5, None)] == ["0.0132", "12.5000", "n/a"]
    assert [_cell("cost_vs_basic", v) for v in (0.4452, 1.0)] == ["0.45x", "1.00x"]
    assert [_cell("recall_cost_usd", v) for v in (0.0, 0.00731, None)] == ["0.0000", "0.0073", "n/a"]
    assert _cell("cost_with_recall_vs_basic", 0.8049) == "0.80x"
    assert [_cell("instructions_visible_min", v) for v in (1.0, 0.75, 0.3333)] == ["100%", "75%", "33%"]
    assert [_cell("wall_seconds", v) for v in (0.361, 12.04)] == ["0.4", "12.0"]
    assert _cell("peak_prompt_tokens", 105950) == "105,950"


def test_corpus_dots_are_labelled_and_the_tails_drawn():
    from ctxkernel.simulate.report import render_distribution

    def row(profile: str, share: float, cost: float) -> dict:
        recall = 0.5 if profile == "x" else 0.0
        return {
            "profile": profile,
            "status": "ok",
            "recall_cued": share,
            "cost_usd": cost,
            "cost_with_recall_usd": cost + recall,
        }

    sessions = [
        {"file": f"s{i}.jsonl", "run": None, "profiles": [row("basic", 0.5 + i / 20, 1.0), row("x", i / 10, 2.0)]}
        for i in range(10)
    ]
    agg = {
        "basic": {"figures": {"recall_cued": {"median": 0.7, "p10": 0.5, "p90": 0.9}}},
        "x": {"figures": {"recall_cued": {"median": 0.4, "p10": 0.0, "p90": 0.8}}},
    }
    svg = render_distribution({"sessions": sessions, "aggregate": agg}, "recall_cued", "cued")
    assert "<title>s3.jsonl · x: 30%</title>" in svg  # each dot names its session on hover
    assert svg.count('class="p10"') == 2 and 'class="p90"' not in svg  # the bad tail of a share
    assert svg.count('class="tick"') >= 5 + 2  # ticks on the y axis and one per column
    assert 'width="100%"' in svg  # it scales to the page
    cost = render_distribution({"sessions": sessions, "aggregate": agg}, "cost_vs_basic", "cost")
    assert "<title>s0.jsonl · x: 2.00x</title>" in cost
    priced = render_distribution({"sessions": sessions, "aggregate": agg}, "cost_with_recall_vs_basic", "recall")
    assert "<title>s0.jsonl · x: 2.50x</title>" in priced  # (2.0 + 0.5) over basic's 1.0


def _figures_script():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "simulate_figures.py"
    spec = importlib.util.spec_from_file_location("simulate_figures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_figures_script_says_which_replays_failed():
    # the docs' tables pool over the sessions a profile replayed: a replay that failed (or a file
    # that could not be read) must be named beside them, not dropped from the pools silently
    from ctxkernel.simulate.corpus import aggregate
    from ctxkernel.simulate.replay import empty_metrics

    figures = _figures_script()
    broken = empty_metrics("decay", "failed", "RuntimeError: boom", ["decay"])
    session = {"file": "s1.jsonl", "path": "s1.jsonl", "run": 3, "error": None, "profiles": [broken]}
    unreadable = {"file": "s2.jsonl", "path": "s2.jsonl", "run": None, "error": "bad line 4", "profiles": []}
    sessions = [session, unreadable]
    report = {"sessions": sessions, "aggregate": aggregate(sessions, ["decay"])}
    notes = figures.failures(report)
    assert "`decay` failed on 1 session" in notes and "s1.jsonl #3: RuntimeError: boom" in notes
    assert "s2.jsonl: unreadable: bad line 4" in notes
    assert figures.failures({"sessions": [], "aggregate": {}}) == ""
    # one recording: a failed row is a row saying so, not a crash of the table
    table = figures.workload_table({"profiles": [broken]})
    assert "| `decay` | failed: RuntimeError: boom |" in table
    assert "`decay` failed: RuntimeError: boom" in figures.failures({"profiles": [broken]})


def test_a_share_short_of_all_or_above_none_never_reads_100_or_0_percent():
    # 997 of 1,000 messages reachable is not "100%": a rounded share must not hide the difference
    from ctxkernel.simulate.report import _cell, probe_rows, share_text

    assert [_cell("history_reachable", v) for v in (0.9966, 0.995, 1.0, 0.0, 0.004, 0.5)] == [
        ">99%",
        ">99%",
        "100%",
        "0%",
        "<1%",
        "50%",
    ]
    assert share_text(0.9949) == "99%" and share_text(0.006) == "1%"
    kinds = {"errors_seen": {"count": 300, "visible": 0.9967, "recoverable": 1.0}}
    rows = probe_rows({"profiles": [{"profile": "p", "probes": kinds}]})
    assert ">99% / 100%" in rows[1]
    figures = _figures_script()
    assert (figures.pct(0.998), figures.pct(1.0), figures.pct(None)) == (">99%", "100%", "-")


def test_the_figures_script_says_a_cost_sum_is_over_fewer_sessions():
    from ctxkernel.simulate.corpus import FIGURES, aggregate

    def row(profile: str, cost: float | None) -> dict:
        out = dict.fromkeys(FIGURES)
        out.update(profile=profile, status="ok", overflows=0 if cost else 2, invariant_violations=0)
        out.update(compactions={}, probes={}, cost_usd=cost, cost_with_recall_usd=cost, recall_cost_usd=cost and 0.0)
        return out

    sessions = [
        {"profiles": [row("basic", 4.0), row("none", 4.0)]},
        {"profiles": [row("basic", 6.0), row("none", None)]},
    ]
    table = _figures_script().corpus_table({"aggregate": aggregate(sessions, ["basic", "none"])})
    assert "| `basic` | 2 | 0 | 10.0000 | 1.00x |" in table
    assert "| `none` | 2 | 2 | 4.0000 (1 of 2) | 1.00x |" in table
