"""First test: the installed distribution is discovered; its profile validates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "ctxkernel.cli"]


def test_ctxkernel_plugins_lists_decay():
    out = subprocess.run([*CLI, "plugins"], capture_output=True, text=True, check=True, cwd=REPO)
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert "decay" in rows
    decay = rows["decay"]
    assert decay["distribution"] == "ctxkernel-decay"
    assert {"decorate_request", "sanitize_reply", "pre_step", "project", "steward_actions", "register_tools"} <= set(
        decay["hooks"]
    )
    assert "pressure" in decay["capabilities"]


def test_ctxkernel_validate_decay_passes(tmp_path):
    env = {**os.environ, "CTXKERNEL_HOME": str(tmp_path)}
    out = subprocess.run([*CLI, "validate", "decay"], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "valid" in out.stdout
