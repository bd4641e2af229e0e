"""Test tiers (issue #14 item 6): `make test` runs everything, `make test-fast` skips the tests
marked slow, a global timeout stops a hung test, and each plugin's tests run from its folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = sorted(p for p in (REPO / "plugins").glob("ctxkernel-*") if (p / "tests").is_dir())


def test_a_global_timeout_is_set():
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert int(options["timeout"]) > 0


def test_make_test_runs_every_tier_after_the_static_checks_and_test_fast_skips_slow():
    makefile = (REPO / "Makefile").read_text()
    test = re.search(r"^test: (.*)\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    fast = re.search(r"^test-fast: .*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert test and "lint" in test.group(1) and "not slow" not in test.group(2)
    assert fast and '-m "not slow"' in fast.group(1)


@pytest.mark.slow
@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_a_plugins_tests_run_from_its_own_folder(plugin):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=plugin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    # ids are relative to the repository's root (its pyproject holds the pytest settings)
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert ids and all(line.startswith(f"plugins/{plugin.name}/tests/") for line in ids), ids[:5]
