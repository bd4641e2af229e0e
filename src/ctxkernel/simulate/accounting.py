"""What a recording file holds against what the replay uses: ``source.accounting``.

Every importer counts what the file holds (``raw``), and every difference between that and what
is replayed (``replayed``) is counted under a named reason, so a user can tell a complete import
from one that left part of the session out::

    {"raw":      {"tool_calls": 242, "tool_results": 242, "user_messages": 6, ...},
     "replayed": {"tool_calls": 241, "tool_results": 241, "user_messages": 6, ...},
     "reasons":  {"abandoned_branch": {"tool_calls": 1, "tool_results": 1, ...},
                  "harness_bookkeeping": {"lines": 1725}, ...},
     "synthetic_results": 0, "complete": false}

``reasons[reason][key]`` counts what was not replayed for that reason; ``key`` is one of
:data:`CONTENT_KEYS`, ``lines`` (a line or event that is no message: progress lines, state updates,
snapshots) or ``unanswered_calls`` (``no_result_in_file``: calls replayed whose result the file does
not hold, which get a synthetic error result). For every content key, ``raw - replayed`` is the
sum of its reasons; a gap no reason explains is counted under ``unexplained`` (a bug of the
importer, which the tests refuse). ``complete`` is true when every content key was replayed whole.

:func:`settle` is the last pass of every import: it drops (and counts) results the replay could
not commit, exactly as :class:`~ctxkernel.simulate.replay.Replay` pairs them, so the replay never
skips anything silently.
"""

from __future__ import annotations

from typing import Any

from .recording import AssistantItem, Item, MarkerItem, ToolResultItem, UserItem

#: what a recording holds that the replay can use, counted in ``raw`` and ``replayed``
CONTENT_KEYS: tuple[str, ...] = ("tool_calls", "tool_results", "user_messages", "assistant_messages", "sidechain_calls")
#: every reason an importer names (docs/simulate.md lists what each means)
REASONS: tuple[str, ...] = (
    "abandoned_branch",
    "sidechain",
    "subagent",
    "malformed_line",
    "empty_message",
    "harness_summary",
    "harness_bookkeeping",
    "strategy_artifact",
    "unknown_type",
    "result_without_call",
    "duplicate_result",
    "result_out_of_order",
    "no_result_in_file",
    "unexplained",
)


class Accounting:
    """Counts kept by one import: what the file holds, and why something was not replayed."""

    def __init__(self) -> None:
        self.raw: dict[str, int] = dict.fromkeys(CONTENT_KEYS, 0)
        self.reasons: dict[str, dict[str, int]] = {}
        #: call ids whose result the file holds somewhere (on the replayed chain or not)
        self.results_in_file: set[str] = set()

    def saw(self, key: str, n: int = 1) -> None:
        self.raw[key] += n

    def skip(self, reason: str, key: str, n: int = 1) -> None:
        """``n`` of ``key`` (a content key, ``lines`` or ``unanswered_calls``) not replayed for ``reason``."""
        if n:
            of = self.reasons.setdefault(reason, {})
            of[key] = of.get(key, 0) + n

    def report(self, items: list[Item], skipped_lines: int = 0) -> dict[str, Any]:
        """The ``source.accounting`` object for the replayed ``items``."""
        if skipped_lines:
            self.reasons.setdefault("malformed_line", {})["lines"] = skipped_lines
        replayed = replayed_counts(items)
        for key in CONTENT_KEYS:
            explained = sum(of.get(key, 0) for of in self.reasons.values())
            gap = self.raw[key] - replayed[key] - explained
            if gap:
                # what a skipped (malformed) line held is counted by the scan but never replayed
                self.skip("malformed_line" if skipped_lines and gap > 0 else "unexplained", key, gap)
        synthetic = self.reasons.get("no_result_in_file", {}).get("unanswered_calls", 0)
        return {
            "raw": dict(self.raw),
            "replayed": replayed,
            "reasons": {r: dict(sorted(self.reasons[r].items())) for r in sorted(self.reasons)},
            "synthetic_results": synthetic,
            "complete": all(self.raw[k] == replayed[k] for k in CONTENT_KEYS),
        }


def replayed_counts(items: list[Item]) -> dict[str, int]:
    counts = dict.fromkeys(CONTENT_KEYS, 0)
    for item in items:
        if isinstance(item, AssistantItem):
            counts["assistant_messages"] += 1
            counts["tool_calls"] += len(item.message.tool_calls)
        elif isinstance(item, ToolResultItem):
            counts["tool_results"] += 1
        elif isinstance(item, UserItem):
            counts["user_messages"] += 1
    return counts


def saw_items(accounting: Accounting, items: list[Item]) -> None:
    """Count ``items`` as what the file holds (formats whose every message is parsed into one)."""
    for key, n in replayed_counts(items).items():
        accounting.saw(key, n)


def settle(items: list[Item], accounting: Accounting) -> list[Item]:
    """Keep only the results the replay commits, counting the rest; count calls left unanswered.

    The replay answers a call only while it is pending: after its assistant message and before
    the next user message, assistant message or turn end, once. A result anywhere else is dropped
    here under a reason; a call no result answers in time gets a synthetic one from the replay,
    counted as ``no_result_in_file`` when the file holds no result for it, else
    ``result_out_of_order``."""
    kept: list[Item] = []
    pending: dict[str, None] = {}
    committed: set[str] = set()
    calls: set[str] = set()
    late: list[str] = []

    def close() -> None:
        for call_id in pending:
            late.append(call_id)
        pending.clear()

    for item in items:
        if isinstance(item, ToolResultItem):
            if item.call_id in pending:
                del pending[item.call_id]
                committed.add(item.call_id)
                kept.append(item)
            elif item.call_id in committed:
                accounting.skip("duplicate_result", "tool_results")
            elif item.call_id in calls:
                accounting.skip("result_out_of_order", "tool_results")
            else:
                accounting.skip("result_without_call", "tool_results")
            continue
        if isinstance(item, UserItem | AssistantItem) or (isinstance(item, MarkerItem) and item.kind == "turn_end"):
            close()
        if isinstance(item, AssistantItem):
            for call in item.message.tool_calls:
                pending[call.id] = None
                calls.add(call.id)
        kept.append(item)
    close()
    for call_id in late:
        absent = call_id not in accounting.results_in_file and call_id.split("~")[0] not in accounting.results_in_file
        accounting.skip("no_result_in_file" if absent else "result_out_of_order", "unanswered_calls")
    return kept


__all__ = ["CONTENT_KEYS", "REASONS", "Accounting", "replayed_counts", "saw_items", "settle"]
