"""What comes back from the model and the tools: the reply committed (after ``sanitize_reply``),
a provider error reported (``request_error``, then the kernel's overflow fallback), and each tool
call's result committed in the model's order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from .. import events as ev
from ..context import ReplyDraft
from ..convert import normalize_usage, reply_to_message
from ..errors import ContextOverflowError, EventError, ModelError
from ..events import EventSpec
from ..guard import shrink_to_fit
from ..messages import Message, check_new_calls
from ..redact import redact
from ..text import storable
from ..tools import ToolOutcome

if TYPE_CHECKING:
    from ..meter import Meter
    from ..ports import SessionPort
    from ..surface import Surface
    from .compose import Composer
    from .log import CountsAhead, SessionLog
    from .snapshots import Snapshots
    from .tooling import Tooling
    from .track import Tracker
    from .turns import Turns


class Replies:
    """One session's replies, provider errors and tool results."""

    def __init__(
        self,
        session: SessionPort,
        log: SessionLog,
        tracker: Tracker,
        surface: Surface,
        meter: Meter,
        counts: CountsAhead,
        tooling: Tooling,
        composer: Composer,
        turns: Turns,
        snapshots: Snapshots,
    ) -> None:
        self.session = session
        self.log = log
        self.tracker = tracker
        self.surface = surface
        self.meter = meter
        self.counts = counts
        self.tooling = tooling
        self.composer = composer
        self.turns = turns
        self.snapshots = snapshots
        #: the seq of the reply whose results are being committed, and its calls' names by id
        self._names_of: int | None = None
        self._names: dict[str, str] = {}

    def commit_reply(self, reply: Message | dict[str, Any] | Any, usage: Any, trailer: Sequence[EventSpec]) -> Message:
        session, tracker = self.session, self.tracker
        with self.log.lock:
            # untrusted text: lone surrogates become U+FFFD before hooks, the meter or the log see it
            message, stored = _storable_message(reply_to_message(reply))
            if usage is None:
                usage = getattr(reply, "usage", None)
            if message.role != "assistant":
                msg = f"commit_reply takes an assistant message, got role {message.role!r}"
                raise EventError(msg)
            check_new_calls(message)
            if not tracker.step_open:
                msg = "no open step: call prepare_request() before commit_reply()"
                raise EventError(msg)
            draft = ReplyDraft(message, normalize_usage(usage))
            session.kernel.hooks.sanitize_reply(session, draft)
            if [c.id for c in draft.message.tool_calls] != [c.id for c in message.tool_calls]:
                msg = "a sanitize_reply hook changed the reply's tool calls; only text may be cleaned"
                raise EventError(msg)
            # the dict _storable_message built, unless a hook replaced the message
            data: dict[str, Any] = {"message": stored if draft.message is message else draft.message.to_dict()}
            if draft.usage:
                data["usage"] = draft.usage
                data["estimate"] = self.composer.request_estimate + self.counts.count(draft.message)
                data["tokenizer"] = self.meter.tokenizer.name
            if tracker.decoration_delta:
                # recorded so that a reopened session prices decorations like the live one
                data["decoration_tokens"] = tracker.decoration_delta
            batch = [EventSpec(ev.ASSISTANT_MESSAGE, data, ev.append_op())]
            if not draft.message.tool_calls:
                batch.append(EventSpec(ev.STEP_END, {"turn": tracker.turn, "step": tracker.step}))
            batch.extend(trailer)
            session.append(batch)
            return draft.message

    def request_failed(self, error: ModelError) -> bool:
        session, tracker = self.session, self.tracker
        with self.log.lock:
            if tracker.step_open:
                # the log is permanent: a provider error that echoes a key must not reach it
                text = redact(f"{type(error).__name__}: {error}"[:4000])[:2000]
                session.append_one(ev.STEP_END, {"turn": tracker.turn, "step": tracker.step, "error": text})
            decision = session.kernel.hooks.request_error(session, error)
            if not decision and isinstance(error, ContextOverflowError) and session.enabled_strategies():
                # no strategy could shrink the surface: the kernel's fallback excerpts the largest
                # messages (guard.py); a retry is worth it only when that saved something
                decision = self._shrink_after_overflow(error)
            self.snapshots.write_if_due()  # the step is closed: the boundary an overflow's compaction waits for
            return bool(decision)

    def _shrink_after_overflow(self, error: ContextOverflowError) -> bool:
        pressure = self.session.pressure()
        limit = error.limit if error.limit and error.limit > 0 else None
        excess = pressure.tokens - min(pressure.effective_window, limit or pressure.effective_window)
        if error.prompt_tokens and limit:
            excess = max(excess, error.prompt_tokens - limit)  # the provider's own count of the excess
        return shrink_to_fit(self.session, max(excess, 1), limit=limit) is not None

    def tool_result(self, call_id: str, result: str | ToolOutcome, *, is_error: bool = False) -> int:
        outcome = result if isinstance(result, ToolOutcome) else ToolOutcome(str(result), is_error=is_error)
        pending = self.surface.pending_calls
        if call_id not in pending:
            msg = f"no pending tool call {call_id!r}; pending: {list(pending)}"
            raise EventError(msg)
        name = self._call_names(pending[call_id]).get(call_id)
        message = Message.tool(call_id, outcome.content, is_error=outcome.is_error, name=name)
        batch = [EventSpec(ev.TOOL_RESULT, {"message": message.to_dict()}, ev.append_op())]
        if len(pending) == 1 and self.tracker.step_open:
            batch.append(EventSpec(ev.STEP_END, {"turn": self.tracker.turn, "step": self.tracker.step}))
        seq = self.session.append(batch)
        if outcome.conclude_turn:
            self.tracker.conclude_turn = True
        if outcome.defer_message:
            owner = self.tooling.tools.get(name or "")
            self.composer.deferred.append((owner.strategy if owner else "kernel", outcome.defer_message))
        return seq

    def _call_names(self, seq: int) -> dict[str, str]:
        """The names of the tool calls of the reply at ``seq``, by id: read once per reply, so
        committing the results of a reply with n calls costs O(n), not O(n^2) (a provider's reply
        of 6,000 calls took 32 s of lookups, 50,000 about 40 minutes)."""
        if self._names_of != seq:
            node = self.surface.node(seq)
            self._names = {c.id: c.name for c in node.message.tool_calls} if node is not None else {}
            self._names_of = seq
        return self._names


def _storable_message(message: Message) -> tuple[Message, dict[str, Any]]:
    """``message`` with lone surrogates in any of its text replaced (the same object when clean),
    and its ``to_dict()``."""
    data = message.to_dict()
    try:
        # orjson refuses a lone surrogate in any string, keys included: when it encodes the
        # dict, storable() would return it unchanged (one C pass instead of walking it in Python)
        orjson.dumps(data)
    except TypeError as exc:
        if "surrogates" not in str(exc):  # too deep, say: the log's own check refuses it, naming it
            return message, data
        try:
            cleaned = storable(data)
        except RecursionError:  # a surrogate and data nested past Python's stack: the same refusal
            return message, data
        if cleaned is not data:
            message = Message.from_dict(cleaned)
            return message, message.to_dict()
    return message, data


__all__ = ["Replies"]
