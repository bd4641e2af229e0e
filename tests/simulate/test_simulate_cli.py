"""The `ctxkernel simulate` command: output formats, pinned JSON keys, errors, docs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ctxkernel.cli import COMMAND_MODULES, main
from ctxkernel.simulate import METRIC_KEYS, REPORT_KEYS, build_workload

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "simulate" / "fixtures"

#: the JSON contract; changing it is a breaking change for anyone who parses the report
PINNED_METRIC_KEYS = [
    "profile",
    "strategies",
    "status",
    "error",
    "requests",
    "recorded_requests",
    "steward_requests",
    "peak_prompt_tokens",
    "mean_prompt_tokens",
    "effective_window",
    "header_tokens",
    "overflows",
    "overflow_retries",
    "compactions",
    "compaction_failures",
    "summary_calls",
    "summary_input_tokens",
    "summary_output_tokens",
    "summarizer",
    "billed_input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "cost_usd",
    "recall_cost_usd",
    "cost_with_recall_usd",
    "invariant_violations",
    "invariant_details",
    "instructions_visible",
    "instructions_visible_min",
    "instructions_visible_mean",
    "recall_needs",
    "recall_found",
    "recall_cued",
    "recall_method",
    "recall_tools",
    "recall_calls",
    "recall_tokens",
    "history_reachable",
    "history_reachable_declared",
    "history_reachable_method",
    "history_reachable_calls",
    "history_reachable_tokens",
    "history_reachable_probed",
    "probes",
    "synthetic_results",
    "sessions",
    "session_ids",
    "steward_errors",
    "prompt_tokens",
    "wall_seconds",
]
PINNED_SOURCE_KEYS = [
    "kind",
    "format",
    "file",
    "run",
    "runs",
    "workload",
    "seed",
    "system_prompt_chars",
    "recorded_requests",
    "user_messages",
    "tool_calls",
    "tool_results",
    "markers",
    "recorded_peak_input_tokens",
    "skipped_lines",
    "accounting",
]
PINNED_SETTINGS_KEYS = [
    "model",
    "price_table",
    "prices",
    "prices_given",
    "steward",
    "summarizer",
    "window",
    "window_share",
]


def run_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["simulate", *args, "--format", "json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def test_simulate_is_registered_through_command_modules():
    assert "ctxkernel.simulate.cli" in COMMAND_MODULES


def test_json_keys_are_pinned(capsys, tmp_path):
    ghost = tmp_path / "ghost.toml"
    ghost.write_text('[profile]\nstrategies = ["not-installed"]\n')
    code, report = run_json(capsys, "--workload", "chat-short", "--profile", f"basic,{ghost}")
    assert code == 0
    assert sorted(report) == sorted(REPORT_KEYS)
    assert list(METRIC_KEYS) == PINNED_METRIC_KEYS
    for profile in report["profiles"]:
        assert sorted(profile) == sorted(PINNED_METRIC_KEYS)  # identical keys, available or not
    assert [p["status"] for p in report["profiles"]] == ["ok", "unavailable"]
    assert sorted(report["source"]) == sorted(PINNED_SOURCE_KEYS)
    assert sorted(report["settings"]) == PINNED_SETTINGS_KEYS
    assert "replayed, not regenerated" in report["note"]


def test_source_keys_are_the_same_for_transcripts(capsys):
    code, report = run_json(
        capsys, "--transcript", str(FIXTURES / "openai-runs.json"), "--run", "1", "--profile", "basic"
    )
    assert code == 0
    assert sorted(report["source"]) == sorted(PINNED_SOURCE_KEYS)
    assert report["source"]["run"] == 1 and report["source"]["format"] == "openai-chat"


def test_table_names_every_profile_and_says_it_is_a_replay(capsys):
    assert main(["simulate", "--workload", "chat-short", "--profile", "basic", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^basic\s+ok\s+8\b", out, re.MULTILINE)
    assert "replayed, not regenerated" in out


def test_window_and_prices_flags(capsys):
    code, report = run_json(
        capsys, "--workload", "coding-long", "--profile", "basic", "--window", "50000", "--prices", "2,0.5,8"
    )
    basic = report["profiles"][0]
    assert code == 0
    assert basic["effective_window"] == 50_000 - 8_192
    assert basic["peak_prompt_tokens"] <= basic["effective_window"]
    assert basic["cost_usd"] > 0
    assert report["settings"]["prices_given"] == {"input": 2.0, "cached_input": 0.5, "output": 8.0}
    price = report["settings"]["prices"]
    # --prices keeps the model's cache rules: a write keeps its ratio to the input price
    assert (price["input"], price["cache_read"], price["output"], price["cache_write"]) == (2.0, 0.5, 8.0, 2.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--transcript", str(FIXTURES / "claude-code-malformed.jsonl")],
            "claude-code-malformed.jsonl:14: expected one JSON object per line",
        ),
        (["--workload", "chat-short", "--prices", "1,2"], "expected three non-negative numbers"),
        (["--workload", "chat-short", "--steward", "nomodule"], "expected 'default', 'none' or 'module:function'"),
        (["--workload", "chat-short", "--summarizer", "gpt"], "expected 'stand-in', 'extractive'"),
        (["--workload", "chat-short", "--model", "gpt-99"], "no price for model 'gpt-99'"),
        # another model of the family is not a dated release of the one it starts with
        (["--workload", "chat-short", "--model", "gpt-5-nano"], "no price for model 'gpt-5-nano'"),
        (["--workload", "chat-short", "--run", "1"], "does not apply to --workload"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_problem(capsys, args, message):
    assert main(["simulate", *args, "--profile", "basic", "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_keep_sessions_keeps_every_replayed_session_for_inspect(capsys, tmp_path, monkeypatch):
    kept = tmp_path / "kept"
    code, report = run_json(
        capsys,
        "--workload",
        "chat-short",
        "--profile",
        "none,basic,handoff",
        "--window",
        "6000",  # handoff's header (~2,700 tokens) leaves room from here on; at less it is refused
        "--keep-sessions",
        str(kept),
    )
    assert code == 0
    ids = [p["session_ids"] for p in report["profiles"]]
    assert all(len(i) == p["sessions"] for i, p in zip(ids, report["profiles"], strict=True))
    logs = (kept / "sessions").glob("*.jsonl")  # beside each log may lie its snapshot
    assert sorted(f.stem for f in logs) == sorted(i for row in ids for i in row)
    monkeypatch.setenv("CTXKERNEL_HOME", str(kept))
    monkeypatch.chdir(tmp_path)
    for row, profile in zip(report["profiles"], ("basic", "basic", "handoff"), strict=True):
        (session_id,) = row["session_ids"]
        assert main(["inspect", session_id, "--json"]) == 0
        view = json.loads(capsys.readouterr().out)
        assert view["session"] == session_id
        assert view["profile"] == profile  # opened with the profile it was replayed with
        assert view["turn"] == report["source"]["user_messages"]
        assert len(view["compactions"]) == sum(row["compactions"].values())
        # the window the session ran at, not the profile's (before: 119,808 for a 700-token run)
        assert view["pressure"]["effective_window"] == row["effective_window"] < 6000
        # labelled with its profile and what was replayed; none as the unmanaged baseline
        assert view["origin"].startswith(f"ctxkernel simulate: profile {row['profile']}")
        assert view["origin"].endswith("workload chat-short seed 7")
        assert ("(unmanaged baseline)" in view["origin"]) == (row["profile"] == "none")
    assert "handoff" in view["strategies"]  # the last one: its strategy panel is there
    from ctxkernel.profile import load_profile
    from ctxkernel.ui.data import Inspector

    kernel = __import__("ctxkernel").Kernel(load_profile("basic"))
    data = Inspector(kernel)
    (basic_id,) = report["profiles"][1]["session_ids"]
    assert data.timeline(basic_id)["effective_window"] == report["profiles"][1]["effective_window"]
    assert data.row(basic_id)["origin"] == data.view(basic_id)["origin"]


def test_without_keep_sessions_no_ids_are_listed(capsys):
    _, report = run_json(capsys, "--workload", "chat-short", "--profile", "basic")
    assert report["profiles"][0]["session_ids"] is None


@pytest.mark.parametrize("bad", ["file", "missing/deeper"])
def test_keep_sessions_refuses_a_folder_it_cannot_use(capsys, tmp_path, bad):
    (tmp_path / "file").write_text("x")
    code = main(["simulate", "--workload", "chat-short", "--profile", "basic", "--keep-sessions", str(tmp_path / bad)])
    assert code == 2
    assert "--keep-sessions" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_lenient_skips_and_counts_malformed_lines(capsys):
    code, report = run_json(
        capsys, "--transcript", str(FIXTURES / "claude-code-malformed.jsonl"), "--lenient", "--profile", "basic"
    )
    assert code == 0
    assert report["source"]["skipped_lines"] == 1


def test_steward_module_function_is_loaded(capsys):
    code, report = run_json(
        capsys, "--workload", "chat-short", "--profile", "basic", "--steward", "ctxkernel.simulate.steward:no_steward"
    )
    assert code == 0
    assert report["settings"]["steward"] == "ctxkernel.simulate.steward:no_steward"


# -- docs keep up with the JSON -------------------------------------------------------------------------
def test_docs_document_every_json_key_and_hold_a_real_example():
    text = (REPO / "docs" / "simulate.md").read_text()
    for key in [*PINNED_METRIC_KEYS, *PINNED_SOURCE_KEYS, *PINNED_SETTINGS_KEYS, *REPORT_KEYS]:
        assert re.search(rf"^\|\s*`{key}`\s*\|", text, re.MULTILINE), f"docs/simulate.md has no table row for `{key}`"
    example = re.search(r"```json\n(.*?)\n```", text, re.DOTALL)
    assert example, "docs/simulate.md needs a worked JSON example"
    shown = json.loads(example.group(1))
    assert sorted(shown) == sorted(REPORT_KEYS)
    assert sorted(shown["profiles"][0]) == sorted(PINNED_METRIC_KEYS)
    # the example is a real run: the command above it, run again, gives the same numbers
    command = re.search(r"```\nctxkernel (simulate .*?)\n```", text).group(1).split()
    assert command[-2:] == ["--format", "json"]
    fresh = json.loads(_run(command[1:]))
    for report in (shown, fresh):
        for profile in report["profiles"]:
            profile.pop("wall_seconds")
    assert shown == fresh, "docs/simulate.md's example is stale: re-run its command and paste the output"
    assert (
        shown["source"]["recorded_requests"]
        == build_workload(shown["source"]["workload"], shown["source"]["seed"]).requests
    )


def _run(args: list[str]) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", *args, "--no-progress"]) == 0
    return out.getvalue()


def test_progress_bar_only_on_a_terminal(capsys):
    import io

    from ctxkernel.simulate.cli import ProgressBar

    assert main(["simulate", "--workload", "chat-short", "--profile", "basic"]) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal under pytest: no bar
    stream = io.StringIO()
    bar = ProgressBar(stream)
    bar("basic", 1, 4)
    bar("basic", 4, 4)
    drawn = stream.getvalue()
    assert "basic" in drawn and "1/4" in drawn and "4/4" in drawn
    assert drawn.endswith("\r")  # the finished bar is wiped so the table starts clean


def test_profile_lists_expand_all_and_keep_order():
    from ctxkernel.profile import list_profiles
    from ctxkernel.simulate import profile_names

    shipped = sorted(list_profiles())
    expanded = profile_names("none,all")
    assert expanded[0] == "none" and "basic" in expanded
    assert set(shipped) <= set(expanded)
    assert profile_names("decay, basic,decay") == ["decay", "basic"]


def test_make_demo_compares_every_shipped_profile_on_the_long_workload():
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert demo and "simulate --workload coding-long --profile none,all" in demo.group(1)
    # it ends with the two commands worth running next: under pressure, and on the user's own session
    echoed = [line for line in demo.group(1).splitlines() if "@echo" in line and "ctxkernel simulate" in line]
    assert len(echoed) == 2
    assert "--window 0.5x --report" in echoed[0] and "--transcript PATH" in echoed[1]


def test_inspect_into_a_closed_pipe_exits_quietly(capsys, tmp_path):
    import os
    import subprocess
    import sys

    kept = tmp_path / "kept"
    _, report = run_json(capsys, "--workload", "chat-short", "--profile", "basic", "--keep-sessions", str(kept))
    (session_id,) = report["profiles"][0]["session_ids"]
    env = {**os.environ, "CTXKERNEL_HOME": str(kept)}
    reader = subprocess.Popen(
        [sys.executable, "-m", "ctxkernel.cli", "inspect", session_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    reader.stdout.close()  # `| head -0`: the reader is gone before the first line
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=120) == 0
    assert err == ""


def test_a_kept_continuation_links_to_its_parent(capsys, tmp_path, monkeypatch):
    from ctxkernel.simulate import Options, Recording, compare

    workload = build_workload("coding-long")
    recording = Recording(workload.items[:160], workload.source)
    kept = tmp_path / "kept"
    kept.mkdir()
    (row,) = compare(["chapters"], recording, Options(window=12_000, keep_sessions=kept))["profiles"]
    assert row["sessions"] > 1
    monkeypatch.setenv("CTXKERNEL_HOME", str(kept))
    monkeypatch.chdir(tmp_path)
    parent, child = row["session_ids"][:2]
    assert main(["inspect", child, "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["parent"] == parent
    assert main(["inspect", child]) == 0
    assert f"continues {parent}" in capsys.readouterr().out
