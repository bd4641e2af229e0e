"""The ``ctxkernel`` command: plugins, profiles, validate, inspect, run, exit codes."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import validate_support as support

from ctxkernel import Kernel, Message, ScriptedModel, load_profile
from ctxkernel.cli import main
from ctxkernel.store.jsonl import JsonlStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    monkeypatch.setenv("CTXKERNEL_HOME", str(home))
    monkeypatch.chdir(REPO)  # ./profiles is on the profile search path
    return home


@pytest.fixture(autouse=True)
def reset_logging():
    # main() configures logging for the process (structlog and a stderr handler on the
    # "ctxkernel" logger); leave the library defaults to the next test
    from ctxkernel.logging import reset_logging

    yield
    reset_logging()


def run_cli(capsys, *argv):
    capsys.readouterr()  # drop what the test printed before (logs of kernels it built itself)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- plugins ------------------------------------------------------------------------------------------
def test_plugins_lists_basic_with_hooks_capabilities_and_tools(capsys):
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    basic = rows["basic"]
    assert basic["distribution"] == "ctxkernel" and basic["version"]
    assert {"pre_step", "summarize", "request_error", "register_strategy"} <= set(basic["hooks"])
    assert "pressure" in basic["capabilities"]
    assert basic["tools"] == []


def test_plugins_lists_tools_from_a_throwaway_session(capsys, tmp_path, monkeypatch):
    site = support.FakeSite(tmp_path / "site", monkeypatch)
    site.install("toolish", tools=("note_write", "note_read"), capabilities=("notes",))
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    row = next(r for r in json.loads(out) if r["name"] == "toolish")
    assert row["tools"] == ["note_read", "note_write"]
    assert row["distribution"] == "ctxkernel-toolish" and row["version"] == "1.0"
    assert row["capabilities"] == ["notes"]
    assert "register_tools" in row["hooks"]


def test_plugins_reports_a_name_conflict_and_exits_1(capsys, tmp_path, monkeypatch):
    site = support.FakeSite(tmp_path / "site", monkeypatch)
    site.install("twin", dist="ctxkernel-twin")
    site.install("twin", dist="other-twin")
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 1
    twins = [r for r in json.loads(out) if r["name"] == "twin"]
    assert {r["distribution"] for r in twins} == {"ctxkernel-twin", "other-twin"}
    assert all("uninstall all but one" in r["error"] for r in twins)


# -- profiles -----------------------------------------------------------------------------------------
def test_profiles_lists_name_path_and_description(capsys):
    code, out, _ = run_cli(capsys, "profiles", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert Path(rows["basic"]["path"]).resolve() == REPO / "profiles" / "basic.toml"
    assert rows["basic"]["description"] == load_profile(REPO / "profiles" / "basic.toml").profile.description
    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0 and "basic" in out and "basic.toml" in out


def test_profiles_marks_an_invalid_profile(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "extra"
    folder.mkdir()
    (folder / "broken.toml").write_text("[model]\nwindow = 1\n")
    monkeypatch.setenv("CTXKERNEL_PROFILE_PATH", str(folder))
    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("broken"))
    assert "INVALID" in line and "model.window" in line


def test_profiles_prints_a_description_s_control_characters_escaped(capsys, tmp_path, monkeypatch):
    """A profile's description went to the terminal as it was: a file from an untrusted branch
    could retitle the window, clear the screen or hide lines of a CI log."""
    folder = tmp_path / "extra"
    folder.mkdir()
    (folder / "evil.toml").write_text('[profile]\ndescription = "fine\\u001b]0;owned\\u0007\\u001b[2J text"\n')
    monkeypatch.setenv("CTXKERNEL_PROFILE_PATH", str(folder))
    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("evil"))
    assert "\x1b" not in out and "\x07" not in out
    assert "fine\\x1b]0;owned\\x07\\x1b[2J text" in line


def test_validate_prints_control_characters_of_the_profile_escaped(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile]\nstrategies = ["x\\u001b[31m"]\n')
    code, out, _ = run_cli(capsys, "validate", str(bad))
    assert code == 1 and "\x1b" not in out
    assert any("FAIL" in line and "x\\x1b[31m" in line for line in out.splitlines())


# -- validate -----------------------------------------------------------------------------------------
def test_validate_shipped_profile_by_name_exits_0(capsys):
    code, out, _ = run_cli(capsys, "validate", "basic")
    assert code == 0
    assert "valid" in out.splitlines()[0] and "store" in out


def test_validate_without_arguments_checks_every_listed_profile(capsys):
    code, out, _ = run_cli(capsys, "validate", "--json")
    assert code == 0
    checked = {row["profile"] for row in json.loads(out)}
    assert checked == {str(p) for p in (REPO / "profiles").glob("*.toml")}


def test_validate_json_rows_and_exit_1_on_a_defect(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[strategies.basic]\nthreshold = 0.5\n")
    code, out, _ = run_cli(capsys, "validate", "--json", str(bad))
    assert code == 1
    rows = json.loads(out)
    assert all(set(row) == {"profile", "check", "level", "strategy", "message"} for row in rows)
    failed = [r for r in rows if r["level"] == "fail"]
    assert failed and failed[0]["check"] == "settings" and failed[0]["strategy"] == "basic"
    assert str(bad) in failed[0]["message"] and "'strategies.basic.threshold'" in failed[0]["message"]


def test_validate_table_shows_failures(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile]\nstrategies = ["nothere"]\n')
    code, out, _ = run_cli(capsys, "validate", str(bad))
    assert code == 1
    assert "INVALID" in out.splitlines()[0]
    assert any("FAIL" in line and "nothere" in line for line in out.splitlines())


def test_validate_strict_turns_warnings_into_exit_1(capsys, tmp_path):
    shadowed = tmp_path / "shadowed.toml"
    shadowed.write_text(
        '[[model_policies]]\nmatch = { provider = "openai" }\n'
        '[[model_policies]]\nmatch = { provider = "openai", name = "gpt-4o" }\n'
    )
    assert run_cli(capsys, "validate", str(shadowed))[0] == 0
    assert run_cli(capsys, "validate", "--strict", str(shadowed))[0] == 1


@pytest.mark.parametrize(
    "argv", [["validate", "no-such-profile"], ["validate", "/no/such/file.toml"], ["validate", "--bogus"]]
)
def test_validate_usage_errors_exit_2(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.strip() and not out


def test_validate_of_a_folder_says_it_is_a_folder(capsys, tmp_path):
    (tmp_path / "profiles.toml").mkdir()
    for folder in (tmp_path, tmp_path / "profiles.toml"):
        code, out, err = run_cli(capsys, "validate", str(folder))
        assert code == 2 and not out
        assert "is a folder" in err and "does not exist" not in err and ".toml file" in err


def test_validate_with_no_profiles_anywhere_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("ctxkernel.profile.installed_profile_dirs", lambda: [])
    code, _, err = run_cli(capsys, "validate")
    assert code == 2 and "none found" in err


def test_outside_a_checkout_the_installed_distributions_profiles_are_found(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    code, out, _ = run_cli(capsys, "profiles", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert sorted(rows) == sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))
    for name, row in rows.items():  # the package's copy is the repository's file (a symlink in the tree)
        assert Path(row["path"]).read_bytes() == (REPO / "profiles" / f"{name}.toml").read_bytes()
        assert not Path(row["path"]).is_relative_to(tmp_path)
    code, out, _ = run_cli(capsys, "validate", "--json")
    assert code == 0 and {Path(r["profile"]).stem for r in json.loads(out)} == set(rows)


# -- inspect ------------------------------------------------------------------------------------------
def make_session(home: Path) -> str:
    profile = load_profile(REPO / "profiles" / "basic.toml")
    profile.model = profile.model.model_copy(update={"context_window": 4000, "reserved_output_tokens": 500})
    kernel = Kernel(profile, store=JsonlStore(home), entry_points=False)
    session = kernel.open_session()
    model = ScriptedModel(lambda messages, system, tools: Message.assistant("done " * 40))
    for turn in range(12):
        session.user(f"turn {turn}: " + "please look at this " * 60)
        request = session.prepare_request()
        reply = model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        session.end_turn()
    assert any(e.type == "compaction/summary" for e in session.events)
    return session.id


def test_inspect_json_shows_pressure_surface_compactions(capsys, env):
    session_id = make_session(env)
    code, out, _ = run_cli(capsys, "inspect", session_id, "--json")
    assert code == 0
    view = json.loads(out)
    assert view["session"] == session_id and view["profile"] == "basic"
    assert view["pressure"]["effective_window"] > 0 and "ratio" in view["pressure"]
    assert view["surface"]["nodes"] > 0
    assert view["compactions"] and view["compactions"][0]["strategy"] == "basic"
    assert isinstance(view["strategies"], dict)


def test_inspect_text_and_read_only(capsys, env):
    session_id = make_session(env)
    log = env / "sessions" / f"{session_id}.jsonl"
    before = log.read_bytes()
    code, out, _ = run_cli(capsys, "inspect", session_id)
    assert code == 0
    assert out.startswith(f"session {session_id}")
    assert "pressure" in out and "compactions" in out and "basic/summary" in out
    assert log.read_bytes() == before


def test_inspect_says_the_profile_came_from_the_session(capsys, env):
    session_id = make_session(env)
    code, out, err = run_cli(capsys, "inspect", session_id)
    assert code == 0 and not err
    assert out.startswith(f"session {session_id}  (profile basic (recorded with the session),")


def ghost_session(home: Path, tmp_path: Path) -> str:
    """A session recorded with profile 'ghost', whose file is not on the profile search path."""
    path = tmp_path / "elsewhere" / "ghost.toml"
    path.parent.mkdir()
    path.write_text((REPO / "profiles" / "basic.toml").read_text())
    kernel = Kernel(load_profile(path), store=JsonlStore(home), entry_points=False)
    session = kernel.open_session()
    session.user("hello")
    session.end_turn()
    return session.id


def test_inspect_refuses_to_guess_when_the_recorded_profile_is_missing(capsys, env, tmp_path):
    session_id = ghost_session(env, tmp_path)
    log = env / "sessions" / f"{session_id}.jsonl"
    before = log.read_bytes()
    code, out, err = run_cli(capsys, "inspect", session_id, "--json")
    assert code == 2 and not out
    assert "recorded with profile 'ghost'" in err and "not on the profile search path" in err
    assert "--profile" in err
    assert log.read_bytes() == before


def test_inspect_with_profile_uses_it_and_says_so(capsys, env, tmp_path):
    session_id = ghost_session(env, tmp_path)
    code, out, err = run_cli(capsys, "inspect", session_id, "--profile", str(tmp_path / "elsewhere" / "ghost.toml"))
    assert code == 0 and not err and "profile ghost (--profile)" in out
    code, out, err = run_cli(capsys, "inspect", session_id, "--profile", "basic", "--json")
    assert code == 0 and json.loads(out)["profile"] == "basic"
    assert "session recorded with profile 'ghost'; read with 'basic' (--profile)" in err


@pytest.mark.parametrize("session_id", ["missing-session", "../etc"])
def test_inspect_unknown_or_invalid_session_exits_2(capsys, session_id):
    code, out, err = run_cli(capsys, "inspect", session_id)
    assert code == 2 and not out and session_id in err


# -- run ----------------------------------------------------------------------------------------------
def script_file(tmp_path: Path, replies: list) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(replies))
    return path


def test_run_scripted_prompt_from_arguments(capsys, tmp_path, env):
    script = script_file(
        tmp_path,
        [
            {
                "content": "let me look",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}],
            },
            "All done.",
        ],
    )
    code, out, err = run_cli(capsys, "run", "--profile", "basic", "--model", f"scripted:{script}", "fix", "the", "bug")
    assert code == 0, err
    assert out.strip() == "All done."
    session_id = err.split()[1]
    session = Kernel.from_profile("basic", entry_points=False).open_session(session_id)
    users = [n.message.text for n in session.surface if n.role == "user"]
    assert users == ["fix the bug"]
    # the harness (the CLI) runs no tools: the model got an error result, not a crash
    (result,) = [n.message.tool_result for n in session.surface if n.role == "tool"]
    assert result.is_error and "grep" in result.content


def test_run_prompt_from_stdin_with_json(capsys, tmp_path, monkeypatch):
    script = script_file(tmp_path, ["hello back"])
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello from stdin\n"))
    code, out, _ = run_cli(capsys, "run", "--model", f"scripted:{script}", "--json")
    assert code == 0
    outcome = json.loads(out)
    assert outcome["text"] == "hello back" and outcome["reason"] == "completed" and outcome["steps"] == 1


def test_run_continues_a_session(capsys, tmp_path):
    script = script_file(tmp_path, ["one"])
    code, _, err = run_cli(capsys, "run", "--model", f"scripted:{script}", "first")
    session_id = err.split()[1]
    code, out, _ = run_cli(capsys, "run", "--model", f"scripted:{script}", "--session", session_id, "second")
    assert code == 0 and out.strip() == "one"
    session = Kernel.from_profile("basic", entry_points=False).open_session(session_id)
    assert [n.message.text for n in session.surface if n.role == "user"] == ["first", "second"]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--model", "gpt-4o", "hi"],
        ["run", "--model", "scripted:/no/such.json", "hi"],
        ["run", "--model", "openai:api.example.com#m", "hi"],
        ["run", "--model", "openai:http://127.0.0.1:9/v1", "hi"],
        ["run", "hi"],
        ["run", "--model", "scripted:x.json", "--max-steps", "0", "hi"],
        ["run", "--profile", "no-such-profile", "--model", "scripted:SCRIPT", "hi"],
        ["run", "--session", "nope", "--model", "scripted:SCRIPT", "hi"],
    ],
)
def test_run_usage_errors_exit_2(capsys, tmp_path, argv):
    script = script_file(tmp_path, ["x"])
    argv = [a.replace("SCRIPT", str(script)) for a in argv]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (out, err)
    assert err.strip()


def test_run_bad_script_file_is_a_usage_error(capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"not": "a list"}')
    code, _, err = run_cli(capsys, "run", "--model", f"scripted:{path}", "hi")
    assert code == 2 and "JSON list" in err


class _Provider:
    """A loopback chat-completions server that answers once and records the request."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                payload = json.dumps(
                    {
                        "id": "x",
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "from http"},
                            }
                        ],
                        "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_run_against_an_openai_compatible_server(capsys, monkeypatch):
    provider = _Provider()
    monkeypatch.setenv("MY_KEY", "secret")
    try:
        code, out, err = run_cli(
            capsys,
            "run",
            "--model",
            f"openai:{provider.base_url}#tiny-model",
            "--api-key-env",
            "MY_KEY",
            "--json",
            "ping",
        )
    finally:
        provider.close()
    assert code == 0, err
    outcome = json.loads(out)
    assert outcome["text"] == "from http"
    (request,) = provider.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer secret"
    assert request["body"]["model"] == "tiny-model"
    assert request["body"]["messages"][-1] == {"role": "user", "content": "ping"}
    assert outcome["pressure"]["anchored"] is True


def test_run_model_error_exits_1(capsys, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["only one"]))
    # port 9 (discard) on loopback refuses the connection: a model error, not a usage error
    code, _, err = run_cli(capsys, "run", "--model", "openai:http://127.0.0.1:9/v1#m", "hi")
    assert code == 1 and "model error" in err


# -- usage and the console script ------------------------------------------------------------------
def test_no_command_and_unknown_command_exit_2(capsys):
    assert run_cli(capsys)[0] == 2
    assert run_cli(capsys, "frobnicate")[0] == 2


def test_console_script_runs_plugins_and_validate(tmp_path, env):
    script = Path(sys.executable).with_name("ctxkernel")
    assert script.exists(), f"console script missing next to {sys.executable}: pip install -e ."
    environment = {**os.environ, "CTXKERNEL_HOME": str(env)}
    listed = subprocess.run(
        [str(script), "plugins"], capture_output=True, text=True, cwd=REPO, env=environment, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert "basic" in {row["name"] for row in json.loads(listed.stdout)}
    checked = subprocess.run(
        [str(script), "validate", "--strict", "--json", "profiles/basic.toml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert all(row["level"] == "pass" for row in json.loads(checked.stdout))
    bad = subprocess.run(
        [str(script), "validate", "nope"], capture_output=True, text=True, cwd=REPO, env=environment, timeout=120
    )
    assert bad.returncode == 2 and "nope" in bad.stderr


# -- strategies' commands (the register_commands hook) -----------------------------------------------
def test_a_strategy_that_exits_at_import_is_named_and_every_command_still_runs(capsys, monkeypatch, tmp_path):
    """A plugin module calling sys.exit() on import (argparse or click at module level) used to
    end every ctxkernel command, `profiles` and `validate` included, with its status and no word."""
    import ctxkernel.plugins as plugins_module
    from ctxkernel.plugins import Available

    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = plugins_module.discover

    def with_exiting(*, entry_points: bool = True):
        available, conflicts = real(entry_points=entry_points)
        return available | {"exits": Available("exits", "ctxkernel-exits", "0.0.1", "exits_at_import")}, conflicts

    monkeypatch.setattr(plugins_module, "discover", with_exiting)
    code, out, err = run_cli(capsys, "profiles", "--json")
    assert code == 0 and "basic" in out
    assert "strategy 'exits' (ctxkernel-exits) failed to load" in err and "SystemExit" in err
    path = tmp_path / "p.toml"
    path.write_text('[profile]\nstrategies = ["exits"]\n')
    code, out, err = run_cli(capsys, "validate", str(path))
    assert code == 1 and "exits_at_import" in out and "SystemExit: 3" in out


def test_strategies_add_commands_through_the_hook_and_a_broken_one_is_named(capsys, monkeypatch):
    import ctxkernel.plugins as plugins_module
    from ctxkernel.plugins import Available

    real = plugins_module.discover

    def with_broken(*, entry_points: bool = True):
        available, conflicts = real(entry_points=entry_points)
        return available | {
            "broken": Available("broken", "ctxkernel-broken", "0.0.1", "ctxkernel_no_such_module")
        }, conflicts

    monkeypatch.setattr(plugins_module, "discover", with_broken)
    code, out, err = run_cli(capsys, "chapters", "--help")
    assert code == 0 and "manifest" in out  # chapters' command, through its hook
    assert "strategy 'broken' (ctxkernel-broken) failed to load" in err
