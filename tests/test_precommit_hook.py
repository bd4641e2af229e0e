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
