"""Store tests: proof counts (crash trials, racing workers) are printed in the terminal summary."""

from __future__ import annotations

import pytest

PROOF_LINES: list[str] = []


@pytest.fixture
def proof_line():
    """Call with one line (e.g. a crash trial count) to show it after the test run."""
    return PROOF_LINES.append


def pytest_terminal_summary(terminalreporter):
    if PROOF_LINES:
        terminalreporter.section("store proofs")
        for line in PROOF_LINES:
            terminalreporter.write_line(line)
