"""First test: the installed distribution is discovered; its profile validates; bad budgets fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_chapters import PROFILE, REPO

from ctxkernel.profile import load_profile
from ctxkernel.validate import ValidationReport

CLI = [sys.executable, "-m", "ctxkernel.cli"]


def test_ctxkernel_plugins_lists_chapters():
    out = subprocess.run([*CLI, "plugins"], capture_output=True, text=True, check=True, cwd=REPO)
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert "chapters" in rows
    row = rows["chapters"]
    assert row["distribution"] == "ctxkernel-chapters"
    assert {"pre_step", "request_error", "register_tools", "steward_actions", "validate_profile", "project"} <= set(
        row["hooks"]
    )
    assert "pressure" in row["capabilities"]


def test_ctxkernel_validate_chapters_passes(tmp_path):
    env = {**os.environ, "CTXKERNEL_HOME": str(tmp_path)}
    out = subprocess.run([*CLI, "validate", "chapters"], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "chapters are stored in the jsonl store's blobs" in out.stdout


def _validate(profile) -> ValidationReport:
    from ctxkernel_chapters.plugin import validate_profile

    report = ValidationReport(where=str(PROFILE))
    validate_profile(profile, report)
    return report


@pytest.mark.parametrize("root", ["/abs/chapters", "../out", "a b"])
def test_validate_profile_refuses_an_archive_root_that_is_not_a_relative_name(root):
    """Chapters live in the store; archive_root only names the folder they are shown under and
    exported to, so it must be a relative name that cannot leave the export folder."""
    profile = load_profile(PROFILE)
    profile.strategies = {"chapters": {"archive_root": root}}
    report = _validate(profile)
    fails = [c.message for c in report.failures]
    assert any("archive_root" in m and "relative folder name" in m for m in fails), fails


def test_validate_profile_accepts_the_default_archive_root():
    report = _validate(load_profile(PROFILE))
    assert not [c.message for c in report.failures if "archive_root" in c.message]


def test_validate_profile_refuses_budgets_that_cannot_fit(tmp_path):
    profile = load_profile(PROFILE)
    profile.store.path = str(tmp_path)
    # an effective window of 6,000: its 6,000-token chapters and a 2,000-token bullet list do not fit
    profile.model_policies[1].model = {"context_window": 7000, "reserved_output_tokens": 1000}
    report = _validate(profile)
    fails = [c.message for c in report.failures]
    assert any("chapter_token_target" in m and "deepseek-reasoner" in m for m in fails), fails
    assert any("toc_bullet_budget_tokens" in m for m in fails), fails
    assert not any("deepseek-chat" in m for m in fails), fails  # the base model still fits


def test_settings_refuse_inconsistent_ratios():
    import pytest
    from pydantic import ValidationError

    from ctxkernel_chapters.settings import ChaptersSettings

    with pytest.raises(ValidationError, match="pressure_suggestion_ratio"):
        ChaptersSettings(pressure_suggestion_ratio=0.95, compact_at_ratio=0.9)
    with pytest.raises(ValidationError, match="tool_result_defer_floor_tokens"):
        ChaptersSettings(tool_result_defer_floor_tokens=500, tool_result_artifact_tokens=400)
    with pytest.raises(ValidationError, match="extra"):
        ChaptersSettings.model_validate({"artifactStoreRoot": "x"})


def test_per_model_policy_changes_the_settings(tmp_path):
    from helpers_chapters import chapters_kernel

    kernel = chapters_kernel(
        tmp_path,
        policies=[
            {
                "match": {"provider": "scripted", "name": "small"},
                "strategies": {"chapters": {"chapter_token_target": 1500}},
            }
        ],
    )
    session = kernel.open_session()
    assert session.settings("chapters").chapter_token_target == 8000
    session.set_route("scripted", "small")
    assert session.settings("chapters").chapter_token_target == 1500
    assert Path(kernel.home) == tmp_path


def test_chapters_passes_the_kernel_conformance_suite(tmp_path):
    from ctxkernel.testing import check_conformance

    report = check_conformance(tmp_path, ["chapters"])
    assert report.compactions >= 2 and report.peak_prompt_tokens <= report.effective_window
    assert report.restarts_checked and report.refusals_checked


def test_every_setting_is_documented_in_the_readme():
    from ctxkernel_chapters.settings import ChaptersSettings

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    missing = [name for name in ChaptersSettings.model_fields if f"`{name}`" not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_open_from_a_snapshot_at_seeded_random_cuts_equals_the_full_fold(tmp_path):
    """The conformance workload's session (in-place archives, artifacts moved out, suggestions),
    snapshotted at random points and run on: opened from the snapshot it folds to the full
    replay's chapters state, and reads no event before the snapshot."""
    import random

    from ctxkernel import Kernel
    from ctxkernel.store.jsonl import JsonlStore
    from ctxkernel.testing import check_conformance, check_snapshot_equivalence, make_profile

    check_conformance(tmp_path, ["chapters"], turns=16)
    store = JsonlStore(tmp_path)
    # the conformance session (a continuation, when the workload made one, holds no archive yet)
    session_id = max(store.list_sessions(), key=store.next_seq)
    events = list(store.read(session_id))
    assert any(e.type == "compaction/summary" and e.data.get("strategy") == "chapters" for e in events)

    def new_kernel(snapshots):
        profile = make_profile(
            model={"context_window": 24_000, "reserved_output_tokens": 2_000},  # check_conformance's
            store={"snapshot_every": 1000 if snapshots else 0},
        )
        profile.profile.strategies = ["chapters"]
        return Kernel(profile, store=JsonlStore(tmp_path, fsync=False), home=tmp_path)

    rng = random.Random(21)
    cuts = [(cut, rng.randint(cut, len(events))) for cut in sorted(rng.sample(range(1, len(events) + 1), 6))]
    checked = check_snapshot_equivalence(new_kernel, session_id, cuts)
    for case in checked:
        # a chapters commit in the tail (appended as it is, so without its files) is settled at
        # open: its chapters are rendered from the events they cover, before the snapshot
        settles = any(
            e.type == "compaction/summary" and e.data.get("strategy") == "chapters" and "records" in e.data
            for e in events[case.cut : case.end]
        )
        assert settles or case.loaded_before_snapshot == 0, case
