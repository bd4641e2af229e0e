"""The strategy is installed, discoverable and validates its profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ctxkernel.errors import ProfileError
from ctxkernel.validate import validate_profile

REPO = Path(__file__).resolve().parents[3]


def test_ctxkernel_plugins_lists_rollover():
    out = subprocess.run(
        [sys.executable, "-m", "ctxkernel.cli", "plugins"], capture_output=True, text=True, check=True, cwd=REPO
    )
    listed = {p["name"]: p for p in json.loads(out.stdout)}
    assert "rollover" in listed
    assert listed["rollover"]["distribution"] == "ctxkernel-rollover"
    assert {"new_context", "context_remaining", "note_create", "history_lookup"} <= set(listed["rollover"]["tools"])


def test_shipped_profile_validates():
    report = validate_profile(REPO / "profiles" / "rollover.toml")
    assert report.valid, report.rows()
    assert any(c.strategy == "rollover" and c.check == "strategy" and c.level == "pass" for c in report.checks)


def _profile(tmp_path, strategies, table=""):
    path = tmp_path / "combo.toml"
    path.write_text(
        f"[profile]\nstrategies = {json.dumps(strategies)}\ncapability_order = {json.dumps(strategies)}\n{table}"
    )
    return path


def test_validate_reports_rollover_with_a_summarising_fallback(tmp_path):
    report = validate_profile(_profile(tmp_path, ["rollover", "basic"]))
    fails = [c for c in report.failures if c.strategy == "rollover"]
    assert fails and "allow_summary_fallback = true" in fails[0].message and "basic" in fails[0].message


def test_validate_accepts_an_explicit_summary_fallback_with_a_warning(tmp_path):
    table = "[strategies.rollover]\nallow_summary_fallback = true\n"
    report = validate_profile(_profile(tmp_path, ["rollover", "basic"], table))
    assert not [c for c in report.failures if c.strategy == "rollover"]
    assert any(c.strategy == "rollover" and "explicitly allowed" in c.message for c in report.warnings)


def test_settings_reject_unknown_keys_and_disordered_ratios(tmp_path):
    from helpers_rollover import rollover_kernel

    with pytest.raises(ProfileError, match="reminder_ratio"):
        rollover_kernel(tmp_path, reminder_ratio=0.95, rollover_ratio=0.9)
    with pytest.raises(ProfileError, match="summarize_with"):
        rollover_kernel(tmp_path, summarize_with="gpt")


def test_rollover_passes_the_kernel_conformance_suite(tmp_path):
    from ctxkernel.testing import check_conformance

    report = check_conformance(tmp_path, ["rollover"])
    assert report.compactions >= 2 and report.peak_prompt_tokens <= report.effective_window
    assert report.restarts_checked and report.refusals_checked
