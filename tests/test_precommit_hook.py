"""The pre-commit hook this repository offers (issue #14, item 7): `.pre-commit-hooks.yaml` runs
`ctxkernel validate` on a repository's profiles, and docs/profiles.md's recipe uses it.

pre-commit itself needs a package index to build the hook's environment, so this test does what
pre-commit does with the hook definition: select the staged files with its ``files`` pattern and
run its ``entry`` with them as arguments, with this checkout's ``ctxkernel`` on PATH."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
HOOKS = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())


def hook() -> dict:
    (only,) = [h for h in HOOKS if h["id"] == "ctxkernel-validate"]
    return only


def run_like_pre_commit(repo: Path, staged: list[str]) -> subprocess.CompletedProcess[str] | None:
    spec = hook()
    selected = [f for f in staged if re.search(spec["files"], f)]
    if not selected:
        return None
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CTXKERNEL_HOME": str(repo / ".home"),
    }
    return subprocess.run(
        [*shlex.split(spec["entry"]), *selected], cwd=repo, capture_output=True, text=True, env=env, timeout=300
    )


def test_the_hook_is_a_python_hook_running_validate():
    spec = hook()
    assert spec["language"] == "python" and spec["pass_filenames"] is True
    assert shlex.split(spec["entry"])[:2] == ["ctxkernel", "validate"]


def test_the_hook_passes_a_valid_profile_and_fails_a_misspelt_key(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "good.toml").write_text((REPO / "profiles" / "basic.toml").read_text())
    good = run_like_pre_commit(tmp_path, ["profiles/good.toml", "README.md"])
    assert good is not None and good.returncode == 0, good.stdout + good.stderr
    (tmp_path / "profiles" / "bad.toml").write_text("[model]\ncontext_windw = 64000\n")
    bad = run_like_pre_commit(tmp_path, ["profiles/good.toml", "profiles/bad.toml"])
    assert bad is not None and bad.returncode == 1
    assert "context_windw" in bad.stdout + bad.stderr


def test_the_hook_leaves_other_files_alone():
    assert run_like_pre_commit(REPO, ["pyproject.toml", "docs/profiles.md", "src/ctxkernel/profile.py"]) is None


def test_profiles_doc_ci_recipe_uses_the_hook():
    text = (REPO / "docs" / "profiles.md").read_text()
    section = text[text.index("### In CI") :]
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)]
    config = next(b for b in blocks if isinstance(b, dict) and "repos" in b)
    assert [h["id"] for r in config["repos"] for h in r["hooks"]] == ["ctxkernel-validate"]
    workflow = next(b for b in blocks if isinstance(b, dict) and "jobs" in b)
    steps = " ".join(str(s.get("run", "")) for s in workflow["jobs"]["validate"]["steps"])
    assert "pre-commit run ctxkernel-validate" in steps


# -- the commit-msg check of .pre-commit-config.yaml -------------------------------------------------
CONFIG = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())


def commit_msg_hook() -> dict:
    (only,) = [h for r in CONFIG["repos"] for h in r["hooks"] if h["id"] == "commit-msg"]
    return only


def run_commit_msg_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    """What pre-commit does at the commit-msg stage: run the entry with the message file."""
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    spec = commit_msg_hook()
    return subprocess.run(
        [*shlex.split(spec["entry"]), str(path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_the_commit_msg_hook_is_installed_and_runs_only_on_messages():
    assert "commit-msg" in CONFIG["default_install_hook_types"]
    assert commit_msg_hook()["stages"] == ["commit-msg"]
    # every other hook checks files: none of them runs on the message
    others = [h for r in CONFIG["repos"] for h in r["hooks"] if h["id"] != "commit-msg"]
    assert "commit-msg" not in CONFIG["default_stages"]
    assert all("commit-msg" not in h.get("stages", CONFIG["default_stages"]) for h in others)


def test_the_commit_msg_hook_accepts_a_short_subject_with_a_body(tmp_path):
    message = (
        "Move the performance log to benchmarks/LOG.md\n\n"
        "The body may be as long as it needs to be: " + "detail " * 40 + "\n"
        "# Please enter the commit message for your changes. Lines starting with '#' are ignored.\n"
    )
    accepted = run_commit_msg_hook(tmp_path, message)
    assert accepted.returncode == 0, accepted.stderr
    assert run_commit_msg_hook(tmp_path, "x" * 72 + "\n").returncode == 0


def test_the_commit_msg_hook_refuses_a_long_subject(tmp_path):
    refused = run_commit_msg_hook(tmp_path, "y" * 73 + "\n\nbody\n")
    assert refused.returncode == 1
    assert "73 characters" in refused.stderr and "at most 72" in refused.stderr


def test_the_commit_msg_hook_refuses_a_body_without_a_blank_line(tmp_path):
    refused = run_commit_msg_hook(tmp_path, "A short subject\nthe body starts at once\n")
    assert refused.returncode == 1 and "blank" in refused.stderr


def test_the_commit_msg_hook_ignores_what_git_drops(tmp_path):
    # comment lines and `git commit -v`'s diff below the scissors line are not the message
    message = (
        "\n# a comment line longer than seventy-two characters is not the subject of anything\n"
        "Fix the retry of a cut-off request\n"
        "# ------------------------ >8 ------------------------\n"
        "diff --git a/x b/x\n"
    )
    assert run_commit_msg_hook(tmp_path, message).returncode == 0
