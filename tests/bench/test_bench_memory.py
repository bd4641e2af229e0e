"""benchmarks/bench_memory.py reads the peak of the child it starts, not its parent's.

Linux carries ``ru_maxrss`` over ``exec``: a child started by a large benchmark process began at
that process's peak, and the memory row read 0 growth whatever the open cost (the eighth round's
record). The child's ``VmHWM`` starts afresh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
LARGE = 256 << 20


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_the_child_peak_is_its_own_not_the_parents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_memory

    held = bytearray(LARGE)
    held[::4096] = b"\1" * len(range(0, LARGE, 4096))  # touch every page: resident in this process
    child = bench_memory.PEAK_KIB + "\nprint(peak_kib())\n"
    peak = int(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
    assert peak * 1024 < LARGE // 2, f"the child's peak ({peak} KiB) includes its parent's {LARGE >> 20} MiB"
    assert held[4096] == 1
