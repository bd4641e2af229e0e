"""The installed distribution is discovered and declares what the seed says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ctxkernel_handoff import TOOL_NAMES

REPO = Path(__file__).resolve().parents[3]


def test_ctxkernel_plugins_lists_handoff_with_its_ten_tools():
    exe = Path(sys.executable).with_name("ctxkernel")
    out = subprocess.run([str(exe), "plugins"], capture_output=True, text=True, check=True, cwd=REPO)
    listed = {p["name"]: p for p in json.loads(out.stdout)}
    assert "handoff" in listed
    entry = listed["handoff"]
    assert entry["distribution"] == "ctxkernel-handoff"
    assert sorted(entry["tools"]) == sorted(TOOL_NAMES)
    assert len(TOOL_NAMES) == 10
    assert {"pressure", "overflow"} <= set(entry["capabilities"])


def test_shipped_profile_validates():
    exe = Path(sys.executable).with_name("ctxkernel")
    out = subprocess.run(
        [str(exe), "validate", "--strict", str(REPO / "profiles" / "handoff.toml")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
