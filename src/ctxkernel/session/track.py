"""What the session derives from kernel events as they fold: where the conversation is (turn,
step), the open compaction, the request header and route last recorded, the strategies a person
switched off, the task state, the provider's usage anchor, and the user's instructions.

One :class:`Tracker` per session, fed every event in log order by the log
(:class:`~ctxkernel.session.log.SessionLog`), written into every snapshot and restored from one
(:meth:`Tracker.snapshot`, :meth:`Tracker.restore`): a reopened session, in this process or
another, tracks exactly what the live one did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..events import Event
from ..instructions import Ledger
from ..ledger import WorkLedger

if TYPE_CHECKING:
    from ..meter import Meter


class Tracker:
    """The fold of one session's kernel events into the state the kernel reads at every step."""

    __slots__ = (
        "anchor",
        "compaction_summaries",
        "conclude_turn",
        "decoration_delta",
        "disabled_strategies",
        "header_hash",
        "header_tools",
        "instructions",
        "open_compaction",
        "route",
        "step",
        "step_open",
        "strategy_toggles",
        "meter",
        "task",
        "turn",
        "turn_open",
        "work",
    )

    def __init__(self, meter: Meter) -> None:
        #: the session's meter: a usage figure anchors only a count of the tokenizer it counts with
        self.meter = meter
        self.turn = 0
        self.turn_open = False
        self.step = 0
        self.step_open = False
        self.open_compaction: dict[str, Any] | None = None
        #: one row per compaction/summary event, in log order: what ``project`` lists (strategy,
        #: kind, tokens before and after, how many seqs it cites), not the event's whole data, so
        #: a snapshot and memory stay small however many compactions a session has had
        self.compaction_summaries: list[dict[str, Any]] = []
        self.header_hash: str | None = None
        self.header_tools: list[dict[str, Any]] = []
        self.route: dict[str, Any] | None = None  # the last request/context data
        #: strategies a person disabled for this session (``session/strategy`` events)
        self.disabled_strategies: frozenset[str] = frozenset()
        self.strategy_toggles = 0  # how many such events: what depends on the set rebuilds when it moves
        #: the task state the harness set (``session/task``): ``goal`` and ``todos`` when set
        self.task: dict[str, Any] = {}
        self.anchor: tuple[int, int, str | None] | None = None  # (provider tokens, our estimate, header hash)
        #: tokens the strategies' decorations added to the last request (recorded with its reply)
        self.decoration_delta = 0
        #: this process's pending work within a turn: a tool outcome asked to end the turn after
        #: its batch (a turn's end clears it)
        self.conclude_turn = False
        #: the user's instructions (instructions.py), folded with each event while it is current
        self.instructions = Ledger()
        #: the work ledger (ledger.py), folded from the log when a compaction reads it
        self.work = WorkLedger()

    def fold(self, session_id: str, event: Event, *, live: bool = False) -> None:
        """Track one event, the next in log order."""
        t, d = event.type, event.data
        if self.instructions.cursor == event.seq:
            self.instructions.fold(session_id, event, live=live)
        if t == ev.TURN_START:
            self.turn, self.turn_open, self.step = d["turn"], True, 0
        elif t == ev.TURN_END:
            self.turn_open = False
            self.step_open = False
            self.conclude_turn = False
        elif t == ev.STEP_START:
            self.step, self.step_open = d["step"], True
        elif t == ev.STEP_END:
            self.step_open = False
        elif t == ev.COMPACTION_START:
            self.open_compaction = {**d, "seq": event.seq}
        elif t == ev.COMPACTION_SUMMARY:
            self.compaction_summaries.append(
                {
                    "strategy": d.get("strategy"),
                    "kind": d.get("kind"),
                    "tokens_before": d.get("tokens_before"),
                    "tokens_after": d.get("tokens_after"),
                    "cites": len(d.get("cites") or ()),
                }
            )
        elif t == ev.COMPACTION_END:
            if self.open_compaction and self.open_compaction["compaction_id"] == d["compaction_id"]:
                self.open_compaction = None
        elif t == ev.REQUEST_HEADER:
            self.header_hash = d["hash"]
            self.header_tools = d["tools"]
        elif t == ev.REQUEST_CONTEXT:
            self.route = d
        elif t == ev.SESSION_STRATEGY:
            name = d["strategy"]
            off = self.disabled_strategies
            self.disabled_strategies = off - {name} if d["enabled"] else off | {name}
            self.strategy_toggles += 1
        elif t == ev.SESSION_TASK:
            self.task = {**self.task, **{k: d[k] for k in ("goal", "todos") if k in d}}
        elif t == ev.ASSISTANT_MESSAGE:
            self.decoration_delta = d.get("decoration_tokens", 0)
            usage = d.get("usage")
            estimate = d.get("estimate")
            if usage and isinstance(estimate, int) and d.get("tokenizer") == self.meter.tokenizer.name:
                tokens = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
                self.anchor = (tokens, estimate, self.header_hash)

    def decorated(self, delta: int) -> None:
        """The strategies' decorations of the request just composed add ``delta`` tokens: counted in
        the pressure from now on, and recorded with its reply (whose fold sets it again)."""
        self.decoration_delta = delta

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The tracked state, as a snapshot's ``track`` (plain JSON)."""
        return {
            "turn": self.turn,
            "turn_open": self.turn_open,
            "step": self.step,
            "step_open": self.step_open,
            "open_compaction": self.open_compaction,
            "compaction_summaries": self.compaction_summaries,
            "header_hash": self.header_hash,
            "header_tools": self.header_tools,
            "route": self.route,
            "anchor": list(self.anchor) if self.anchor is not None else None,
            "last_decoration_delta": self.decoration_delta,
        }

    def restore(self, track: dict[str, Any]) -> None:
        """Take the tracked state of a snapshot (checked by :func:`ctxkernel.snapshot.restore`)."""
        self.turn, self.turn_open = track["turn"], track["turn_open"]
        self.step, self.step_open = track["step"], track["step_open"]
        self.open_compaction = track["open_compaction"]
        self.compaction_summaries = track["compaction_summaries"]
        self.header_hash = track["header_hash"]
        self.header_tools = track["header_tools"]
        self.route = track["route"]
        anchor = track["anchor"]
        self.anchor = (anchor[0], anchor[1], anchor[2]) if anchor is not None else None
        self.decoration_delta = track["last_decoration_delta"]


__all__ = ["Tracker"]
