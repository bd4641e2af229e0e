"""benchmarks/bench_serve_peer.py: the peer is skipped with its reason, never stood in for, and a
proxy's CPU is read from its own process tree."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_a_peer_that_is_not_installed_skips_its_rows_with_the_reason(benchmarks, monkeypatch, capsys, tmp_path):
    import bench_serve_peer
    from _bench import Bench

    monkeypatch.setattr(bench_serve_peer, "why_not_installed", lambda: "litellm[proxy]==0 is not installed here")
    bench = Bench(quick=True, scratch=tmp_path)
    bench_serve_peer.run(bench)
    assert bench.results == [], "a row was reported without the peer"
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["name"] for line in lines] == list(bench_serve_peer.ROWS)
    assert all(line["skipped"] == "litellm[proxy]==0 is not installed here" for line in lines)


def test_the_peer_is_pinned_and_lives_outside_the_project_venv(benchmarks):
    import _peers

    assert _peers.LITELLM_REQUIREMENT.startswith("litellm[proxy]==")
    assert ".venv" not in _peers.litellm_home().parts
    assert _peers.litellm_home().is_relative_to(_peers.REPO / ".cache")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the CPU clock of another pid is read on Linux")
def test_tree_cpu_counts_a_child_process_of_the_proxy(benchmarks):
    from bench_serve import tree_cpu

    burn = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass\\nimport sys; sys.stdin.read()'],"
        " stdin=subprocess.PIPE)\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.read()\n"
        "child.stdin.close(); child.wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        parent.stdout.readline()
        deadline = time.monotonic() + 30
        while tree_cpu(parent.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree_cpu(parent.pid) >= 0.3, "the child's CPU is not in its parent's tree"
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(30)
