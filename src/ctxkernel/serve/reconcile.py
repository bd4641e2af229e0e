"""Reconcile: fold a client's whole history into the session log, appending only what is new.

A proxy's client sends its entire history with every request. The session keeps a *ledger* of
the client's view: for each position of the client's history, the hash of that message (its
normalised content, :func:`message_hash`) and the log seq that holds it. The ledger lives in the
session log itself, as ignorable ``serve/ledger`` events, so any worker and a restarted
``serve`` read the same one::

    serve/ledger {"at": k, "hashes": [...], "ids": [...], "tokens": [...], "seqs": [...]?}

means "client positions k.. are these messages" (anything the ledger held from k on is replaced).
Without ``seqs`` the entries are the message events just before the ledger event, written in the
same batch.

On each request the client's history is matched against the ledger from the start. An assistant
message also matches by its tool-call ids, so a client that re-serialises what it got back (other
JSON spacing, ``content: null`` for ``""``) still matches. Then:

- the ledger is a prefix of the history: the rest is new and is appended (one batch; ``serve``
  hands it to the request's ``prepare_request``, which writes it with its ``step/start``);
- the history diverges at position k (the client compacted its own history, edited or retried a
  turn): the **rewrite policy** applies. When everything from k on is still visible on the
  surface and starts at a balanced cut, that branch is dropped from the surface with a cited
  ``surface/drop`` (a ``serve`` compaction of kind ``rewrite``: the events stay in the log, only
  the surface forgets them) and the client's messages from k on are appended. Otherwise (part
  of the branch was already compacted, or lives in a parent session) the session is *forked*: a
  new child session (``parent`` = the old one) is seeded with the client's whole history, and
  the client's key points to it from then on. Nothing already in a log is ever lost.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..compaction import Span
from ..errors import CompactionError, EventError
from ..events import MESSAGE_TYPES
from ..messages import Message
from ..session import EventSpec
from ..store.base import deferred_sync

if TYPE_CHECKING:
    from ..session import Session

LEDGER_EVENT = "serve/ledger"


def message_hash(message: Message) -> str:
    """A hash of what a message says, independent of how a wire format spelled it: the role, the
    text blocks, tool calls (id, name, parsed arguments) and tool results. Reasoning is left
    out, since clients commonly drop it when they send a history back."""
    if message.role == "tool":
        result = message.tool_result
        assert result is not None
        key: list[Any] = ["tool", result.call_id, result.content, result.is_error]
        parts = result.kept_parts()
        extra = [_block_key(b) for b in parts if b.type != "text"] if parts else []
    else:
        text = "\n".join(b.text for b in message.content if b.type == "text" and b.text)
        key = [message.role, text, [[c.id, c.name, c.arguments] for c in message.tool_calls]]
        # media and kept blocks of the client's own messages count; the model's opaque blocks do
        # not (like reasoning, clients may drop them)
        extra = (
            []
            if message.role == "assistant"
            else [_block_key(b) for b in message.content if b.type in ("media", "opaque")]
        )
    if message.name is not None:
        extra.append(["name", message.name])
    if extra:  # only then: a text-only message hashes as it always has
        key.append(extra)
    return hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _block_key(block: Any) -> Any:
    if block.type == "media":
        return ["media", block.blob or block.wire]
    return ["opaque", block.data]


@dataclass
class Ledger:
    """The client's view of one session, folded from its ``serve/ledger`` events."""

    hashes: list[str] = field(default_factory=list)
    ids: list[list[str] | None] = field(default_factory=list)
    seqs: list[int | None] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    follow: str | None = None  # a child session to continue in once no client call waits
    scanned: int = 0
    #: the message hashes of the last client history that passed :func:`check_history`, and the
    #: call ids it used: a history that starts with it is checked from there on (the check
    #: depends only on roles and call ids, which the hashes cover)
    checked: list[str] = field(default_factory=list)
    checked_calls: frozenset[str] = frozenset()

    def sync(self, session: Session) -> None:
        """Fold the ledger events appended since the last call (by any worker)."""
        events = session.events
        for index in range(self.scanned, len(events)):
            event = events[index]
            if event.type == LEDGER_EVENT:
                self._apply(events, index, event.data)
        self.scanned = len(events)

    def _apply(self, events: Sequence[Any], index: int, data: dict[str, Any]) -> None:
        at = data.get("at", 0)
        hashes = list(data.get("hashes") or [])
        seqs = data.get("seqs")
        if seqs is None:  # the message events written just before, in the same batch
            found: list[int] = []
            i = index - 1
            while len(found) < len(hashes) and i >= 0:
                if events[i].type in MESSAGE_TYPES:
                    found.append(events[i].seq)
                i -= 1
            seqs = list(reversed(found))
        ids = data.get("ids") or [None] * len(hashes)
        tokens = data.get("tokens") or [0] * len(hashes)
        del self.hashes[at:], self.ids[at:], self.seqs[at:], self.tokens[at:]
        self.hashes += hashes
        self.ids += ids
        self.seqs += seqs
        self.tokens += tokens
        if "follow" in data:
            self.follow = data["follow"]

    def matched(self, incoming: list[Message], hashes: list[str]) -> int:
        """How many leading messages of the client's history the ledger already holds."""
        k, n = 0, min(len(self.hashes), len(hashes))
        if self.hashes[:n] == hashes[:n]:  # the usual case, compared in C: the client only added
            return n
        while k < n:
            if self.hashes[k] != hashes[k]:
                message = incoming[k]
                # an assistant message the client re-serialised: the logged one by its call ids
                if not (
                    message.role == "assistant"
                    and message.tool_calls
                    and self.ids[k] == [c.id for c in message.tool_calls]
                ):
                    break
            k += 1
        return k

    @property
    def client_tokens(self) -> int:
        return sum(self.tokens)


@dataclass
class Kept:
    """What ``serve`` keeps per open :class:`Session` object: its ledger and, per wire format,
    the wire forms of its surface nodes (``app.wire_cache``)."""

    ledger: Ledger = field(default_factory=Ledger)
    wire: dict[str, dict[Any, Any]] = field(default_factory=dict)


#: serve's own state of each open Session object, dropped with it. Not in ``session.state``:
#: the kernel walks that dict at every step end and turn end to fold its snapshot indexes,
#: checking each entry it does not know against a runtime-checkable Protocol (about 16 µs an
#: entry, two entries twice a request: ``bench_serve.py``); nothing of this goes in a snapshot.
_KEPT: weakref.WeakKeyDictionary[Session, Kept] = weakref.WeakKeyDictionary()


def kept(session: Session) -> Kept:
    """serve's state for this Session object (made on first use)."""
    found = _KEPT.get(session)
    if found is None:
        found = _KEPT.setdefault(session, Kept())
    return found


def ledger_for(session: Session) -> Ledger:
    """The session's ledger, kept beside the session object and brought up to date."""
    ledger = kept(session).ledger
    ledger.sync(session)
    return ledger


@dataclass
class Reconciled:
    appended: int = 0
    rewrite: str | None = None  # None, "drop" or "fork"
    at: int = 0
    #: with ``defer=True``: the client's new messages and their ledger record, not yet written
    #: (``Session.prepare_request(history=..., trailer=...)`` writes them with its step/start)
    new: list[Message] = field(default_factory=list)
    record: EventSpec | None = None

    def write(self, session: Session) -> None:
        """Append what was deferred now (one batch, not synced on its own: the request's next
        durable append syncs it, and a power cut before then loses only messages the client was
        never answered for and sends again)."""
        if self.record is None:
            return
        new, record, self.new, self.record = self.new, self.record, [], None
        with deferred_sync(session.store):
            session.append_history(new, trailer=[record])
        ledger_for(session)


def check_history(messages: list[Message], *, start: int = 0, seen: frozenset[str] = frozenset()) -> frozenset[str]:
    """Refuse (EventError) a history whose tool calls and results do not pair up: a result for
    no earlier call, a call answered twice, a reused call id, or a message other than a result
    while calls wait. Checked before anything is written, so a refused request changes nothing.

    Returns the call ids the history uses. ``start`` and ``seen`` resume the check after a
    prefix that already passed it (``seen``: that prefix's call ids; none of its calls waits,
    since a history that passes answers every call)."""
    waiting: set[str] = set()
    used = set(seen)
    for i in range(start, len(messages)):
        message = messages[i]
        if message.role == "tool":
            answered = message.tool_result
            assert answered is not None  # a tool message holds exactly one result
            call_id = answered.call_id
            if call_id not in waiting:
                why = "was already answered" if call_id in used else "answers no earlier tool call"
                msg = f"message {i}: the tool result for call {call_id!r} {why}"
                raise EventError(msg)
            waiting.discard(call_id)
            continue
        if waiting:
            msg = f"message {i} ({message.role}) comes while tool calls {sorted(waiting)} still wait for their results"
            raise EventError(msg)
        for call in message.tool_calls:
            if call.id in used:
                msg = f"message {i}: tool call id {call.id!r} is used twice"
                raise EventError(msg)
            used.add(call.id)
            waiting.add(call.id)
    if waiting:
        msg = f"tool calls {sorted(waiting)} have no results: send every result of the batch"
        raise EventError(msg)
    return frozenset(used)


def _check(ledger: Ledger, incoming: list[Message], hashes: list[str]) -> None:
    """:func:`check_history`, resumed after the last history that passed when this one starts
    with it: a client adds a few messages per request, and checking all of them again made the
    check grow with the history (``bench_serve.py``)."""
    done = len(ledger.checked)
    if done and hashes[:done] == ledger.checked:  # compared in C
        ledger.checked_calls = check_history(incoming, start=done, seen=ledger.checked_calls)
    else:
        ledger.checked_calls = check_history(incoming)
    ledger.checked = hashes


def reconcile(
    session: Session, incoming: list[Message], hashes: list[str] | None = None, *, defer: bool = False
) -> Reconciled:
    """Append the client's new messages; apply the rewrite policy when its history diverged.

    Returns ``rewrite="fork"`` without writing anything when only a fork can keep the log whole
    (the caller opens the child session and reconciles again there). ``hashes`` are the
    messages' :func:`message_hash` when the caller has them already. With ``defer``, new
    messages after an unchanged history are checked but not written: they come back in
    ``new`` and ``record`` for the request's ``prepare_request`` (or :meth:`Reconciled.write`)."""
    ledger = ledger_for(session)
    if hashes is None:
        hashes = [message_hash(m) for m in incoming]
    _check(ledger, incoming, hashes)
    k = ledger.matched(incoming, hashes)
    result = Reconciled(at=k)
    if k < len(ledger.hashes):
        # where the client's history holds another assistant message than the session's, the
        # client did not edit or retry its turn (it cannot make a reply up): it is another
        # conversation that began alike (a second client on the same fingerprint). Forking keeps
        # both; dropping would throw the other one's branch away, and then this one's, in turn
        twin = k < len(incoming) and incoming[k].role == "assistant"
        if twin or not _drop_branch(session, ledger, k):
            result.rewrite = "fork"
            return result
        result.rewrite = "drop"
    new = incoming[k:]
    if not new and result.rewrite is None:
        return result
    record = EventSpec(
        LEDGER_EVENT,
        {
            "at": k,
            "hashes": hashes[k:],
            "ids": [[c.id for c in m.tool_calls] if m.tool_calls else None for m in new],
            # through the session: each message's node takes this count when it lands, so a
            # client's message is tokenised once, not once here and again on the surface
            "tokens": [session.count_message(m) for m in new],
        },
        ignorable=True,
    )
    result.new, result.record, result.appended = new, record, len(new)
    if not defer or result.rewrite is not None:
        result.write(session)
    return result


def _drop_branch(session: Session, ledger: Ledger, k: int) -> bool:
    """Drop ledger positions k.. (and everything after them) from the surface, if they are all
    still visible and start at a balanced cut; False when only a fork can do."""
    seqs = ledger.seqs[k:]
    first = seqs[0] if seqs else None
    if first is None or any(seq is None or session.surface.node(seq) is None for seq in seqs):
        return False
    session.abandon_step("rewritten")
    nodes = session.surface.nodes
    try:
        # the client's own edit: what it took away stays away (no instruction is pinned back)
        session.compact(
            Span(first, nodes[-1].seq, remove=True),
            strategy="serve",
            kind="rewrite",
            single_batch=True,
            keep_instructions=False,
        )
    except CompactionError:
        return False
    return True


def reply_record(session: Session, at: int, view: Message, first_seq: int | None) -> EventSpec:
    """The ledger event putting the reply the client got (its view: visible text, its own calls)
    at position ``at``. Without ``first_seq`` it cites the message event just before it, so it
    can end the batch that commits that reply (both durable, or neither)."""
    data: dict[str, Any] = {
        "at": at,
        "hashes": [message_hash(view)],
        "ids": [[c.id for c in view.tool_calls] if view.tool_calls else None],
        # through the session: when the view is the reply as committed, its node takes this count
        "tokens": [session.count_message(view)],
    }
    if first_seq is not None:
        data["seqs"] = [first_seq]
    return EventSpec(LEDGER_EVENT, data, ignorable=True)


def record_follow(session: Session, child: str) -> None:
    """Remember to continue in ``child`` once the client's results for this reply are in."""
    session.emit("serve", "ledger", {"at": len(ledger_for(session).hashes), "hashes": [], "follow": child})
    ledger_for(session)


def inherit(child: Session, parent_ledger: Ledger) -> None:
    """A child session a strategy switched to holds the client's history only in its ancestors:
    its ledger starts with the parent's hashes, with no seqs (a rewrite reaching them forks)."""
    child.emit(
        "serve",
        "ledger",
        {
            "at": 0,
            "hashes": list(parent_ledger.hashes),
            "ids": list(parent_ledger.ids),
            "tokens": list(parent_ledger.tokens),
            "seqs": [None] * len(parent_ledger.hashes),
            "follow": None,
        },
    )
    ledger_for(child)
