"""The test kit's helpers: profiles and kernels for a test, a throwaway plugin, counting doubles
(re-exported by :mod:`ctxkernel.testing`, which is what tests import)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ProfileError
from ..kernel import Kernel
from ..profile import Profile, builtin_profile, load_profile
from ..settings_check import format_validation_error
from ..store.jsonl import JsonlStore


def make_profile(path: Path | None = None, **overrides: Any) -> Profile:
    """A profile from a file (or the built-in defaults) with top-level tables overridden."""
    profile = load_profile(path) if path else builtin_profile()
    for key, value in overrides.items():
        current = getattr(profile, key)
        if isinstance(current, BaseModel) and isinstance(value, dict):
            # validated like the file's table (model_copy(update=...) would take a window of 0)
            table = type(current)
            try:
                value = table.model_validate({**current.model_dump(), **value})
            except ValidationError as exc:
                raise ProfileError(format_validation_error(exc, "make_profile", table, key)) from None
        setattr(profile, key, value)
    return profile


def check_strategy_names(strategies: Any, caller: str) -> None:
    """Refuse ``strategies`` unless it is a list of names (TypeError): a string would be taken
    letter by letter, a table of settings for its keys with the settings dropped."""
    if isinstance(strategies, (str, bytes, dict)) or not all(isinstance(s, str) for s in strategies):
        msg = (
            f"{caller}(strategies=...) takes the list of strategy names, got {strategies!r:.120}; "
            'give their [strategies.<name>] tables as settings={"<name>": {...}}'
        )
        raise TypeError(msg)


def build_kernel(
    home: Path,
    *,
    strategies: list[str] | None = None,
    plugins: list[tuple[str, Any]] | None = None,
    entry_points: bool = False,
    profile: Profile | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
    fsync: bool = True,
    **profile_tables: Any,
) -> Kernel:
    """A kernel on a jsonl store in ``home``. ``strategies`` lists the profile's strategies and
    ``settings`` holds their ``[strategies.<name>]`` tables (as in :func:`check_conformance`).
    With ``entry_points=False`` only built-ins and the ``plugins`` given here are available.
    ``fsync=False`` skips the store's fsyncs (tests whose subject is not durability run faster)."""
    if strategies is not None:
        check_strategy_names(strategies, "build_kernel")
    profile = profile or make_profile(**profile_tables)
    if strategies is not None:
        profile.profile.strategies = list(strategies)
    if settings is not None:
        profile.strategies = {**profile.strategies, **settings}
    return Kernel(profile, store=JsonlStore(home, fsync=fsync), home=home, entry_points=entry_points, plugins=plugins)


@contextlib.contextmanager
def throwaway_plugin(kernel: Kernel, plugin: Any, name: str) -> Iterator[Any]:
    """Register ``plugin`` as strategy ``name`` for the block; always unregistered after."""
    kernel.plugins.register(plugin, name, distribution="(throwaway)")
    try:
        yield plugin
    finally:
        kernel.plugins.unregister(name)


class FsyncCounter:
    """Counts this process's ``os.fsync`` calls while a test runs (``calls``): how many durable
    writes an action costs, e.g. that a strategy's transaction is one. Undone with the test's
    ``monkeypatch``."""

    def __init__(self, monkeypatch: Any) -> None:
        self.calls = 0
        real = os.fsync

        def counting(fd: int) -> None:
            self.calls += 1
            real(fd)

        monkeypatch.setattr(os, "fsync", counting)


class CountingTokenizer:
    """A tokenizer that records every text it is asked to count (``texts``) and answers with
    ``inner``'s count: set it as ``session.meter.tokenizer`` to see what an action tokenises."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return int(self.inner.count(text))
