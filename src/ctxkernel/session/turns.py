"""Turns and steps as the harness drives them: the user's message opens a turn, ``end_turn``
closes it, a step cut short is closed, the history a front door already holds is appended in
order, and what a crashed writer left open is closed on open."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import events as ev
from ..errors import EventError
from ..events import EventSpec
from ..lease import CompactionLease
from ..messages import Message, ToolCallBlock

if TYPE_CHECKING:
    from ..ports import SessionPort
    from ..surface import Surface
    from .log import SessionLog
    from .track import Tracker


class Turns:
    """One session's turn and step bookkeeping."""

    def __init__(self, session: SessionPort, log: SessionLog, tracker: Tracker, surface: Surface) -> None:
        self.session = session
        self.log = log
        self.tracker = tracker
        self.surface = surface

    def user(self, text: str | Message) -> int:
        message = text if isinstance(text, Message) else Message.user(text)
        if message.role != "user":
            msg = f"user() takes a user message, got role {message.role!r}"
            raise EventError(msg)
        batch = []
        if not self.tracker.turn_open:
            batch.append(EventSpec(ev.TURN_START, {"turn": self.tracker.turn + 1}))
        batch.append(EventSpec(ev.USER_MESSAGE, {"message": message.to_dict()}, ev.append_op()))
        return self.session.append(batch) + len(batch) - 1

    def end_turn(self, reason: str = "completed") -> None:
        if reason not in ev.TURN_END_REASONS:
            msg = f"turn end reason must be one of {list(ev.TURN_END_REASONS)}, got {reason!r}"
            raise EventError(msg)
        tracker = self.tracker
        if not tracker.turn_open:
            return
        batch = self.closers(reason, f"the turn ended ({reason}) before this call had a result")
        batch.append(EventSpec(ev.TURN_END, {"turn": tracker.turn, "reason": reason}))
        self.session.append(batch)
        tracker.conclude_turn = False

    def closers(self, reason: str, result_text: str) -> list[EventSpec]:
        """Error results for the calls still waiting, then the open step's end."""
        batch = [
            EventSpec(
                ev.TOOL_RESULT,
                {"message": Message.tool(call_id, result_text, is_error=True).to_dict(), "synthetic": True},
                ev.append_op(),
            )
            for call_id in list(self.surface.pending_calls)
        ]
        if self.tracker.step_open:
            batch.append(
                EventSpec(ev.STEP_END, {"turn": self.tracker.turn, "step": self.tracker.step, "reason": reason})
            )
        return batch

    def abandon_step(self, reason: str = "interrupted") -> None:
        with self.log.lock:
            batch = self.closers(reason, f"the step was abandoned ({reason}) before this call had a result")
            if batch:
                self.session.append(batch)

    def append_history(self, messages: Sequence[Message], *, trailer: Sequence[EventSpec] = ()) -> list[int]:
        with self.log.lock:
            batch, seqs, offered = self.history_batch(messages, trailer)
            if batch:
                self.log.append(batch, offered=offered)
            return seqs

    def history_batch(
        self, messages: Sequence[Message], trailer: Sequence[EventSpec]
    ) -> tuple[list[EventSpec], list[int], dict[int, Message]]:
        """:meth:`append_history`'s batch (turn and step events around the messages, then
        ``trailer``), the seq each message will have, written after the log as it is now, and
        each message by its index in the batch (``SessionLog.checked``'s ``offered``)."""
        with self.log.lock:
            tracker = self.tracker
            batch: list[EventSpec] = []
            seqs: list[int] = []
            offered: dict[int, Message] = {}
            start = len(self.log.events)
            turn, turn_open, step_open = tracker.turn, tracker.turn_open, tracker.step_open
            waiting = set(self.surface.pending_calls)
            last = self.surface.nodes[-1] if self.surface.nodes else None
            replied = last is not None and last.role == "assistant" and not last.message.tool_calls
            for message in messages:
                if message.role == "user" and turn_open and replied and not waiting:
                    batch.append(EventSpec(ev.TURN_END, {"turn": turn, "reason": "completed"}))
                    turn_open = step_open = False
                if not turn_open:
                    turn += 1
                    turn_open = True
                    batch.append(EventSpec(ev.TURN_START, {"turn": turn}))
                if message.role == "tool":
                    call_id = message.content[0].call_id  # type: ignore[union-attr]
                    seqs.append(start + len(batch))
                    offered[len(batch)] = message
                    batch.append(EventSpec(ev.TOOL_RESULT, {"message": message.to_dict()}, ev.append_op()))
                    waiting.discard(call_id)
                    if not waiting and step_open:
                        batch.append(EventSpec(ev.STEP_END, {"turn": turn, "step": tracker.step}))
                        step_open = False
                    replied = False
                    continue
                event_type = ev.USER_MESSAGE if message.role == "user" else ev.ASSISTANT_MESSAGE
                if event_type == ev.ASSISTANT_MESSAGE and step_open and not waiting:
                    batch.append(EventSpec(ev.STEP_END, {"turn": turn, "step": tracker.step, "reason": "abandoned"}))
                    step_open = False
                seqs.append(start + len(batch))
                offered[len(batch)] = message
                batch.append(EventSpec(event_type, {"message": message.to_dict()}, ev.append_op()))
                if message.role == "assistant":
                    waiting = {c.id for c in message.tool_calls}
                    replied = not waiting
                else:
                    replied = False
            batch.extend(trailer)
            return batch, seqs, offered

    @property
    def pending_calls(self) -> list[ToolCallBlock]:
        pending = self.surface.pending_calls
        if not pending:
            return []
        node = self.surface.node(next(iter(pending.values())))
        return [c for c in node.message.tool_calls if c.id in pending] if node else []

    @property
    def wants_another_step(self) -> bool:
        tracker = self.tracker
        if not tracker.turn_open or tracker.conclude_turn or self.surface.pending_calls:
            return False
        last = self.surface.nodes[-1] if self.surface.nodes else None
        return last is not None and last.role == "tool"

    # -- recovery ----------------------------------------------------------------------------------
    def repair_after_crash(self, *, keep_waiting_calls: bool = False) -> list[int]:
        with self.log.lock:
            lease = None
            if self.tracker.open_compaction is not None:
                # an open compaction is abandoned when nobody live holds its lease (lease.py)
                lease = CompactionLease(self.session)
                if not lease.try_acquire().acquired:
                    lease = None
            try:
                return self._repair(lease, keep_waiting_calls)
            finally:
                if lease is not None:
                    lease.release()

    def _repair(self, lease: CompactionLease | None, keep_waiting_calls: bool) -> list[int]:
        tracker = self.tracker
        batch: list[EventSpec] = []
        if lease is not None:
            self.session.refresh()  # the holder may have ended it just before we took the lease
            if tracker.open_compaction is not None:
                batch.append(lease.takeover_end(tracker.open_compaction))
        waiting = keep_waiting_calls and bool(self.surface.pending_calls)
        if tracker.turn_open and not waiting and (self.surface.pending_calls or tracker.step_open):
            batch += self.closers(
                "interrupted", "outcome unknown: the session was interrupted before this call's result was recorded"
            )
            batch.append(EventSpec(ev.TURN_END, {"turn": tracker.turn, "reason": "interrupted"}))
        if not batch:
            return []
        first = self.session.append(batch)
        return list(range(first, first + len(batch)))


__all__ = ["Turns"]
