"""docs/hooks.md: its Python blocks form one strategy (`anchors`), installed and run here, so no
snippet on the page can drift from the API (the settings snippet once read a raw dict)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest
import validate_support as support

from ctxkernel.validate import validate_profile

REPO = Path(__file__).resolve().parents[2]


def hooks_page_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "hooks.md").read_text(), re.DOTALL)
    assert len(blocks) >= 3, "docs/hooks.md lost its strategy snippets"
    return "\n\n".join(blocks)


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    for key in ("CTXKERNEL_PROFILE", "CTXKERNEL_PROFILE_PATH"):
        monkeypatch.delenv(key, raising=False)
    site = support.FakeSite(tmp_path / "site", monkeypatch)
    site.module = site.install("anchors", source=hooks_page_source())
    return site


def profile(tmp_path: Path, window: int, table: str = "") -> Path:
    path = tmp_path / f"anchors-{window}.toml"
    path.write_text(
        f'[profile]\nstrategies = ["anchors", "basic"]\n\n[model]\ncontext_window = {window}\n'
        f"reserved_output_tokens = 1000\n{table}"
    )
    return path


def anchors_failures(report) -> list[str]:
    return [c.message for c in report.checks if c.level == "fail" and c.strategy == "anchors"]


def test_the_pages_validate_hook_reads_typed_settings_and_fails_a_small_window(site, tmp_path):
    report = validate_profile(profile(tmp_path, 16_000))
    failures = anchors_failures(report)
    assert len(failures) == 1 and "at least 32000, got 16000" in failures[0]


def test_the_pages_settings_follow_the_profile_table(site, tmp_path):
    lowered = profile(tmp_path, 16_000, "\n[strategies.anchors]\nmin_window = 8000\n")
    assert anchors_failures(validate_profile(lowered)) == []
    assert validate_profile(lowered).valid


def test_a_bad_settings_table_is_a_profile_error_naming_the_key(site, tmp_path):
    report = validate_profile(profile(tmp_path, 64_000, "\n[strategies.anchors]\nmin_window = 5\n"))
    assert not report.valid
    assert any("strategies.anchors.min_window" in c.message for c in report.checks if c.level == "fail")


def test_the_pages_command_runs(site, capsys):
    module = sys.modules.get(site.module) or __import__(site.module)
    parser = argparse.ArgumentParser()
    module.register_commands(parser.add_subparsers())
    args = parser.parse_args(["anchors"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out) == {"min_window": 32000}


def test_bad_settings_are_reported_once_not_as_a_crash_of_the_hook(site, tmp_path):
    report = validate_profile(profile(tmp_path, 16_000, "\n[strategies.anchors]\nmin_window = 5\n"))
    messages = [c.message for c in report.failures]
    assert any("min_window" in m for m in messages)
    assert not any("Traceback" in m or "raised" in m for m in messages), messages
