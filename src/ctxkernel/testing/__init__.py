"""Public test helpers for strategy authors, shipped as a pytest plugin.

Enable in a plugin's tests with one line in ``conftest.py``::

    pytest_plugins = ["ctxkernel.testing"]

(It is also registered through the ``pytest11`` entry point, so installing ctxkernel is enough.)

Fixtures: ``ctx_home`` (a temporary kernel home), ``make_kernel`` (a kernel with entry-point
discovery off, strategies given in code), ``scripted_model``. Helpers: :func:`throwaway_plugin`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..kernel import Kernel
from ..models.scripted import ScriptedModel
from .conformance import (
    ConformanceError,
    ConformanceReport,
    ConformanceStep,
    SnapshotCut,
    check_conformance,
    check_snapshot_equivalence,
    request_orphans,
)
from .kit import CountingTokenizer, FsyncCounter, build_kernel, make_profile, throwaway_plugin

try:  # the helpers work without pytest; the fixtures need it
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def ctx_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        home = tmp_path / "ctxkernel-home"
        home.mkdir()
        monkeypatch.setenv("CTXKERNEL_HOME", str(home))
        return home

    @pytest.fixture
    def make_kernel(ctx_home: Path) -> Any:
        def factory(**kwargs: Any) -> Kernel:
            return build_kernel(ctx_home, **kwargs)

        return factory

    @pytest.fixture
    def scripted_model() -> Any:
        return ScriptedModel


__all__ = [
    "ConformanceError",
    "ConformanceReport",
    "ConformanceStep",
    "CountingTokenizer",
    "FsyncCounter",
    "SnapshotCut",
    "build_kernel",
    "check_conformance",
    "check_snapshot_equivalence",
    "make_profile",
    "request_orphans",
    "throwaway_plugin",
]
