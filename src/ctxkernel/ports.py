"""What the kernel's own modules see of a session: :class:`SessionPort`.

The transaction (:mod:`ctxkernel.compaction`), the request bound (:mod:`ctxkernel.guard`), the
compaction lease, the manual controls, the instruction ledger, snapshots and the timeline all act
on a session. They type it with this protocol instead of importing the Session: the Session is
built from them, so an import of it (even one for type checking only) would close a cycle. The
Session satisfies the protocol; mypy checks that wherever it passes itself.

Only types from below this layer appear here (the log's vocabulary, the surface, the meter, the
store, the profile, the context); the kernel, its hooks and the instruction ledger are ``Any``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .context import Context
    from .events import Event, EventSpec
    from .messages import Message
    from .meter import Meter, Pressure
    from .profile import ModelSettings
    from .spans import CommitResult, Span
    from .store.base import EventStore
    from .surface import Surface


class SessionPort(Protocol):
    """A session as the kernel's modules below the Session act on it."""

    @property
    def id(self) -> str: ...
    @property
    def kernel(self) -> Any: ...
    @property
    def store(self) -> EventStore: ...
    @property
    def holder(self) -> dict[str, Any]: ...
    @property
    def lock(self) -> threading.RLock: ...
    @property
    def context(self) -> Context: ...

    # -- the log and what is folded from it ------------------------------------------------------------
    @property
    def events(self) -> Sequence[Event]: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def surface(self) -> Surface: ...
    @property
    def meter(self) -> Meter: ...
    @property
    def turn(self) -> int: ...
    @property
    def turn_open(self) -> bool: ...
    @property
    def step(self) -> int: ...
    @property
    def step_open(self) -> bool: ...
    @property
    def open_compaction(self) -> dict[str, Any] | None: ...
    @property
    def route(self) -> dict[str, Any] | None: ...
    @property
    def disabled_strategies(self) -> frozenset[str]: ...
    @property
    def state(self) -> dict[str, Any]: ...
    @property
    def snapshot_indexes(self) -> dict[str, Any]: ...

    # -- the instruction ledger (ctxkernel.instructions) ---------------------------------------------
    @property
    def instructions(self) -> list[Any]: ...
    @property
    def instruction_ledger(self) -> Any: ...
    @property
    def instruction_costs(self) -> dict[tuple[str, int], int]: ...
    @property
    def instruction_texts(self) -> dict[int, tuple[Message, str]]: ...
    @property
    def work_ledger(self) -> Any: ...

    # -- the request bound's marks (ctxkernel.guard.OversizedMarks) ------------------------------------
    @property
    def oversized(self) -> Any: ...

    def refresh(self) -> int: ...

    def append(
        self, batch: Sequence[EventSpec], *, durable: bool = True, _parsed: dict[int, Message] | None = None
    ) -> int: ...

    def append_one(self, type: str, data: dict[str, Any], surface: dict[str, Any] | None = None) -> int: ...

    def pressure(self) -> Pressure: ...

    def model_settings(self) -> ModelSettings: ...

    def compact(
        self, spans: Span | Sequence[Span], *, strategy: str, kind: str = "summary", **kwargs: Any
    ) -> CommitResult: ...

    def owns_tool(self, name: str) -> bool: ...

    def enabled_strategies(self) -> list[str]: ...


__all__ = ["SessionPort"]
