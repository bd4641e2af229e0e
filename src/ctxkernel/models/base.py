"""The model adapter protocol: what the agent loop and summarizers call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..messages import Message


@dataclass
class Reply:
    """A model's answer: the assistant message and the provider's usage figures."""

    message: Message
    usage: dict[str, int] | None = None
    provider: str = ""
    model: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@runtime_checkable
class ModelAdapter(Protocol):
    provider: str
    model: str

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        """Send one request; raise :class:`ctxkernel.ContextOverflowError` when it does not fit."""
