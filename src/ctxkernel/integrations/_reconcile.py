"""Reconcile a framework's view of the conversation with a session's log.

A framework (LangChain's graph state, Pydantic AI's message history, the Agents SDK's run
input) hands the adapter its whole history before every model call. The log already holds most
of it; :func:`reconcile` appends only what is new, through the Session API, so that the log
stays the one full record and the model is given the managed surface.

The rule, in the framework's order:

* the **anchor** is the last assistant message of the history that the log already holds
  (matched by its tool-call ids, or by its text for a reply without calls); everything after it
  is a candidate, everything before it is old (the framework may show a managed surface there,
  which is the log's own projection);
* a **tool result** is committed when its call waits for one, skipped when the log already has
  a result for that call, and refused when the log never saw the call;
* a **user message** is skipped when it is the next user message the log holds after the anchor
  (a retried request, or the same input seen by two seams of one framework), else appended; a
  user message after a final reply closes that turn and opens the next;
* an **assistant message** the log does not hold is the reply to the request the adapter
  prepared when that step is still open (frameworks that show a reply only with the next call),
  else it is recorded as a step of its own.

Nothing here decides what the model sees; that is the strategies' work in ``prepare_request``.
The same problem (a client re-sending its whole history) is a proxy's; this module is kept apart
so that both doors can share one reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..errors import CtxKernelError
from ..messages import Message, Source
from ..tools import ToolOutcome

if TYPE_CHECKING:
    from ..session import Session


class IntegrationError(CtxKernelError):
    """A framework message or history the adapter cannot map onto the session; the message
    names the part and what is accepted. Nothing was written to the log."""


#: the source of the notice that opens a turn for a framework history that starts with the model
_CONTINUES = Source.plugin_form("integrations", "notice")


@dataclass
class LogIndex:
    """What :func:`reconcile` needs to know about the log, kept up to date incrementally."""

    scanned: int = 0
    call_owner: dict[str, int] = field(default_factory=dict)  # tool-call id -> seq of its assistant message
    resolved: set[str] = field(default_factory=set)  # call ids with a result in the log
    reply_texts: dict[str, int] = field(default_factory=dict)  # text of a reply without calls -> last seq
    replies: list[int] = field(default_factory=list)  # seqs of assistant messages
    users: list[tuple[int, str, bool]] = field(default_factory=list)  # (seq, text, from the user) of user messages

    def update(self, session: Session) -> LogIndex:
        events = session.events
        for event in events[self.scanned :]:
            if event.type not in ev.MESSAGE_TYPES:
                continue
            message = event.data.get("message") or {}
            blocks = message.get("content") or []
            if event.type == ev.ASSISTANT_MESSAGE:
                self.replies.append(event.seq)
                calls = [b["id"] for b in blocks if b.get("type") == "tool_call"]
                for call_id in calls:
                    self.call_owner[call_id] = event.seq
                if not calls:
                    self.reply_texts[_text_of(blocks)] = event.seq
            elif event.type == ev.TOOL_RESULT:
                for b in blocks:
                    if b.get("type") == "tool_result":
                        self.resolved.add(b["call_id"])
            else:
                from_user = (message.get("source") or {}).get("kind", "user") == "user"
                self.users.append((event.seq, _text_of(blocks), from_user))
        self.scanned = len(events)
        return self

    def alias(self, message: Message, seq: int) -> None:
        """Remember ``message`` as the log's reply ``seq``: a ``sanitize_reply`` hook may have
        committed other text than the framework keeps (kept in memory only)."""
        if not message.tool_calls:
            self.reply_texts[_text_of_message(message)] = seq

    def known_reply(self, message: Message) -> int | None:
        """The seq of the log's assistant message that ``message`` is, or None."""
        calls = message.tool_calls
        if calls:
            seqs = {self.call_owner.get(c.id) for c in calls}
            seqs.discard(None)
            return max(seqs) if seqs else None  # type: ignore[type-var]
        return self.reply_texts.get(_text_of_message(message))

    def consistent(self, seq: int, tail: Sequence[Message]) -> bool:
        """Can a history whose messages after a reply are ``tail`` have that reply at ``seq``?

        A reply without tool calls is matched by its text, and two replies may read the same
        ("OK"). The user's own messages the log holds after ``seq`` must then be in ``tail``, in
        order: a framework never loses what its user said after a reply it shows."""
        later = [text for s, text, from_user in self.users if s > seq and from_user]
        shown = iter(m.text for m in tail if m.role == "user")
        return all(any(text == s for s in shown) for text in later)


def _text_of(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def _text_of_message(message: Message) -> str:
    return "\n".join(b.text for b in message.content if b.type == "text")


def reconcile(
    session: Session,
    history: Sequence[Message],
    index: LogIndex,
    outcomes: Mapping[str, ToolOutcome] | None = None,
    usages: Mapping[int, Any] | None = None,
    *,
    partial: bool = False,
) -> int:
    """Append to ``session`` what ``history`` (the framework's messages, system prompt removed)
    holds that the log does not. Returns how many messages were appended.

    ``outcomes`` are the results of strategy tools the adapter ran itself, by call id: they are
    committed as the tool's own :class:`~ctxkernel.ToolOutcome` (so ``conclude_turn`` and
    ``defer_message`` keep working) instead of the text the framework shows. Raises
    :class:`IntegrationError` for a history that does not continue this session.
    """
    index.update(session)
    outcomes = outcomes or {}
    anchor_at, anchor_seq = -1, -1
    for i in range(len(history) - 1, -1, -1):
        if history[i].role == "assistant":
            seq = index.known_reply(history[i])
            if seq is not None and (history[i].tool_calls or index.consistent(seq, history[i + 1 :])):
                anchor_at, anchor_seq = i, seq
                break
    if anchor_at < 0 and index.replies and not partial and any(m.role == "assistant" for m in history):
        unknown = next(m for m in history if m.role == "assistant")
        msg = (
            f"the framework's history does not continue session {session.id!r}: none of its assistant messages is in "
            f"the log (the first has tool calls {[c.id for c in unknown.tool_calls]} and text "
            f"{_text_of_message(unknown)[:80]!r}); pass the history this session produced, or use a new session id"
        )
        raise IntegrationError(msg)
    if anchor_at < 0 and index.replies:
        anchor_seq = index.replies[-1]
    expected_users = [text for seq, text, _ in index.users if seq > anchor_seq]
    # refuse a history that breaks off part-way before writing any of it: nothing is written then
    _check_pairing(session, history, anchor_at, index, list(expected_users))
    appended = 0
    for offset, message in enumerate(history[anchor_at + 1 :], start=anchor_at + 1):
        if message.role == "tool":
            result = message.tool_result
            assert result is not None
            if result.call_id in index.resolved:
                continue
            outcome = outcomes.get(result.call_id) or ToolOutcome(result.content, is_error=result.is_error)
            session.tool_result(result.call_id, outcome)
        elif message.role == "user":
            text = message.text
            if text in expected_users:
                del expected_users[: expected_users.index(text) + 1]
                continue
            expected_users = []
            if session.turn_open and _last_is_final_reply(session):
                session.end_turn()
            session.user(message)
        else:
            if not (session.turn_open and session.step_open):
                # a reply no request of ours asked for: record it as a step of its own
                if not session.turn_open:
                    session.user(Message.user("(the conversation continues)", _CONTINUES))
                session.prepare_request()
            session.commit_reply(message, usage=(usages or {}).get(offset))
            index.update(session)
            index.alias(message, index.replies[-1])
        appended += 1
        index.update(session)
    return appended


def _check_pairing(
    session: Session, history: Sequence[Message], anchor_at: int, index: LogIndex, expected_users: list[str]
) -> None:
    """Walk what :func:`reconcile` would append, as it would, without writing: raise the
    :class:`IntegrationError` it would raise part-way."""
    waiting = list(session.surface.pending_calls)
    resolved = set(index.resolved)
    for offset, message in enumerate(history[anchor_at + 1 :], start=anchor_at + 1):
        where = f"history[{offset}]"
        if message.role == "tool":
            result = message.tool_result
            assert result is not None
            if result.call_id in resolved:
                continue
            if result.call_id not in waiting:
                msg = (
                    f"{where}: a tool result for call {result.call_id!r}, which no assistant message in session "
                    f"{session.id!r} made; waiting calls: {waiting}"
                )
                raise IntegrationError(msg)
            waiting.remove(result.call_id)
            resolved.add(result.call_id)
        elif message.role == "user" and message.text in expected_users:
            del expected_users[: expected_users.index(message.text) + 1]
        else:
            if message.role == "user":
                expected_users.clear()
            _refuse_waiting(waiting, where, "an assistant message" if message.role == "assistant" else "a user message")
            waiting = [c.id for c in message.tool_calls]


def _refuse_waiting(waiting: Sequence[str], where: str, what: str) -> None:
    if waiting:
        msg = (
            f"{where}: {what} while tool calls {list(waiting)} wait for results; "
            "the framework's history must give every tool call its result before the next message"
        )
        raise IntegrationError(msg)


def _last_is_final_reply(session: Session) -> bool:
    nodes = session.surface.nodes
    return bool(nodes) and nodes[-1].role == "assistant" and not nodes[-1].message.tool_calls


__all__ = ["IntegrationError", "LogIndex", "reconcile"]
