"""Repository-wide pytest set-up.

Hypothesis profiles: ``ci`` (the default) fits a shared 2-core machine where another job may hold
the CPU: no per-example deadline and no ``too_slow`` health check, because wall time there measures
the neighbours, not the code. ``dev`` keeps Hypothesis' own defaults for a quiet workstation.
Choose with ``HYPOTHESIS_PROFILE=dev``.

Parallel runs (pytest-xdist; ``make test`` runs ``-n auto --dist loadfile``, so the tests of a file
share one worker and its module fixtures are built once): the files holding slow tests are handed
out first, so no worker is left with a long test at the end while the other idles, and every test
starts from the library's default logging, whatever the test before it on the same worker set up.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from ctxkernel.logging import reset_logging

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a test marked slow first (a stable sort: files keep their order among
    themselves, and so do the tests of a file, so a module's fixtures are still built once)."""
    slow_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)


@pytest.fixture(autouse=True)
def _library_logging():
    """A CLI test configures structlog for the whole process (``configure_logging``): undo it."""
    yield
    reset_logging()
