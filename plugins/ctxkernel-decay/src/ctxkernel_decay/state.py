"""Position state: the fold of a session log into anchor ids and blocks.

Every addressable surface node owns one position id (its left anchor ``⟦p<id>⟧``). Ids are
identities, not counts: when a range is compressed, the ids of its interior go back to a free
list and newer nodes reuse them, smallest first. A block keeps the ids of the two edges of the
range it replaced (``left`` and ``right``); ``right`` is ``None`` when the range held a single
anchored node.

Everything here is derived from ``ctx.events`` alone, in log order, so a restart or a second
process folds the same log into the same state. Anchors are never read from message text.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxkernel import Event, Message

NAME = "decay"
BLOCK_FORM = "block"
NOTICE_FORM = "notice"
#: the kind of the seed's manual `/compact` checkpoint: ordinary history to replay, not a decay block
CHECKPOINT_KIND = "checkpoint"

# kernel event types (the vocabulary is documented in ctxkernel.events)
USER_MESSAGE = "user/message"
ASSISTANT_MESSAGE = "assistant/message"
TOOL_RESULT = "tool/result"
SURFACE_DROP = "surface/drop"
STEP_START = "step/start"
COMPACTION_SUMMARY = "compaction/summary"
MESSAGE_TYPES = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT})
REMINDER_EVENT = f"{NAME}/reminder"
BASELINE_EVENT = f"{NAME}/baseline"

#: remembered reuses (the count is exact; the list keeps the newest for the panel)
REUSE_MEMORY = 64


def is_addressable(message: Message) -> bool:
    """Assistant messages are anchored only through an existing text block: a tool-call-only
    (or reasoning-only) turn stays unanchored so its index-aligned content is never rewritten."""
    if message.role == "assistant":
        return any(b.type == "text" and b.text.strip() for b in message.content)
    return True


@dataclass
class Block:
    """A compressed range: its edge ids, tier, summary and where it came from."""

    seq: int  # the replacement event's seq (the block's surface node)
    left: int
    right: int | None
    tier: int
    summary: str
    topic: str | None
    sources: list[int]  # seqs of the original events the block stands for
    compaction_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "left": self.left,
            "right": self.right,
            "tier": self.tier,
            "summary": self.summary,
            "topic": self.topic,
            "sources": list(self.sources),
            "compaction_id": self.compaction_id,
        }


@dataclass
class DecayState:
    cursor: int = 0  # events folded so far
    next_id: int = 1
    free: list[int] = field(default_factory=list)  # a heap: the smallest free id is reused first
    reuse_count: int = 0
    reused: list[list[int]] = field(default_factory=list)  # newest [id, seq] reuses
    anchor_of: dict[int, int] = field(default_factory=dict)  # visible seq -> its left id
    owner: dict[int, int] = field(default_factory=dict)  # live id -> seq (a block's right included)
    blocks: dict[int, Block] = field(default_factory=dict)  # block seq -> block
    steps: int = 0  # step/start events seen (reminder cooldowns count steps)
    baseline: int = 0  # pressure tokens growth is measured from
    fired: dict[int, int] = field(default_factory=dict)  # reminder level -> step it last fired
    last_reminder_seq: int = -1
    last_compaction_seq: int = -1  # the newest compaction/summary (any strategy)
    baseline_seq: int = -1  # the event that set ``baseline``
    pending: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # decay compactions being committed

    # -- ids ----------------------------------------------------------------------------------------
    def _alloc(self, seq: int) -> int:
        if self.free:
            pid = heapq.heappop(self.free)
            self.reuse_count += 1
            self.reused.append([pid, seq])
            del self.reused[:-REUSE_MEMORY]
        else:
            pid = self.next_id
            self.next_id += 1
        self.owner[pid] = seq
        return pid

    def _release(self, pid: int | None) -> None:
        if pid is not None and pid in self.owner:
            del self.owner[pid]
            heapq.heappush(self.free, pid)

    def _forget(self, seq: int) -> None:
        """A node leaves the surface: its ids go back to the free list."""
        self._release(self.anchor_of.pop(seq, None))
        block = self.blocks.pop(seq, None)
        if block is not None:
            self._release(block.right)

    # -- the fold -----------------------------------------------------------------------------------
    def fold(self, events: Sequence[Event]) -> int:
        """Fold ``events[self.cursor:]``; returns how many were new. O(new events)."""
        start = self.cursor
        for event in events[start:]:
            self._apply(event)
            self.cursor = event.seq + 1
        return self.cursor - start

    def _apply(self, event: Event) -> None:
        etype, data = event.type, event.data
        if etype == STEP_START:
            self.steps += 1
        elif etype == REMINDER_EVENT:
            self.fired[int(data["level"])] = self.steps
            self.baseline = int(data["tokens"])
            self.baseline_seq = event.seq
            self.last_reminder_seq = event.seq
        elif etype == BASELINE_EVENT:
            # a compression lowered pressure: growth is measured from here, and every level it
            # brought pressure back under may remind again as soon as it is crossed again
            self.baseline = int(data["tokens"])
            self.baseline_seq = event.seq
            for level in data.get("rearm", []):
                self.fired.pop(int(level), None)
        elif etype == COMPACTION_SUMMARY:
            self.last_compaction_seq = event.seq
            if data.get("strategy") == NAME and data.get("kind") != CHECKPOINT_KIND:
                self.pending[data["compaction_id"]] = list(data.get("spans") or [])
        elif etype in MESSAGE_TYPES or etype == SURFACE_DROP:
            self._apply_surface(event)

    def _apply_surface(self, event: Event) -> None:
        op = event.surface or {}
        kind = op.get("op")
        if kind == "append":
            message = Message.from_dict(event.data["message"])
            if is_addressable(message):
                self.anchor_of[event.seq] = self._alloc(event.seq)
            return
        cites: list[int] = list(op.get("cites") or [])
        if kind == "remove":
            for seq in cites:
                self._forget(seq)
            return
        if event.type == TOOL_RESULT:
            # a content-only replacement of one result (a prune): the same node keeps its id
            old = cites[0]
            pid = self.anchor_of.pop(old, None)
            if pid is not None:
                self.anchor_of[event.seq] = pid
                self.owner[pid] = event.seq
            return
        span = self._decay_span(event, cites)
        if span is None:
            # any other strategy's replacement (e.g. a basic checkpoint) is an ordinary node
            for seq in cites:
                self._forget(seq)
            message = Message.from_dict(event.data["message"])
            if is_addressable(message):
                self.anchor_of[event.seq] = self._alloc(event.seq)
            return
        edges: list[int] = []  # anchored ids of the range, in surface order
        tier = 0
        sources: list[int] = []
        anchor_of, blocks = self.anchor_of, self.blocks
        for seq in cites:  # one pass: the range's nodes leave the surface
            pid = anchor_of.pop(seq, None)
            if pid is not None:
                edges.append(pid)
            block = blocks.pop(seq, None)
            if block is not None:
                if block.right is not None:
                    edges.append(block.right)
                tier = max(tier, block.tier)
                sources.extend(block.sources)
            else:
                sources.append(seq)
        left = edges[0] if edges else None
        right = edges[-1] if len(edges) > 1 else None
        for pid in edges[1:-1]:  # interior ids go back to the free list; the two edges stay
            self._release(pid)
        if left is None:  # a range of unanchored nodes only (not produced by our tool)
            left = self._alloc(event.seq)
        self.anchor_of[event.seq] = left
        self.owner[left] = event.seq
        if right is not None:
            self.owner[right] = event.seq
        self.blocks[event.seq] = Block(
            seq=event.seq,
            left=left,
            right=right,
            tier=tier + 1,
            summary=str(span.get("block_summary", "")),
            topic=span.get("topic"),
            sources=sorted(sources),
            compaction_id=event.data["compaction_id"],
        )

    def _decay_span(self, event: Event, cites: list[int]) -> dict[str, Any] | None:
        spans = self.pending.get(event.data.get("compaction_id", ""))
        if not spans:
            return None
        for i, span in enumerate(spans):
            if list(span.get("cites") or []) == cites:
                spans.pop(i)
                if not spans:
                    self.pending.pop(event.data["compaction_id"], None)
                return span
        return None

    # -- views ---------------------------------------------------------------------------------------
    def right_of(self, seq: int) -> int | None:
        block = self.blocks.get(seq)
        return block.right if block else None

    def resolve(self, pid: int) -> int | None:
        """The visible seq that owns id ``pid`` (a node's left or a block's right)."""
        return self.owner.get(pid)

    def to_dict(self) -> dict[str, Any]:
        """Everything derived, JSON-ready (used for snapshots and replay comparisons)."""
        # field by field rather than dataclasses.asdict, which deep-copies every value through
        # its generic recursion (5 ms for a few hundred nodes, on every decay commit)
        return {
            "cursor": self.cursor,
            "next_id": self.next_id,
            "free": sorted(self.free),
            "reuse_count": self.reuse_count,
            "reused": [list(pair) for pair in self.reused],
            "anchor_of": {str(k): v for k, v in sorted(self.anchor_of.items())},
            "owner": {str(k): v for k, v in sorted(self.owner.items())},
            "blocks": {str(k): v.to_dict() for k, v in sorted(self.blocks.items())},
            "steps": self.steps,
            "baseline": self.baseline,
            "fired": {str(k): v for k, v in sorted(self.fired.items())},
            "last_reminder_seq": self.last_reminder_seq,
            "last_compaction_seq": self.last_compaction_seq,
            "baseline_seq": self.baseline_seq,
            "pending": copy.deepcopy(self.pending),  # plain JSON from the log, usually empty
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DecayState:
        """Rebuild from :meth:`to_dict` output (raises on any malformed field)."""
        state = cls(
            cursor=int(raw["cursor"]),
            next_id=int(raw["next_id"]),
            free=[int(x) for x in raw["free"]],
            reuse_count=int(raw["reuse_count"]),
            reused=[[int(a), int(b)] for a, b in raw["reused"]],
            anchor_of={int(k): int(v) for k, v in raw["anchor_of"].items()},
            owner={int(k): int(v) for k, v in raw["owner"].items()},
            blocks={int(k): Block(**v) for k, v in raw["blocks"].items()},
            steps=int(raw["steps"]),
            baseline=int(raw["baseline"]),
            fired={int(k): int(v) for k, v in raw["fired"].items()},
            last_reminder_seq=int(raw["last_reminder_seq"]),
            last_compaction_seq=int(raw["last_compaction_seq"]),
            baseline_seq=int(raw["baseline_seq"]),
            pending={str(k): list(v) for k, v in raw["pending"].items()},
        )
        heapq.heapify(state.free)
        return state


def replay(events: Sequence[Event]) -> DecayState:
    state = DecayState()
    state.fold(events)
    return state
