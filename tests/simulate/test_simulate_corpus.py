"""Corpus mode: many sessions in worker processes, per-session entries and an aggregate per profile."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ctxkernel.cli import main
from ctxkernel.simulate import REPORT_KEYS, load_recording
from ctxkernel.simulate.corpus import FIGURES, aggregate, aggregate_by_format, aggregate_managed, find_files
from ctxkernel.simulate.replay import MIN_WINDOW

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROFILES = "none,basic,handoff"


def run(capsys, *args: str) -> tuple[int, dict]:
    code = main(["simulate", *args, "--format", "json", "--no-progress"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


@pytest.fixture(scope="module")
def corpus_runs() -> dict[int, dict]:
    import contextlib
    import io

    out = {}
    for jobs in (1, 2):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = main(
                ["simulate", "--transcripts", str(FIXTURES), "--profile", PROFILES, "--window", "4x"]
                + ["--jobs", str(jobs), "--format", "json", "--no-progress"]
            )
        out[jobs] = {"code": code, "report": json.loads(buffer.getvalue())}
    return out


def _sessions_expected() -> int:
    total = 0
    for path in find_files(str(FIXTURES)):
        try:
            total += load_recording(path).source.get("runs") or 1
        except Exception:  # an unreadable file is one (unreadable) session
            total += 1
    return total


def test_every_session_of_every_file_is_replayed_and_unreadable_ones_are_listed(corpus_runs):
    report = corpus_runs[1]["report"]
    assert sorted(report) == sorted(["corpus", "sessions", "aggregate", "by_format", "managed", "settings", "note"])
    assert set(REPORT_KEYS) - {"source", "profiles"} <= set(report)
    assert len(report["sessions"]) == report["corpus"]["sessions"] == _sessions_expected()
    unreadable = [s for s in report["sessions"] if s["error"]]
    assert [s["file"] for s in unreadable] == ["claude-code-malformed.jsonl"]
    assert "claude-code-malformed.jsonl:14" in unreadable[0]["error"]
    assert corpus_runs[1]["code"] == 1  # an unreadable session is a failure of the run
    runs = [s["run"] for s in report["sessions"] if s["file"] == "openhands-run.jsonl"]
    assert runs == [0, 1]
    for session in report["sessions"]:
        if not session["error"]:
            assert [p["profile"] for p in session["profiles"]] == PROFILES.split(",")


def test_parallel_workers_give_the_same_report(corpus_runs):
    one, two = corpus_runs[1]["report"], corpus_runs[2]["report"]
    assert [(s["file"], s["run"], s["error"]) for s in one["sessions"]] == [
        (s["file"], s["run"], s["error"]) for s in two["sessions"]
    ]
    for a, b in zip(one["sessions"], two["sessions"], strict=True):
        for row_a, row_b in zip(a["profiles"], b["profiles"], strict=True):
            # times come from the recording and ids from a seed: the same figures, in any worker
            row_a, row_b = dict(row_a), dict(row_b)
            row_a.pop("wall_seconds"), row_b.pop("wall_seconds")
            assert row_a == row_b


def test_window_share_follows_each_sessions_own_unmanaged_peak(corpus_runs):
    for session in corpus_runs[1]["report"]["sessions"]:
        if session["error"]:
            continue
        peak = session["profiles"][0]["peak_prompt_tokens"]  # the 'none' row: unmanaged, window-independent
        assert session["window"] == max(MIN_WINDOW, math.ceil(4 * peak))
        assert session["profiles"][0]["overflows"] == 0 or session["window"] == MIN_WINDOW


def test_aggregate_sums_medians_and_p90s_the_ok_rows(corpus_runs):
    report = corpus_runs[1]["report"]
    for name, agg in report["aggregate"].items():
        rows = [p for s in report["sessions"] for p in s["profiles"] if p["profile"] == name and p["status"] == "ok"]
        assert agg["ok"] == len(rows)
        assert agg["overflows"] == sum(r["overflows"] for r in rows)
        assert agg["invariant_violations"] == sum(r["invariant_violations"] for r in rows) == 0
        for key in FIGURES:
            values = sorted(r[key] for r in rows if r[key] is not None)
            figure = agg["figures"][key]
            if not values:
                assert figure is None
                continue
            assert figure["sum"] == pytest.approx(sum(values))
            assert values[0] <= figure["p10"] <= figure["median"] <= figure["p90"] <= values[-1]


def test_aggregate_of_known_rows():
    def row(profile: str, peak: int, status: str = "ok") -> dict:
        out = dict.fromkeys(FIGURES)
        out.update(profile=profile, status=status, peak_prompt_tokens=peak, overflows=1, invariant_violations=0)
        out.update(compactions={"summary": 2}, probes={"decisions": {"count": 2, "visible": 0.5, "recoverable": 1.0}})
        return out

    sessions = [{"profiles": [row("a", p)]} for p in (10, 20, 30, 40, 50, 60, 70, 80, 90, 100)]
    sessions.append({"profiles": [row("a", 999, status="failed")]})
    agg = aggregate(sessions, ["a"])["a"]
    assert (agg["ok"], agg["failed"], agg["overflows"]) == (10, 1, 10)
    assert agg["figures"]["peak_prompt_tokens"] == {"sum": 550, "median": 55, "p10": 10, "p90": 90, "sessions": 10}
    assert agg["compactions"] == {"summary": 20}
    assert agg["probes"]["decisions"] == {"count": 20, "visible": 0.5, "recoverable": 1.0}
    assert agg["figures"]["cost_usd"] is None and agg["cost_vs_basic_pooled"] is None
    assert agg["cost_with_recall_vs_basic_pooled"] is None


def test_cost_with_recall_is_pooled_against_basics_own_with_recall():
    def row(profile: str, cost: float, recall: float) -> dict:
        out = dict.fromkeys(FIGURES)
        out.update(profile=profile, status="ok", overflows=0, invariant_violations=0, compactions={}, probes={})
        out.update(cost_usd=cost, recall_cost_usd=recall, cost_with_recall_usd=cost + recall)
        return out

    sessions = [
        {"profiles": [row("basic", 10.0, 0.5), row("mask", 7.0, 1.5)]},
        {"profiles": [row("basic", 30.0, 0.5), row("mask", 21.0, 2.5)]},
    ]
    agg = aggregate(sessions, ["basic", "mask"])
    assert agg["mask"]["cost_vs_basic_pooled"] == 0.7
    assert agg["mask"]["cost_with_recall_vs_basic_pooled"] == round((8.5 + 23.5) / (10.5 + 30.5), 4)
    assert agg["basic"]["cost_with_recall_vs_basic_pooled"] == 1.0
    assert agg["mask"]["figures"]["recall_cost_usd"]["sum"] == 4.0
    ratios = agg["mask"]["figures"]["cost_with_recall_vs_basic"]
    assert ratios["p10"] == pytest.approx(23.5 / 30.5) and ratios["p90"] == pytest.approx(8.5 / 10.5)


def test_each_recording_format_is_aggregated_on_its_own(corpus_runs):
    report = corpus_runs[1]["report"]
    readable = [s for s in report["sessions"] if not s["error"]]
    by_format = report["by_format"]
    assert list(by_format) == list(dict.fromkeys(s["source"]["format"] for s in readable))
    assert sum(group["sessions"] for group in by_format.values()) == len(readable)
    for name, group in by_format.items():
        own = [s for s in readable if s["source"]["format"] == name]
        assert group["aggregate"] == aggregate(own, PROFILES.split(","))


def test_a_format_is_priced_against_its_own_basic():
    def session(fmt: str, basic: float, mask: float) -> dict:
        rows = []
        for profile, cost in (("basic", basic), ("mask", mask)):
            out = dict.fromkeys(FIGURES)
            out.update(profile=profile, status="ok", overflows=0, invariant_violations=0, compactions={}, probes={})
            out.update(cost_usd=cost, recall_cost_usd=0.0, cost_with_recall_usd=cost)
            rows.append(out)
        return {"error": None, "source": {"format": fmt}, "profiles": rows}

    # the chat runs are most of the bill: pooled over all, mask looks like the chat runs alone
    sessions = [session("openai-chat", 10.0, 8.0) for _ in range(9)] + [session("claude-code", 10.0, 5.0)]
    sessions.append({"error": "unreadable", "source": None, "profiles": []})
    by_format = aggregate_by_format(sessions, ["basic", "mask"])
    assert {name: group["sessions"] for name, group in by_format.items()} == {"openai-chat": 9, "claude-code": 1}
    assert by_format["openai-chat"]["aggregate"]["mask"]["cost_vs_basic_pooled"] == 0.8
    assert by_format["claude-code"]["aggregate"]["mask"]["cost_vs_basic_pooled"] == 0.5
    assert aggregate(sessions, ["basic", "mask"])["mask"]["cost_vs_basic_pooled"] == 0.77


def test_the_sessions_basic_compacted_are_aggregated_on_their_own():
    def session(basic: float, mask: float, compacted: bool) -> dict:
        rows = []
        for profile, cost in (("basic", basic), ("mask", mask)):
            out = dict.fromkeys(FIGURES)
            out.update(profile=profile, status="ok", overflows=0, invariant_violations=0, probes={})
            out.update(cost_usd=cost, recall_cost_usd=0.0, cost_with_recall_usd=cost)
            out["compactions"] = {"summary": 1} if compacted and profile == "basic" else {}
            rows.append(out)
        return {"error": None, "source": {"format": "openai-chat"}, "profiles": rows}

    # nine sessions no threshold reached (masking saves a little), one that needed managing
    sessions = [session(10.0, 9.0, False) for _ in range(9)] + [session(10.0, 5.0, True)]
    sessions.append({"error": "unreadable", "source": None, "profiles": []})
    managed = aggregate_managed(sessions, ["basic", "mask"])
    assert managed is not None and managed["sessions"] == 1
    assert managed["aggregate"] == aggregate(sessions[9:10], ["basic", "mask"])
    assert managed["aggregate"]["mask"]["cost_vs_basic_pooled"] == 0.5
    assert aggregate(sessions, ["basic", "mask"])["mask"]["cost_vs_basic_pooled"] == 0.86
    assert aggregate_managed(sessions, ["none", "mask"]) is None  # nothing says what needed managing


def test_the_table_shows_the_cost_per_format(capsys):
    code = main(
        ["simulate", "--transcripts", str(FIXTURES / "openai-runs.json"), "--profile", "basic,mask"]
        + ["--window", "32000", "--no-progress"]
    )
    out = capsys.readouterr().out
    assert code == 0
    heading = out.index("cost against basic by recording format")
    table = out[heading:].splitlines()
    assert table[1].split() == ["profile", "openai-chat", "(2)"]
    assert table[3].split()[:2] == ["basic", "1.00x"] and table[3].split()[-1] == "(2)"
    managed = out[out.index("cost against basic over the sessions basic compacted") :].splitlines()
    assert managed[1].split()[:4] == ["profile", "sessions", "basic", "compacted"]
    assert managed[3].split()[0] == "basic"


def test_a_glob_selects_files_and_bad_specs_are_usage_errors(capsys, tmp_path):
    code, report = run(capsys, "--transcripts", str(FIXTURES / "*.traj"), "--profile", "basic")
    assert code == 0
    assert [s["file"] for s in report["sessions"]] == ["swe-agent-trajectory-only.traj", "swe-agent.traj"]
    for args, message in (
        (["--transcripts", str(tmp_path / "*.nothing")], "matches no file"),
        (["--transcripts", str(tmp_path)], "the folder has no"),
        (["--transcripts", str(FIXTURES), "--run", "1"], "does not apply to --transcripts"),
        (["--workload", "chat-short", "--window", "0x"], "share of the unmanaged peak"),
        (["--workload", "chat-short", "--window", "nanx"], "share of the unmanaged peak"),
        (["--workload", "chat-short", "--window", "17x"], "at most 16x"),
        (["--workload", "chat-short", "--jobs", "0"], "--jobs"),
    ):
        assert main(["simulate", *args, "--profile", "basic", "--no-progress"]) == 2
        assert message in capsys.readouterr().err


def test_window_share_works_for_one_recording_too(capsys):
    code, report = run(capsys, "--workload", "chat-short", "--profile", "none,basic", "--window", "0.8x")
    assert code == 0
    peak = report["profiles"][0]["peak_prompt_tokens"]
    assert report["settings"]["window"] == max(MIN_WINDOW, math.ceil(0.8 * peak))
    assert report["settings"]["window_share"] == 0.8
    assert report["profiles"][0]["overflows"] > 0  # the unmanaged session no longer fits
    assert report["profiles"][1]["effective_window"] == report["profiles"][0]["effective_window"]  # one window for all


def test_corpus_html_report_draws_distributions_offline(capsys, tmp_path):
    page = tmp_path / "corpus.html"
    code = main(
        ["simulate", "--transcripts", str(FIXTURES / "*.traj"), "--profile", "none,basic", "--report", str(page)]
        + ["--no-progress"]
    )
    assert code == 0
    text = page.read_text()
    capsys.readouterr()
    from ctxkernel.simulate.report import DISTRIBUTIONS

    assert text.count('class="distribution"') == len(DISTRIBUTIONS)
    # a dot per session and profile with a value: 2 sessions x 2 profiles in the charts every row fills
    assert len(re.findall(r'<circle class="session"', text)) >= 2 * 2 * 4
    assert 'id="aggregate"' in text and 'id="sessions"' in text and 'id="probes"' in text
    assert 'id="by-format"' in text and 'id="managed"' in text
    assert "<script" not in text and "<link" not in text
    assert "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_kept_sessions_of_a_corpus_have_one_store_per_session(capsys, tmp_path):
    kept = tmp_path / "kept"
    code, report = run(
        capsys,
        "--transcripts",
        str(FIXTURES / "*.traj"),
        "--profile",
        "basic",
        "--jobs",
        "2",
        "--keep-sessions",
        str(kept),
    )
    assert code == 0
    for session in report["sessions"]:
        folder = Path(session["kept_in"])
        assert folder.parent == kept
        (ids,) = [p["session_ids"] for p in session["profiles"]]
        assert sorted(f.stem for f in (folder / "sessions").iterdir()) == sorted(ids)


def test_a_window_share_whose_unmanaged_replay_failed_says_so_in_every_row():
    # --window 0.5x is measured from the unmanaged replay's peak: when that replay fails, there is
    # no window to replay at, and every row says why (not a 256-token window that refuses them all)
    from ctxkernel import Message, ToolCallBlock
    from ctxkernel.simulate import AssistantItem, Options, Recording, ToolResultItem, UserItem, compare, run_profile

    items: list = [UserItem("run the listing")]
    for i in range(2):  # a recording built by hand that reuses a call id: the kernel refuses it
        items += [
            AssistantItem(Message.assistant("", [ToolCallBlock("dup", "bash", {"command": f"ls {i}"})])),
            ToolResultItem("dup", "out " * 400),
        ]
    recording = Recording(items, {"kind": "transcript", "format": "claude-code"})
    assert run_profile("none", recording, Options())["status"] == "failed"
    report = compare(["none", "basic"], recording, Options(window_share=0.5))
    assert report["settings"]["window"] is None and report["settings"]["window_share"] == 0.5
    for row in report["profiles"]:
        assert row["status"] == "failed", row
        assert "--window 0.5x" in row["error"] and "SurfaceError" in row["error"]


def test_the_corpus_html_report_says_why_a_replay_failed():
    # the terminal table names each failed replay's error; the HTML page must too, not only its status
    from ctxkernel.simulate.corpus import aggregate_by_format
    from ctxkernel.simulate.replay import empty_metrics
    from ctxkernel.simulate.report import render_corpus_html

    broken = empty_metrics("decay", "failed", "RuntimeError: the strategy broke", ["decay"])
    sessions = [{"file": "s1.jsonl", "path": "s1.jsonl", "run": 2, "error": None, "source": None, "profiles": [broken]}]
    report = {
        "corpus": {"transcripts": "x", "files": 1, "sessions": 1, "unreadable": 0, "jobs": 1},
        "settings": {"window_share": None},
        "sessions": sessions,
        "aggregate": aggregate(sessions, ["decay"]),
        "by_format": aggregate_by_format(sessions, ["decay"]),
        "managed": None,
    }
    page = render_corpus_html(report)
    assert "s1.jsonl #2: decay: failed: RuntimeError: the strategy broke" in page


def test_a_figure_says_how_many_sessions_it_is_over():
    # a cost is null where a request overflowed: the sum of `none`'s costs is over fewer sessions
    # than it replayed, and must say so beside basic's (not read as the cheaper of the two)
    from ctxkernel.simulate.report import aggregate_rows

    def row(profile: str, cost: float | None, overflows: int = 0) -> dict:
        out = dict.fromkeys(FIGURES)
        out.update(profile=profile, status="ok", overflows=overflows, invariant_violations=0, compactions={})
        out.update(probes={}, cost_usd=cost, cost_with_recall_usd=cost)
        return out

    sessions = [
        {"profiles": [row("basic", 4.0), row("none", 4.0)]},
        {"profiles": [row("basic", 6.0), row("none", None, overflows=3)]},
    ]
    agg = aggregate(sessions, ["basic", "none"])
    assert agg["none"]["ok"] == 2 and agg["none"]["figures"]["cost_usd"] == {
        "sum": 4,
        "median": 4,
        "p10": 4,
        "p90": 4,
        "sessions": 1,
    }
    assert agg["basic"]["figures"]["cost_usd"]["sessions"] == 2
    rows = aggregate_rows({"aggregate": agg})
    column = rows[0].index("cost $ sum")
    assert rows[1][column] == "10.0000" and rows[2][column] == "4.0000 (1 of 2)"
