"""Fixtures over :mod:`ctxkernel_decay.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxkernel_decay.testing import Driver, decay_kernel, log_bytes


@pytest.fixture
def kernel(tmp_path: Path) -> Any:
    return decay_kernel(tmp_path / "home")


@pytest.fixture
def session(kernel: Any) -> Any:
    return kernel.open_session()


@pytest.fixture
def driver(session: Any) -> Driver:
    return Driver(session)


@pytest.fixture
def make_decay_kernel(tmp_path: Path) -> Any:
    def factory(**kwargs: Any) -> Any:
        return decay_kernel(tmp_path / "home", **kwargs)

    return factory


@pytest.fixture
def make_driver() -> Any:
    return Driver


@pytest.fixture
def read_log() -> Any:
    return log_bytes
