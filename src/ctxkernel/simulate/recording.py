"""A recorded agent session in the kernel's own vocabulary, ready to be replayed.

Importers (:mod:`ctxkernel.simulate.importers`) and synthetic workloads
(:mod:`ctxkernel.simulate.workloads`) produce a :class:`Recording`: an ordered list of items
that a harness would have fed to the Session API: the user's messages, the model's replies (one
per model request, with the provider's usage when it was recorded), tool results, and markers
such as the point where the recording harness compacted its own context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import CtxKernelError
from ..messages import Message


class RecordingError(CtxKernelError):
    """A recording could not be read: the message names the file, the line and what was expected."""


@dataclass(frozen=True, slots=True)
class UserItem:
    """A user message; ``instruction`` is False for harness-injected context (environment, meta).
    ``time`` is when it was recorded (seconds since the epoch), when the recording says."""

    text: str
    instruction: bool = True
    time: float | None = None


@dataclass(frozen=True, slots=True)
class AssistantItem:
    """One recorded model request's reply; ``usage`` is what the provider reported, if recorded;
    ``time`` is when the reply was recorded (seconds since the epoch), when the recording says."""

    message: Message
    usage: dict[str, int] | None = None
    time: float | None = None


@dataclass(frozen=True, slots=True)
class ToolResultItem:
    call_id: str
    content: str
    is_error: bool = False
    name: str | None = None


@dataclass(frozen=True, slots=True)
class MarkerItem:
    """A point of note in the recording that is not a message (e.g. ``compact_boundary``)."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


Item = UserItem | AssistantItem | ToolResultItem | MarkerItem


@dataclass
class Recording:
    """What a simulation replays. ``source`` describes the input for the report."""

    items: list[Item]
    source: dict[str, Any] = field(default_factory=dict)
    #: the recording harness's system prompt, when recorded (replayed as the profile's own)
    system: str | None = None
    #: lines skipped by ``--lenient`` (each: line number and why)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    #: what the file holds against what is replayed (:mod:`.accounting`); None for a workload
    accounting: dict[str, Any] | None = None
    #: lines or events an importer read and did not replay, by reason (counted into ``accounting``)
    not_replayed: dict[str, int] = field(default_factory=dict)
    #: what is computed once from the items and shared by every profile's replay (recall needs)
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def requests(self) -> int:
        return sum(1 for i in self.items if isinstance(i, AssistantItem))

    @property
    def recorded_peak_input_tokens(self) -> int | None:
        """The largest prompt the recording's provider reported, when usage was recorded."""
        peaks = [i.usage.get("input_tokens", 0) for i in self.items if isinstance(i, AssistantItem) and i.usage]
        return max(peaks) if peaks else None

    def describe(self) -> dict[str, Any]:
        """The ``source`` object of the JSON report (the same keys for every kind of input)."""
        counts = {"user": 0, "assistant": 0, "tool_result": 0, "marker": 0}
        tool_calls = 0
        for item in self.items:
            if isinstance(item, UserItem):
                counts["user"] += 1
            elif isinstance(item, AssistantItem):
                counts["assistant"] += 1
                tool_calls += len(item.message.tool_calls)
            elif isinstance(item, ToolResultItem):
                counts["tool_result"] += 1
            else:
                counts["marker"] += 1
        base = dict.fromkeys(("kind", "format", "file", "run", "runs", "workload", "seed"))
        return {
            **base,
            **{k: v for k, v in self.source.items() if k in base},
            "system_prompt_chars": len(self.system or ""),
            "recorded_requests": counts["assistant"],
            "user_messages": counts["user"],
            "tool_calls": tool_calls,
            "tool_results": counts["tool_result"],
            "markers": sorted({i.kind for i in self.items if isinstance(i, MarkerItem)}),
            "recorded_peak_input_tokens": self.recorded_peak_input_tokens,
            "skipped_lines": len(self.skipped),
            "accounting": self.accounting,
        }
