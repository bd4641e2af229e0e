"""``ctxkernel new-strategy``: the name is validated, nothing is overwritten, and the generated
distribution is complete (its own tests run in a fresh venv in tests/packaging/test_fresh_venvs.py)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

from ctxkernel.cli import main
from ctxkernel.plugins import ENTRY_POINT_GROUP
from ctxkernel.profile import PROFILE_ENTRY_POINT_GROUP
from ctxkernel.testing import check_conformance

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, tmp_path, name="pin-and-trim") -> Path:
    code, out, err = run(capsys, "new-strategy", name, "--to", str(tmp_path))
    assert code == 0, err
    target = tmp_path / f"ctxkernel-{name}"
    assert f"wrote {target}" in out
    return target


def test_writes_a_complete_distribution(capsys, tmp_path):
    target = generate(capsys, tmp_path)
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "pyproject.toml",
        "src/ctxkernel_pin_and_trim/__init__.py",
        "src/ctxkernel_pin_and_trim/plugin.py",
        "src/ctxkernel_pin_and_trim/profiles/pin-and-trim.toml",
        "src/ctxkernel_pin_and_trim/py.typed",
        "tests/test_ctxkernel_pin_and_trim.py",
    ]
    meta = tomllib.loads((target / "pyproject.toml").read_text())
    kernel = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    major, minor, _ = kernel["version"].split(".")
    assert meta["project"]["dependencies"] == [f"ctxkernel>={major}.{minor},<{major}.{int(minor) + 1}"]
    assert meta["project"]["optional-dependencies"]["test"] == ["ctxkernel[test]"]
    # the same groups the shipped plugins declare
    decay = tomllib.loads((REPO / "plugins" / "ctxkernel-decay" / "pyproject.toml").read_text())["project"]
    assert set(decay["entry-points"]) == {ENTRY_POINT_GROUP, PROFILE_ENTRY_POINT_GROUP}
    assert meta["project"]["entry-points"] == {
        ENTRY_POINT_GROUP: {"pin-and-trim": "ctxkernel_pin_and_trim.plugin"},
        PROFILE_ENTRY_POINT_GROUP: {"pin-and-trim": "ctxkernel_pin_and_trim"},
    }
    profile = tomllib.loads((target / "src/ctxkernel_pin_and_trim/profiles/pin-and-trim.toml").read_text())
    assert profile["profile"]["strategies"] == ["pin-and-trim", "basic"]
    for path in target.rglob("*"):
        if path.is_file():
            assert "${" not in path.read_text(), f"{path} kept a template placeholder"


def load_generated_plugin(target: Path, module: str):
    spec = importlib.util.spec_from_file_location(module, target / "src" / module.replace(".", "/") / "plugin.py")
    plugin = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = plugin
    spec.loader.exec_module(plugin)
    return plugin


def test_the_generated_strategy_passes_conformance_in_process(capsys, tmp_path):
    target = generate(capsys, tmp_path, "trim-two")
    plugin = load_generated_plugin(target, "ctxkernel_trim_two")
    report = check_conformance(
        tmp_path / "home",
        ["trim-two", "basic"],
        settings={"trim-two": {"keep_tokens": 3_000}},
        plugins=[("trim-two", plugin)],
        entry_points=False,
        turns=12,
        tool_calls=lambda point: [{"name": "trim_two_status", "arguments": {}}] if point.step == 0 else None,
    )
    assert report.compactions >= 1 and report.tool_calls_checked == 12


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Pin_Trim", "lower-case letters and digits"),
        ("pin--trim", "single hyphens"),
        ("pin-", "single hyphens"),
        ("-pin", "starting with a letter"),
        ("9lives", "starting with a letter"),
        ("a" * 41, "40 characters at most"),
        ("../escape", "is not accepted"),
        ("pin trim", "is not accepted"),
        ("tool", "kernel event namespace"),
        ("basic", "already taken by the installed distribution 'ctxkernel'"),
    ],
)
def test_a_bad_name_is_refused_and_nothing_is_written(capsys, tmp_path, name, reason):
    code, out, err = run(capsys, "new-strategy", "--to", str(tmp_path), "--", name)
    assert code == 2 and not out
    assert reason in err and "new-strategy: error" in err
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_never_touched(capsys, tmp_path):
    existing = tmp_path / "ctxkernel-pin-and-trim"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep me")
    code, out, err = run(capsys, "new-strategy", "pin-and-trim", "--to", str(tmp_path))
    assert code == 2 and "already exists" in err and "--to" in err
    assert [p.name for p in existing.iterdir()] == ["mine.txt"] and (existing / "mine.txt").read_text() == "keep me"


def test_a_file_as_the_target_folder_is_a_usage_error_naming_it(capsys, tmp_path):
    # was the OS's raw "[Errno 20] Not a directory"
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    for to in (blocker, blocker / "sub"):
        code, out, err = run(capsys, "new-strategy", "pin-and-trim", "--to", str(to))
        assert code == 2 and not out, err
        assert f"--to {to}: {blocker} is a file, not a folder; accepted: a folder" in err
        assert "Errno" not in err
    assert blocker.read_text() == "keep me"


def test_a_description_cannot_break_out_of_its_strings(capsys, tmp_path):
    code, _, err = run(
        capsys,
        "new-strategy",
        "quoted",
        "--to",
        str(tmp_path),
        "--description",
        'say "hi"\\\nimport os; os.system("x")',
    )
    assert code == 0, err
    target = tmp_path / "ctxkernel-quoted"
    tomllib.loads((target / "pyproject.toml").read_text())  # still valid TOML
    plugin = load_generated_plugin(target, "ctxkernel_quoted")
    assert plugin.STRATEGY.description == "say 'hi'/; import os; os.system('x')"


#: the modules a strategy may import (docs/writing-a-strategy.md, "What a strategy may import")
PUBLIC_MODULES = {"ctxkernel", "ctxkernel.events", "ctxkernel.recall", "ctxkernel.text", "ctxkernel.redact"}
PUBLIC_PREFIXES = ("ctxkernel.recall.", "ctxkernel.testing")


def test_a_strategy_from_the_template_never_needs_the_session(capsys, tmp_path):
    """Issue 37: a strategy written from ``ctxkernel new-strategy`` reads the session through the
    ``ctx`` its hooks receive and acts through its handle: its source names no Session, imports no
    private module, and type-checks against the narrow context (mypy would refuse ``ctx.kernel``,
    ``ctx.store`` or a write to ``ctx.surface.nodes``)."""
    import ast

    from mypy import api as mypy_api

    target = generate(capsys, tmp_path, "ctx-only")
    sources = sorted((target / "src").rglob("*.py"))
    assert sources
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert (
                    not module.startswith("ctxkernel") or module in PUBLIC_MODULES or module.startswith(PUBLIC_PREFIXES)
                ), f"{path.name} imports the private module {module}"
                assert all(alias.name != "Session" for alias in node.names), f"{path.name} imports Session"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    assert not name.startswith("ctxkernel") or name in PUBLIC_MODULES, f"{path.name} imports {name}"
            elif isinstance(node, ast.Attribute):
                assert node.attr not in {"Session", "_session", "session_of"}, f"{path.name} reaches {node.attr}"
            elif isinstance(node, ast.Name):
                assert node.id not in {"Session", "session_of"}, f"{path.name} names {node.id}"
            elif isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Attribute) and d.attr == "hookimpl" for d in node.decorator_list
            ):
                assert "session" not in [a.arg for a in node.args.args], f"{node.name} takes a session"
    package = target / "src" / "ctxkernel_ctx_only"
    out, err, status = mypy_api.run(
        [
            "--strict",
            "--ignore-missing-imports",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            str(package),
        ]
    )
    assert status == 0, out + err


@pytest.mark.parametrize("name", ["all", "none"])
def test_the_profile_keywords_are_not_strategy_names(capsys, tmp_path, name):
    # `simulate --profile all` / `none` read them as keywords: a strategy of that name could
    # never be simulated by name
    code, out, err = run(capsys, "new-strategy", "--to", str(tmp_path), "--", name)
    assert code == 2 and not out
    assert "keyword" in err and "--profile" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("control", ["\x00", "\x07", "\x1b[31m", "\x7f", "\u0085"])
def test_a_description_with_a_control_character_is_refused(capsys, tmp_path, control):
    # TOML's strings cannot hold them: the generated pyproject did not parse
    code, out, err = run(
        capsys, "new-strategy", "ctl", "--to", str(tmp_path), "--description", f"compacts{control} things"
    )
    assert code == 2 and not out
    assert "--description" in err and "control character" in err and f"U+{ord(control[0]):04X}" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("lone", ["\udcff", "\ud800"])
def test_a_description_that_is_not_text_is_refused_before_anything_is_written(capsys, tmp_path, lone):
    # an argument holding a byte that is not UTF-8 reaches Python as a lone surrogate: writing it
    # failed with a UnicodeEncodeError traceback after the folder and README.md were made
    code, out, err = run(capsys, "new-strategy", "lone", "--to", str(tmp_path), "--description", f"bad{lone}byte")
    assert code == 2 and not out
    assert "--description" in err and f"U+{ord(lone):04X}" in err and "UTF-8" in err
    assert list(tmp_path.iterdir()) == []
