"""The kernel's conformance suite, run against the shipped handoff profile."""

from pathlib import Path

from ctxkernel import load_profile
from ctxkernel.testing import check_conformance

PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "handoff.toml"


def test_handoff_profile_passes_the_conformance_suite(tmp_path):
    profile = load_profile(PROFILE)
    report = check_conformance(tmp_path, profile.profile.strategies, settings=profile.strategies, profile=profile)
    assert report.compactions > 0  # the workload needed management, and got it
    assert "effective window never exceeded" in report.checks
