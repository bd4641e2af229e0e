"""Repository-wide pytest set-up.

Hypothesis profiles: ``ci`` (the default) fits a shared 2-core machine where another job may hold
the CPU: no per-example deadline and no ``too_slow`` health check, because wall time there measures
the neighbours, not the code. ``dev`` keeps Hypothesis' own defaults for a quiet workstation.
Choose with ``HYPOTHESIS_PROFILE=dev``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def no_ctxkernel_env(tmp_path, monkeypatch):
    """No ``CTXKERNEL_*`` variable of the caller's environment reaches the test, and the kernel
    home is a temporary folder (a module opts in with ``pytest.mark.usefixtures``)."""
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
