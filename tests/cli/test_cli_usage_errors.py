"""Every command and option given a bad value: exit 2, one line on stderr naming the option (or
the file, variable or id) and what is accepted, and never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ctxkernel.cli import main

BAD_UTF8 = b"\xff\xfe[profile]\n"

# (argv, text the one-line message must contain); {tmp} is the test's folder
CASES: list[tuple[list[str], str]] = [
    # profiles that cannot be read
    (["simulate", "--workload", "chat-short", "--profile", "{tmp}/latin1.toml"], "not UTF-8"),
    (["inspect", "s1", "--profile", "{tmp}/latin1.toml"], "not UTF-8"),
    (["run", "--profile", "{tmp}/latin1.toml", "--model", "scripted:{tmp}/replies.json", "hi"], "not UTF-8"),
    (["validate", "{tmp}/no-such.toml"], "does not exist"),
    (["validate", "{tmp}"], "is a folder"),
    # simulate
    (["simulate", "--workload", "chat-short", "--window", "1e20"], "--window"),
    (["simulate", "--workload", "chat-short", "--window", "100000000000000000000"], "--window"),
    (["simulate", "--workload", "chat-short", "--window", "12"], "--window"),
    (["simulate", "--workload", "chat-short", "--window", "-5"], "--window"),
    (["simulate", "--workload", "chat-short", "--report", "{tmp}/missing/r.html"], "--report"),
    (["simulate", "--workload", "chat-short", "--report", "{tmp}"], "--report"),
    (["simulate", "--workload", "chat-short", "--seed", "1e9"], "--seed"),
    (["simulate", "--workload", "chat-short", "--seed", "-1"], "--seed"),
    (["simulate", "--workload", "chat-short", "--run", "0"], "--run"),
    (["simulate", "--transcript", "{fixtures}/openai-runs.json", "--run", "-1"], "--run"),
    (["simulate", "--transcript", "{fixtures}/openai-runs.json", "--run", "99999999999999999999"], "--run"),
    (["simulate", "--workload", "chat-short", "--prices", "inf,1,1"], "--prices"),
    (["simulate", "--workload", "chat-short", "--prices", "nan,1,1"], "--prices"),
    (["simulate", "--workload", "chat-short", "--prices", "1,2"], "--prices"),
    (["simulate", "--workload", "chat-short", "--summarizer", "bogus"], "--summarizer"),
    (["simulate", "--workload", "chat-short", "--steward", "os:system"], "--steward"),
    (["simulate", "--workload", "chat-short", "--steward", "os:sep"], "--steward"),
    (["simulate", "--workload", "chat-short", "--steward", "no_such_module:f"], "--steward"),
    (["simulate", "--workload", "chat-short", "--profile", ",,"], "--profile"),
    (["simulate", "--workload", "chat-short", "--format", "xml"], "--format"),
    (["simulate", "--workload", "no-such-workload"], "--workload"),
    (["simulate", "--transcript", "{tmp}/missing.jsonl"], "missing.jsonl"),
    (["simulate", "--transcript", "{tmp}/latin1.toml"], "latin1.toml"),
    (["simulate"], "--transcript"),
    (["simulate", "--workload", "chat-short", "--no-such-flag"], "--no-such-flag"),
    # run
    (["run", "--model", "scripted:{tmp}/replies.json", "--max-steps", "0", "hi"], "--max-steps"),
    (["run", "--model", "scripted:{tmp}/replies.json", "--max-steps", "1e3", "hi"], "--max-steps"),
    (["run", "--model", "scripted:{tmp}/replies.json", "--max-steps", "1000000000", "hi"], "--max-steps"),
    (["run", "--model", "bogus", "hi"], "--model"),
    (["run", "--model", "scripted:{tmp}", "hi"], "scripted model file"),
    (["run", "--model", "scripted:{tmp}/latin1.toml", "hi"], "scripted model file"),
    (["run", "--model", "openai:ftp://x#m", "hi"], "--model"),
    (["run", "--model", "openai:http://127.0.0.1:99999/v1#m", "hi"], "--model"),
    (["run", "--model", "openai:http://models.example/v1?api-version=1#m", "hi"], "--model"),
    (["run", "--model", "openai:http://[::1/v1#m", "hi"], "--model"),
    (["run", "--model", "scripted:{tmp}/replies.json", "--session", "abc\n", "hi"], "--session"),
    (["run", "--model", "scripted:{tmp}/replies.json", "--session", "../x", "hi"], "--session"),
    (["run", "hi"], "--model"),
    (["run", "--model", "scripted:{tmp}/replies.json", "bad \udcff byte"], "not UTF-8"),
    # inspect
    (["inspect", "../etc"], "invalid session id"),
    (["inspect", "abc\n"], "invalid session id"),
    (["inspect", "no-such-session"], "no session"),
    (["inspect", "s1", "--profile", "no-such-profile"], "no profile named"),
    # the top level
    (["--log-level", "bogus", "plugins"], "--log-level"),
    (["no-such-command"], "no-such-command"),
    (["store"], "choose a subcommand"),
    # store copy
    (["store", "copy", "mysql:x", "jsonl:{tmp}/out"], "SOURCE"),
    (["store", "copy", "jsonl:{tmp}/home", "jsonl:"], "TARGET"),
    (["store", "copy", "jsonl:{tmp}/home", "jsonl:{tmp}/out", "--session", "../x"], "invalid session id"),
    (["store", "copy", "jsonl:{tmp}/home", "jsonl:{tmp}/out", "--kv-namespace", "../x"], "invalid key-value namespace"),
]

CHAPTERS_CASES: list[tuple[list[str], str]] = [
    (["chapters"], "choose a subcommand"),
    (["chapters", "manifest", "../x"], "invalid session id"),
    (["chapters", "manifest", "s1", "--profile", "no-such-profile"], "no profile named"),
    (["chapters", "segment", "s1", "--target", "5"], "--target"),
]

ENV_CASES: list[tuple[str, str, list[str]]] = [
    ("CTXKERNEL_MODEL", "{bad json", ["plugins"]),
    ("CTXKERNEL_MODEL", "{bad json", ["profiles"]),
    ("CTXKERNEL_MODEL", "{bad json", ["validate", "basic"]),
    ("CTXKERNEL_MODEL", "{bad json", ["simulate", "--workload", "chat-short"]),
    ("CTXKERNEL_STRATEGIES", "[1", ["inspect", "s1"]),
    ("CTXKERNEL_STRATEGIES__BASIC", "{x", ["run", "--model", "scripted:{tmp}/replies.json", "hi"]),
    ("CTXKERNEL_MODEL__CONTEXT_WINDOW", "abc", ["profiles"]),
]


@pytest.fixture
def where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    for key in ("CTXKERNEL_PROFILE", "CTXKERNEL_PROFILE_PATH"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "latin1.toml").write_bytes(BAD_UTF8)
    (tmp_path / "replies.json").write_text('["done"]')
    return {"tmp": str(tmp_path), "fixtures": str(Path(__file__).parents[1] / "simulate" / "fixtures")}


def _run(argv: list[str], where: dict[str, str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([a.format(**where) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_usage_error(code: int, out: str, err: str, expected: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and expected in lines[0], lines[0]
    assert not out.strip(), out  # refused before any work: nothing printed on stdout


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(a)[:70] for a, _ in CASES])
def test_bad_value_is_a_one_line_usage_error(where, capsys, argv, expected):
    _assert_usage_error(*_run(argv, where, capsys), expected)


@pytest.mark.parametrize(("argv", "expected"), CHAPTERS_CASES, ids=[" ".join(a) for a, _ in CHAPTERS_CASES])
def test_bad_chapters_value_is_a_one_line_usage_error(where, capsys, argv, expected):
    pytest.importorskip("ctxkernel_chapters")
    _assert_usage_error(*_run(argv, where, capsys), expected)


@pytest.mark.parametrize(("variable", "value", "argv"), ENV_CASES, ids=[f"{v}={x} {a[0]}" for v, x, a in ENV_CASES])
def test_bad_environment_override_is_a_usage_error_of_every_command(where, capsys, monkeypatch, variable, value, argv):
    monkeypatch.setenv(variable, value)
    _assert_usage_error(*_run(argv, where, capsys), variable)


def test_the_report_path_is_checked_before_the_simulation_runs(where, capsys):
    """The reported case: an unwritable --report used to fail only after the whole run."""
    code, out, err = _run(["simulate", "--workload", "coding-long", "--report", "{tmp}/missing/r.html"], where, capsys)
    assert code == 2 and not out and "does not exist" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "{tmp}/latin1.toml"],
        ["simulate", "--workload", "chat-short", "--window", "1e20"],
        ["store", "copy", "mysql:x", "jsonl:{tmp}/out"],
    ],
)
def test_the_installed_command_gives_the_same_one_line_error(where, argv):
    """Through a real process (the console script's entry point): no traceback reaches the user."""
    command = [sys.executable, "-c", "import sys; from ctxkernel.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*command, *(a.format(**where) for a in argv)], capture_output=True, text=True, timeout=120, cwd=where["tmp"]
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr
    if argv[0] == "validate":  # an unreadable profile is an invalid profile: validate's exit 1, reported
        assert done.returncode == 1 and "not UTF-8" in done.stdout
    else:
        assert done.returncode == 2 and len(lines) == 1, done.stderr


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/v1", "http://127.0.0.1:0/v1", "http://models.example/v1?x=1"])
def test_a_bad_model_url_leaves_the_store_untouched(where, capsys, url):
    """A port out of range passed the adapter's check and failed only when connecting, after
    ``run`` had created a session in the store."""
    _assert_usage_error(*_run(["run", "--model", f"openai:{url}#m", "hi"], where, capsys), "--model")
    home = Path(where["tmp"]) / "home"
    assert not home.exists() or not [p for p in home.rglob("*") if p.is_file()]
