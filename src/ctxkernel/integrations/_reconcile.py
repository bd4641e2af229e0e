"""Reconcile a framework's view of the conversation with a session's log.

A framework (LangChain's graph state, Pydantic AI's message history, the Agents SDK's run
input) hands the adapter its whole history before every model call. The log already holds most
of it; :func:`reconcile` appends only what is new, through the Session API, so that the log
stays the one full record and the model is given the managed surface.

The rule, in the framework's order:

* the **anchor** is the last assistant message of the history that the log already holds;
  everything after it is a candidate, everything before it is old (the framework may show a
  managed surface there, which is the log's own projection). The history's assistant messages
  are matched to the log's replies in order (a later message never to an earlier reply), each
  by its tool calls (names, and ids: the same, or the id the log gave a reused one) or, without
  calls, by its text, and only to a reply whose later user messages the history still shows. So
  a model that reuses an earlier call id (some providers number calls per reply) gets a reply
  of its own, not the earlier one's;
* a reused **call id** of a new reply is renamed as :class:`~ctxkernel.pairing.CallIds` renames
  it (``<id>_<n>``, none the log holds), and the framework's results for it answer the new id:
  the same history gives the same ids on every reconcile, also in a new process;
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

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..errors import CtxKernelError
from ..messages import Message, Source
from ..pairing import CallIds, claim_base, claim_calls, claimed_from, may_be_claim_of
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
    replies: list[int] = field(default_factory=list)  # seqs of assistant messages
    users: list[tuple[int, str, bool]] = field(default_factory=list)  # (seq, text, from the user) of user messages
    reply_calls: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)  # seq -> (id, name) of calls
    #: a call id, and the stem of a fresh id (``<stem>_<n>``) -> seqs of the replies holding it
    by_call: dict[str, list[int]] = field(default_factory=dict)
    by_text: dict[str, list[int]] = field(default_factory=dict)  # text of a reply without calls -> seqs
    #: the framework's id of each call of the last reconciled history's newest replies -> the log's id
    framework_ids: dict[str, str] = field(default_factory=dict)

    def update(self, session: Session) -> LogIndex:
        events = session.events
        for event in events[self.scanned :]:
            if event.type not in ev.MESSAGE_TYPES:
                continue
            message = event.data.get("message") or {}
            blocks = message.get("content") or []
            if event.type == ev.ASSISTANT_MESSAGE:
                self.replies.append(event.seq)
                calls = tuple((b["id"], b.get("name", "")) for b in blocks if b.get("type") == "tool_call")
                self.reply_calls[event.seq] = calls
                for call_id, _ in calls:
                    self.call_owner[call_id] = event.seq
                    for key in {call_id, claimed_from(call_id)} - {None}:
                        _add_seq(self.by_call.setdefault(str(key), []), event.seq)
                if not calls:
                    _add_seq(self.by_text.setdefault(_text_of(blocks), []), event.seq)
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
            _add_seq(self.by_text.setdefault(_text_of_message(message), []), seq)

    def candidates(self, message: Message) -> list[int]:
        """The seqs of the log's replies that ``message`` may be, in the log's order."""
        calls = message.tool_calls
        if not calls:
            return self.by_text.get(_text_of_message(message), [])
        first = calls[0].id
        return sorted({*self.by_call.get(first, []), *self.by_call.get(claim_base(first), [])})

    def match(self, message: Message, seq: int) -> list[tuple[str, str]] | None:
        """``(message's call id, the log's id)`` of each call when the log's reply ``seq`` may be
        ``message`` (its calls have the same names and the same ids, or ids the log gave reused
        ones; a reply without calls is matched by its text in :meth:`candidates`), else None."""
        logged = self.reply_calls.get(seq)
        calls = message.tool_calls
        if logged is None or len(logged) != len(calls):
            return None
        pairs = []
        for call, (log_id, name) in zip(calls, logged, strict=True):
            if call.name != name or not may_be_claim_of(log_id, call.id):
                return None
            pairs.append((call.id, log_id))
        return pairs

    def consistent(self, seq: int, tail: Sequence[Message]) -> bool:
        """Can a history whose messages after a reply are ``tail`` have that reply at ``seq``?

        A reply without tool calls is matched by its text, and two replies may read the same
        ("OK"). The user's own messages the log holds after ``seq`` must then be in ``tail``, in
        order: a framework never loses what its user said after a reply it shows."""
        later = [text for s, text, from_user in self.users if s > seq and from_user]
        shown = iter(m.text for m in tail if m.role == "user")
        return all(any(text == s for s in shown) for text in later)


def _add_seq(seqs: list[int], seq: int) -> None:
    if seq not in seqs:
        seqs.append(seq)
        seqs.sort()


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
    anchor_at, anchor_seq, anchor_ids = _anchor(history, index)
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
    history, shown_ids = _log_ids(session, history, anchor_at, anchor_ids, index)
    # refuse a history that breaks off part-way before writing any of it: nothing is written then
    _check_pairing(session, history, anchor_at, index, list(expected_users))
    appended = 0
    for offset, message in enumerate(history[anchor_at + 1 :], start=anchor_at + 1):
        if message.role == "tool":
            result = message.tool_result
            assert result is not None
            if result.call_id in index.resolved:
                continue
            outcome = outcomes.get(result.call_id)
            if outcome is None and offset in shown_ids:  # a strategy tool run under the framework's id
                outcome = outcomes.get(shown_ids[offset])
            if outcome is None:
                outcome = ToolOutcome(result.content, is_error=result.is_error)
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


def _anchor(history: Sequence[Message], index: LogIndex) -> tuple[int, int, list[tuple[str, str]]]:
    """The history's last assistant message that the log holds: ``(its index, its seq, (its call
    ids, the log's ids))``, ``(-1, -1, [])`` when there is none. The history's assistant messages
    are matched in order, each to the log's first reply after the last match that it may be."""
    anchor_at, anchor_seq, anchor_ids = -1, -1, []
    for i, message in enumerate(history):
        if message.role != "assistant":
            continue
        for seq in index.candidates(message):
            if seq <= anchor_seq:
                continue
            ids = index.match(message, seq)
            if ids is not None and index.consistent(seq, history[i + 1 :]):
                anchor_at, anchor_seq, anchor_ids = i, seq, ids
                break
    return anchor_at, anchor_seq, anchor_ids


def _log_ids(
    session: Session, history: Sequence[Message], anchor_at: int, anchor_ids: list[tuple[str, str]], index: LogIndex
) -> tuple[list[Message], dict[int, str]]:
    """``history`` with the log's call ids after the anchor: a new reply's reused id is renamed
    as :class:`CallIds` renames it (the same ids on every reconcile of the same log), and a tool
    result takes the id of its call in the reply before it. Also the framework's id of each
    result renamed so (by position), and ``index.framework_ids``."""
    out = list(history)
    shown: dict[int, str] = {}
    ids = CallIds(session.surface.call_owner, index.call_owner)
    current = _by_framework_id(anchor_ids)
    framework_ids = dict(anchor_ids)
    for offset in range(anchor_at + 1, len(history)):
        message = history[offset]
        if message.role == "assistant":
            out[offset], renames = claim_calls(message, ids)
            current = _by_framework_id(renames)
            framework_ids.update(renames)
        elif message.role == "tool":
            result = message.tool_result
            assert result is not None
            logged = current.get(result.call_id)
            if logged:
                # two calls of one reply with one id answer in the order of the calls
                new = logged.pop(0) if len(logged) > 1 else logged[0]
                if new != result.call_id:
                    source = message.source
                    if source.call_id == result.call_id:
                        source = dataclasses.replace(source, call_id=new)
                    block = dataclasses.replace(result, call_id=new)
                    out[offset] = dataclasses.replace(message, content=(block,), source=source)
                    shown[offset] = result.call_id
    index.framework_ids = framework_ids
    return out, shown


def _by_framework_id(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for framework_id, log_id in pairs:
        out.setdefault(framework_id, []).append(log_id)
    return out


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
