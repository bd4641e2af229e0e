"""The rollover state of one session, rebuilt from its log alone.

Everything the strategy knows is folded from these events (a cursor keeps the work per request
O(new events)):

``rollover/window``          the session's first window id (written once, before the first step)
``rollover/intent``          ``new_context`` was called: a switch is owed at the next pre-step
``compaction/summary``       ``kind="window"`` by ``rollover``: a committed switch; its data holds the
                             new, previous and first window ids and the intent it consumed
``rollover/failed``          a switch that could not be done (fail loud); consumes its intent
``user/message``             with ``data.rollover_reminder``: the single-shot reminder of a window
``rollover/overflow``        a provider overflow given back to the harness (no more retries)
``assistant/message``        the model answered: the overflow retry streak starts over
``turn/start``               the user's pending input (their messages of the open turn) starts over

A switch commits atomically (summary, seed and end in one batch), so a log cut at any point
replays to the old window or the new one, never a mixture, and an intent consumed by a
committed switch is never replayed into a second one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxkernel.events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, TURN_START, USER_MESSAGE

from .seed import FIRST_DENSITY_GUESS, NoteCache
from .strategy import NAME, STRATEGY

if TYPE_CHECKING:
    from ctxkernel import Context, Event

WINDOW_EVENT = f"{NAME}/window"
INTENT_EVENT = f"{NAME}/intent"
FAILED_EVENT = f"{NAME}/failed"
OVERFLOW_EVENT = f"{NAME}/overflow"
REMINDER_KEY = "rollover_reminder"
WINDOW_KIND = "window"
#: recent user instructions kept in the state (the seed shows at most 50)
MAX_INSTRUCTIONS = 64
#: the user's messages of the open turn the seed repeats as pending input (the newest)
PENDING_INPUTS = 8


@dataclass
class RolloverState:
    cursor: int = 0
    first: str | None = None
    previous: str | None = None
    current: str | None = None
    chain: list[str] = field(default_factory=list)
    #: seq of the summary that opened the current window (None for the first window)
    opened_by: int | None = None
    #: seq of the current window's seed message (None for the first window)
    seed_seq: int | None = None
    reminded: set[str] = field(default_factory=set)
    pending: dict[str, Any] | None = None
    resolved: set[str] = field(default_factory=set)
    failures: list[dict[str, Any]] = field(default_factory=list)
    triggers: dict[str, int] = field(default_factory=dict)
    #: the latest ``rollover/failed`` event's data (window, trigger, surface size): an automatic
    #: switch is not retried until the situation differs from it (folded from the log, so a
    #: restarted process backs off the same way)
    last_failure: dict[str, Any] | None = None
    #: protective switches (committed or failed) since the model last answered or an overflow
    #: was given back to the harness: folded from the log, so a restart does not reset the
    #: retry budget (seed 002 §3.6: no unprotected in-memory state)
    overflow_streak: int = 0
    #: seqs of the user's own messages: the first one, and the most recent ones
    first_instruction: int | None = None
    instructions: list[int] = field(default_factory=list)
    #: seqs of the user's own messages since the last ``turn/start`` (the newest PENDING_INPUTS),
    #: so a switch finds its pending input without walking back through a long turn
    turn_inputs: list[int] = field(default_factory=list)
    #: the last seed's rendered note blocks and their token counts (not folded: a cache)
    note_cache: NoteCache = field(default_factory=NoteCache)
    #: tokens per byte of the last seed counted exactly (not folded: the next seed's first guess)
    seed_density: float = FIRST_DENSITY_GUESS

    @property
    def number(self) -> int:
        return len(self.chain)

    def fold(self, event: Event) -> None:
        t, d = event.type, event.data
        if t == WINDOW_EVENT:
            window_id = d.get("window_id")
            if self.current is None and isinstance(window_id, str):
                self.first = self.current = window_id
                self.chain = [window_id]
        elif t == INTENT_EVENT:
            intent_id = d.get("intent_id")
            if isinstance(intent_id, str) and intent_id not in self.resolved:
                self.pending = {**d, "seq": event.seq}
        elif t == COMPACTION_SUMMARY and d.get("kind") == WINDOW_KIND and d.get("strategy") == NAME:
            window_id = d.get("window_id")
            if not isinstance(window_id, str):
                return
            if self.first is None:
                self.first = d.get("first_window_id") or d.get("previous_window_id") or window_id
                self.chain = [self.first] if self.first != window_id else []
            self.previous, self.current = self.current, window_id
            self.chain.append(window_id)
            self.opened_by, self.seed_seq = event.seq, event.seq + 1
            self.triggers[d.get("trigger", "?")] = self.triggers.get(d.get("trigger", "?"), 0) + 1
            self._resolve(d.get("intent_id"))
            if d.get("trigger") == "overflow":
                self.overflow_streak += 1
        elif t == FAILED_EVENT:
            self.failures.append({**d, "seq": event.seq})
            self.last_failure = {**d, "seq": event.seq}
            self._resolve(d.get("intent_id"))
            if d.get("trigger") == "overflow":
                self.overflow_streak += 1
        elif t in (ASSISTANT_MESSAGE, OVERFLOW_EVENT):
            self.overflow_streak = 0
        elif t == TURN_START:
            self.turn_inputs = []
        elif t == USER_MESSAGE:
            if isinstance(d.get(REMINDER_KEY), str):
                self.reminded.add(d[REMINDER_KEY])
            elif (event.surface or {}).get("op") == "append" and d["message"].get("source", {}).get(
                "kind", "user"
            ) == "user":
                # the user's own words: the seed repeats recent ones verbatim (never summarised)
                if self.first_instruction is None:
                    self.first_instruction = event.seq
                self.instructions.append(event.seq)
                if len(self.instructions) > 2 * MAX_INSTRUCTIONS:
                    del self.instructions[:-MAX_INSTRUCTIONS]
                self.turn_inputs.append(event.seq)
                if len(self.turn_inputs) > 2 * PENDING_INPUTS:
                    del self.turn_inputs[:-PENDING_INPUTS]

    def _resolve(self, intent_id: Any) -> None:
        if isinstance(intent_id, str):
            self.resolved.add(intent_id)
            if self.pending is not None and self.pending.get("intent_id") == intent_id:
                self.pending = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_window_id": self.first,
            "previous_window_id": self.previous,
            "current_window_id": self.current,
            "window_number": self.number,
            "rollovers": max(0, self.number - 1),
            "triggers": dict(self.triggers),
            "pending_intent": None
            if self.pending is None
            else {
                "intent_id": self.pending.get("intent_id"),
                "next_goal": self.pending.get("next_goal"),
                "seq": self.pending.get("seq"),
            },
            "reminded_current_window": self.current in self.reminded,
            "failures": len(self.failures),
        }

    # -- session snapshots -------------------------------------------------------------------------
    def folded(self) -> dict[str, Any]:
        """Everything the fold derives, as plain JSON (not the rendered note-block cache)."""
        return {
            "cursor": self.cursor,
            "first": self.first,
            "previous": self.previous,
            "current": self.current,
            "chain": list(self.chain),
            "opened_by": self.opened_by,
            "seed_seq": self.seed_seq,
            "reminded": sorted(self.reminded),
            "pending": self.pending,
            "resolved": sorted(self.resolved),
            "failures": list(self.failures),
            "triggers": dict(self.triggers),
            "last_failure": self.last_failure,
            "overflow_streak": self.overflow_streak,
            "first_instruction": self.first_instruction,
            "instructions": list(self.instructions),
            "turn_inputs": list(self.turn_inputs),
        }

    @classmethod
    def from_folded(cls, data: dict[str, Any], log_length: int) -> RolloverState:
        """Rebuild from :meth:`folded` output; raises on a field of the wrong shape."""
        cursor = data["cursor"]
        if type(cursor) is not int or not 0 < cursor <= log_length:
            msg = f"cursor {cursor!r} is outside the log (length {log_length})"
            raise ValueError(msg)
        chain, reminded, resolved = data["chain"], data["reminded"], data["resolved"]
        if not all(isinstance(x, str) for x in [*chain, *reminded, *resolved]):
            msg = "chain, reminded and resolved must hold window and intent ids (strings)"
            raise ValueError(msg)
        seqs = [
            data["opened_by"],
            data["seed_seq"],
            data["first_instruction"],
            *data["instructions"],
            *data["turn_inputs"],
        ]
        if not all(x is None or type(x) is int for x in seqs) or type(data["overflow_streak"]) is not int:
            msg = (
                "opened_by, seed_seq, first_instruction, instructions, turn_inputs and overflow_streak must be integers"
            )
            raise ValueError(msg)
        return cls(
            cursor=cursor,
            first=data["first"],
            previous=data["previous"],
            current=data["current"],
            chain=list(chain),
            opened_by=data["opened_by"],
            seed_seq=data["seed_seq"],
            reminded=set(reminded),
            pending=data["pending"],
            resolved=set(resolved),
            failures=list(data["failures"]),
            triggers={str(k): int(v) for k, v in data["triggers"].items()},
            last_failure=data["last_failure"],
            overflow_streak=data["overflow_streak"],
            first_instruction=data["first_instruction"],
            instructions=list(data["instructions"]),
            turn_inputs=list(data["turn_inputs"]),
        )


#: the format of :meth:`RolloverState.folded` in session snapshots: bump it whenever that shape
#: changes, so a snapshot written by an older plugin is folded from the start of the log
STATE_VERSION = 2


def state_of(ctx: Context) -> RolloverState:
    """The session's rollover state, folded up to the end of its log (opened from a session
    snapshot holding it: from there, so an open folds only the tail)."""
    rollover = STRATEGY.on(ctx)
    holder = rollover.state
    state = holder.get("state")
    if not isinstance(state, RolloverState):
        restored = rollover.restored(
            version=STATE_VERSION, load=lambda data: RolloverState.from_folded(data, len(ctx.events))
        )
        state = holder["state"] = restored or RolloverState()
    events = ctx.events
    while state.cursor < len(events):
        state.fold(events[state.cursor])
        state.cursor += 1
    return state
