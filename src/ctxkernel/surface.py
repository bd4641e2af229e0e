"""The surface: the fold of a session log into the messages the model sees.

Only ``user/message``, ``assistant/message`` and ``tool/result`` events carry a message, each with
a surface operation (``append`` or ``replace``); the kernel's ``surface/drop`` removes a cited
range without a replacement. Replaying a log from seq 0 always gives the same surface.

The fold is incremental: an append costs O(1) amortised; a replacement costs O(surface), which is
bounded by the context window and paid only when a strategy compacts. Every operation is checked
(:meth:`Surface.check`) before it is applied, so an invalid event is refused before it is written
and a stored log that breaks a rule is reported as corrupt rather than replayed differently.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .errors import SurfaceError
from .events import (
    ASSISTANT_MESSAGE,
    MESSAGE_TYPES,
    STEP_START,
    SURFACE_DROP,
    TOOL_RESULT,
    TURN_START,
    USER_MESSAGE,
    Event,
)
from .messages import Message

_SURFACE_TYPES = MESSAGE_TYPES | {SURFACE_DROP}
#: The message role each message event type carries.
_ROLE_OF = {USER_MESSAGE: "user", ASSISTANT_MESSAGE: "assistant", TOOL_RESULT: "tool"}


class Node:
    """One model-visible message, identified by the seq of the event that put it there.

    ``turn`` and ``step`` say where in the conversation it belongs: the user's message has the
    turn's number and step 0, an assistant message and its tool results the step that produced
    them. A replacement takes the place, and so the turn and step, of the first node it replaced.
    """

    __slots__ = ("event", "message", "seq", "step", "tokens", "turn")

    def __init__(self, event: Event, message: Message, turn: int = 0, step: int = 0) -> None:
        self.event = event
        self.message = message
        #: the seq of ``event`` (an attribute, not a property: every span check, removal and
        #: search over the surface reads it, thousands of times per compaction)
        self.seq = event.seq
        self.turn = turn
        self.step = step
        self.tokens: int | None = None  # filled lazily by the meter

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def cites(self) -> tuple[int, ...]:
        """The seqs this node replaced (empty for a message appended as it was sent)."""
        op = self.event.surface
        return tuple(op["cites"]) if op is not None and op.get("op") != "append" else ()

    @property
    def pruned(self) -> bool:
        """True for a tool result shrunk in place by ``replace_tool_result`` (a masked output)."""
        return self.event.type == TOOL_RESULT and self.event.data.get("prune") is True

    def __repr__(self) -> str:
        return f"Node(seq={self.seq}, role={self.role})"


class _Views:
    """:meth:`Surface._views`: the messages and seqs of ``nodes`` (the surface's list object, at
    ``version``) up to and including ``last``."""

    __slots__ = ("last", "messages", "nodes", "seqs", "version")

    def __init__(self, nodes: list[Node], version: int) -> None:
        self.nodes = nodes
        self.version = version
        self.last: Node | None = None
        self.messages: list[Message] = []
        self.seqs: list[int] = []


class Surface:
    """Model-visible nodes in order, plus the indexes that keep tool pairing checkable."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.applied = 0  # next seq this surface expects
        self.version = 0  # bumped by every replace/remove: lets a transaction detect changes
        self._pos: dict[int, int] | None = {}
        self.pending_calls: dict[str, int] = {}  # call id -> assistant seq, still waiting
        self.call_owner: dict[str, int] = {}  # call id -> assistant seq, visible
        self.result_of: dict[str, int] = {}  # call id -> tool result seq, visible
        #: objects with on_add(node) and on_remove(nodes), the latter given a replaced range at once;
        #: one with on_clear() is told to start over instead, then given on_add of each node kept,
        #: when a replacement keeps fewer nodes than it removes (a window switch, a handoff)
        self.listeners: list[Any] = []
        self.turn = 0  # the turn and step the next appended node belongs to
        self.step = 0
        #: (version, first seq, last seq, length) of the last range found closed: a transaction
        #: checks its span when it validates and again when its commit is appended
        self._closed: tuple[int, int, int, int] | None = None
        #: every node's message and seq in order, kept between requests (see _views)
        self._kept_views: _Views | None = None

    def probe(self) -> Surface:
        """A copy to check a batch against without changing this surface (the nodes themselves are
        shared: a check never changes a node). Listeners are not copied."""
        clone = Surface()
        clone.nodes = list(self.nodes)
        clone.applied = self.applied
        clone.turn, clone.step = self.turn, self.step
        clone.version = self.version
        clone._pos = None
        clone.pending_calls = dict(self.pending_calls)
        clone.call_owner = dict(self.call_owner)
        clone.result_of = dict(self.result_of)
        return clone

    def install(
        self,
        nodes: list[Node],
        applied: int,
        version: int,
        place: tuple[int, int],
        indexes: tuple[dict[str, int], dict[str, int], dict[str, int]],
    ) -> None:
        """Take the state a snapshot holds (a fresh surface, nothing applied yet): its nodes, the
        next seq, the version, the turn and step the next node belongs to, and the pairing indexes
        (pending calls, call owners, results); every listener is told of each node."""
        self.nodes, self.applied, self.version, self._pos = nodes, applied, version, None
        self.turn, self.step = place
        self.pending_calls, self.call_owner, self.result_of = indexes
        for node in nodes:
            for listener in self.listeners:
                listener.on_add(node)

    # -- lookups --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def messages(self) -> list[Message]:
        """Each visible node's message, in order (a new list: the caller may change it)."""
        return list(self._views().messages)

    def seqs(self) -> list[int]:
        """Each visible node's seq, in order (a new list)."""
        return list(self._views().seqs)

    def _views(self) -> _Views:
        """The nodes' messages and seqs, kept between calls and extended by the nodes appended
        since: every request sends the whole surface, and copying the kept lists is one C loop
        where building them walks every node in Python. Only ``apply`` changes ``nodes``: an
        append adds after the kept prefix, anything else bumps ``version``; a snapshot's restore
        installs another list. Either of those, or a prefix whose last node is not the kept
        one, builds them afresh."""
        nodes = self.nodes
        kept = self._kept_views
        count = 0 if kept is None else len(kept.seqs)
        if (
            kept is None
            or kept.nodes is not nodes
            or kept.version != self.version
            or count > len(nodes)
            or (count and nodes[count - 1] is not kept.last)
        ):
            kept = self._kept_views = _Views(nodes, self.version)
            count = 0
        if count < len(nodes):
            added = nodes[count:]
            kept.messages.extend([n.message for n in added])
            kept.seqs.extend([n.seq for n in added])
            kept.last = added[-1]
        return kept

    def position(self, seq: int) -> int | None:
        """Index of the node with this seq on the surface, or None when it is not visible."""
        if self._pos is None:
            self._pos = {n.seq: i for i, n in enumerate(self.nodes)}
        return self._pos.get(seq)

    def node(self, seq: int) -> Node | None:
        pos = self.position(seq)
        return None if pos is None else self.nodes[pos]

    def hides_anything(self) -> bool:
        """True once a message was replaced or removed (a summary, a mask, an excerpt, a drop):
        the log holds something the surface no longer shows as it was, which the history tools
        can bring back. It never turns False again: the surface does not get back what it gave up,
        and a drop that takes a summary off hides what that summary stood for too."""
        return self.version > 0

    def span(self, start: int, end: int) -> list[Node]:
        """Nodes from seq ``start`` through seq ``end`` in surface order (raises if invalid)."""
        a, b = self.position(start), self.position(end)
        if a is None or b is None:
            missing = start if a is None else end
            msg = f"seq {missing} is not on the surface (visible: {self._describe_visible()})"
            raise SurfaceError(msg)
        if a > b:
            msg = f"range start {start} comes after its end {end} on the surface"
            raise SurfaceError(msg)
        return self.nodes[a : b + 1]

    def _describe_visible(self) -> str:
        seqs = self.seqs()
        if len(seqs) > 12:
            return f"{seqs[:6]} … {seqs[-6:]} ({len(seqs)} nodes)"
        return str(seqs)

    # -- pairing --------------------------------------------------------------------------------
    def is_balanced_cut(self, position: int) -> bool:
        """True when cutting between ``nodes[position-1]`` and ``nodes[position]`` keeps every
        tool call on the same side as all of its results.

        Results are always committed right after their assistant message (and a content-only
        replacement keeps their place), so a cut is unbalanced exactly when it lands on a tool
        result or leaves a still-pending call before it.
        """
        if position < 0 or position > len(self.nodes):
            return False
        if position < len(self.nodes) and self.nodes[position].role == "tool":
            return False
        return not any(pos < position for pos in self._pending_positions())

    def _pending_positions(self) -> Iterable[int]:
        for seq in self.pending_calls.values():
            pos = self.position(seq)
            if pos is not None:
                yield pos

    def check_range_closed(self, nodes: list[Node]) -> None:
        """A range is closed when every tool call in it has all its results in it and every
        result in it has its call in it. Raise :class:`SurfaceError` naming the broken pair.

        A range found closed stays closed until a replacement changes the surface (its
        ``version``): appends add nodes after it, and a result appended later answers a pending
        call, which a closed range holds none of."""
        if not nodes:
            return
        key = (self.version, nodes[0].seq, nodes[-1].seq, len(nodes))
        if key == self._closed:
            return
        whole = len(nodes) == len(self.nodes) and nodes[0] is self.nodes[0] and nodes[-1] is self.nodes[-1]
        # the whole surface with no call pending holds both ends of every pair: nothing to walk
        if (not whole or self.pending_calls) and not self._closed_at_its_edges(nodes):
            self._walk_closed(nodes)
        self._closed = key

    def _closed_at_its_edges(self, nodes: list[Node]) -> bool:
        """True when the run ``nodes`` of this surface is closed by what sits at its two edges.

        A call's results follow its assistant message with nothing between them (nothing else
        is appended while a call waits, and a replacement takes whole pairs), so a pair crosses
        an edge of the run only where a tool result is the run's first node or the node just
        after it. With no call pending, neither being one proves the range closed without
        walking it; anything else is walked, which names the broken pair."""
        if self.pending_calls or nodes[0].role == "tool":
            return False
        first = self.position(nodes[0].seq)
        after = -1 if first is None else first + len(nodes)
        if after < 0 or after > len(self.nodes) or self.nodes[after - 1] is not nodes[-1]:
            return False  # not a run of this surface: walked
        return after == len(self.nodes) or self.nodes[after].role != "tool"

    def _walk_closed(self, nodes: list[Node]) -> None:
        """``check_range_closed``'s walk: every call's result and every result's call in ``nodes``."""
        inside = {n.seq for n in nodes}
        pending, result_of = self.pending_calls, self.result_of
        for n in nodes:
            message = n.message
            role = message.role
            if role == "assistant":
                for call in message.content:
                    if call.type != "tool_call":
                        continue
                    if call.id in pending:
                        msg = f"tool call {call.id} (seq {n.seq}) has no result yet: the range would split it"
                        raise SurfaceError(msg)
                    rseq = result_of.get(call.id)
                    if rseq is not None and rseq not in inside:
                        msg = (
                            f"tool call {call.id} (seq {n.seq}) has its result at seq {rseq} outside the "
                            "range: a tool call and its results stay on one side of a cut"
                        )
                        raise SurfaceError(msg)
            elif role == "tool":
                call_id = message.content[0].call_id  # type: ignore[union-attr]
                owner = self.call_owner.get(call_id)
                if owner is not None and owner not in inside:
                    msg = (
                        f"tool result seq {n.seq} answers call {call_id} at seq {owner} outside the "
                        "range: a tool call and its results stay on one side of a cut"
                    )
                    raise SurfaceError(msg)

    # -- the fold -------------------------------------------------------------------------------
    def check(self, event: Event, parsed: Message | None = None) -> Message | None:
        """Validate ``event`` against the current surface without changing it.

        Returns the parsed message for message events. Raises :class:`SurfaceError`.
        ``parsed``: the event's message as the kernel built it, whose ``to_dict()`` is the
        event's ``data["message"]`` (a compaction's own checkpoint): not parsed back.
        """
        if event.seq != self.applied:
            msg = f"event seq {event.seq} does not follow the surface's last applied seq {self.applied - 1}"
            raise SurfaceError(msg)
        if event.type not in MESSAGE_TYPES and event.type != SURFACE_DROP:
            return None
        if event.type == SURFACE_DROP:
            message = None
        else:
            message = parsed if parsed is not None else Message.from_dict(event.data["message"])
        if message is not None:
            expected_role = _ROLE_OF[event.type]
            if message.role != expected_role:
                msg = f"{event.type} must carry a {expected_role} message, got role {message.role!r}"
                raise SurfaceError(msg)
        op = event.surface or {}
        kind = op.get("op")
        if kind == "append":
            self._check_append(event, message)
        else:
            self._check_replace(event, message, op)
        return message

    def _check_append(self, event: Event, message: Message | None) -> None:
        assert message is not None
        if event.type == TOOL_RESULT:
            call_id = message.content[0].call_id  # type: ignore[union-attr]
            if call_id not in self.pending_calls:
                if call_id in self.result_of:
                    msg = f"tool call {call_id} already has a result (seq {self.result_of[call_id]})"
                else:
                    msg = f"tool result for unknown call {call_id}; pending calls: {sorted(self.pending_calls)}"
                raise SurfaceError(msg)
        elif self.pending_calls:
            msg = (
                f"cannot append a {message.role} message while tool calls {sorted(self.pending_calls)} "
                "wait for results: commit every result of the batch first"
            )
            raise SurfaceError(msg)
        if event.type == ASSISTANT_MESSAGE:
            ids = [c.id for c in message.tool_calls]
            if len(set(ids)) != len(ids):
                msg = f"assistant message repeats a tool call id: {ids}"
                raise SurfaceError(msg)
            for call_id in ids:
                if call_id in self.call_owner:
                    msg = f"tool call id {call_id} is already used by seq {self.call_owner[call_id]}"
                    raise SurfaceError(msg)

    def _check_replace(self, event: Event, message: Message | None, op: dict[str, Any]) -> None:
        nodes = self.span(op["start"], op["end"])
        shadowed = [n.seq for n in nodes]
        cites = op["cites"]
        # cites listed in surface order (every commit lists them so) match without two sets
        if cites != shadowed and (len(cites) != len(shadowed) or set(cites) != set(shadowed)):
            missing = sorted(set(shadowed) - set(cites))
            extra = sorted(set(cites) - set(shadowed))
            parts = []
            if missing:
                parts.append(f"shadows {missing} without citing them")
            if extra:
                parts.append(f"cites {extra} which are not in the range")
            msg = f"{op['op']} {op['start']}..{op['end']} " + " and ".join(parts) + f"; it must cite exactly {shadowed}"
            raise SurfaceError(msg)
        if event.type == TOOL_RESULT:
            assert message is not None
            if len(nodes) != 1 or nodes[0].role != "tool":
                msg = "a tool/result replacement shadows exactly one tool result"
                raise SurfaceError(msg)
            old = nodes[0].message.content[0]
            new = message.content[0]
            if (old.call_id, old.is_error, old.name) != (new.call_id, new.is_error, new.name):  # type: ignore[union-attr]
                msg = "a tool/result replacement may change only that result's content, not its call id, name or error flag"
                raise SurfaceError(msg)
            return
        self.check_range_closed(nodes)
        if message is not None and message.tool_calls:
            msg = "a replacement message cannot carry tool calls"
            raise SurfaceError(msg)

    def apply(self, event: Event, message: Message | None = None, *, checked: bool = False) -> None:
        """Fold one event into the surface (``check`` first unless ``checked``)."""
        if event.type not in _SURFACE_TYPES:
            # most of a log (turns, steps, headers, plugin events): only the seq order matters,
            # and where the next message belongs
            if not checked and event.seq != self.applied:
                self.check(event)  # raises, with the message
            if event.type == TURN_START:
                self.turn, self.step = event.data["turn"], 0
            elif event.type == STEP_START:
                self.step = event.data["step"]
            self.applied = event.seq + 1
            return
        if not checked:
            message = self.check(event)
        elif message is None and event.type in MESSAGE_TYPES:
            message = Message.from_dict(event.data["message"])
        self.applied = event.seq + 1
        if event.type not in MESSAGE_TYPES and event.type != SURFACE_DROP:
            return
        op = event.surface or {}
        if op.get("op") == "append":
            assert message is not None
            node = Node(event, message, self.turn, self.step)
            if self._pos is not None:
                self._pos[event.seq] = len(self.nodes)
            self.nodes.append(node)
            self._index_add(node)
            for listener in self.listeners:
                listener.on_add(node)
            return
        a = self.position(op["start"])
        b = self.position(op["end"])
        assert a is not None and b is not None
        removed = self.nodes[a : b + 1]
        # a window switch or a handoff replaces every node, or all but the open turn's few: the
        # pairing indexes and the listeners start over from the nodes kept (fewer than those that go)
        # instead of taking ~200 removed nodes off one by one
        rebuild = len(self.nodes) - len(removed) < len(removed)
        first = self.nodes[a]
        replacement = [Node(event, message, first.turn, first.step)] if message is not None else []
        self.nodes[a : b + 1] = replacement
        if event.type == TOOL_RESULT:
            # a content-only replacement keeps the pairing of the call it answers
            self.result_of[message.content[0].call_id] = event.seq  # type: ignore[union-attr]
        elif rebuild:
            self._index_rebuild()
        else:
            self._index_remove(removed)
        self._pos = None
        self.version += 1
        kept = [n for n in self.nodes if n not in replacement] if rebuild else []
        for listener in self.listeners:
            clear = getattr(listener, "on_clear", None) if rebuild else None
            if clear is not None:
                clear()  # the listener starts over from the nodes kept
                for n in kept:
                    listener.on_add(n)
            else:
                listener.on_remove(removed)
            for n in replacement:
                listener.on_add(n)

    def _index_add(self, node: Node) -> None:
        if node.role == "assistant":
            for call in node.message.tool_calls:
                self.pending_calls[call.id] = node.seq
                self.call_owner[call.id] = node.seq
        elif node.role == "tool":
            call_id = node.message.content[0].call_id  # type: ignore[union-attr]
            self.pending_calls.pop(call_id, None)
            self.result_of[call_id] = node.seq

    def _index_rebuild(self) -> None:
        """The pairing indexes built again from the visible nodes, in surface order (a call's
        message before its results), after a replacement that left fewer nodes than it took off.
        Every entry of the three indexes names a visible node (``_index_add`` adds only for the
        node it folds, ``_index_remove`` takes a removed node's entries away, a closed range holds
        both ends of every pair, a snapshot restores a state that held this), so this equals
        ``_index_remove`` of the removed range, walking the few nodes kept instead of the many
        removed (property-tested against it: ``tests/core/test_surface_whole.py``)."""
        self.pending_calls.clear()
        self.call_owner.clear()
        self.result_of.clear()
        for node in self.nodes:
            self._index_add(node)

    def _index_remove(self, nodes: list[Node]) -> None:
        """Forget the pairing of a removed range (one pass over it)."""
        call_owner, pending, result_of = self.call_owner, self.pending_calls, self.result_of
        for node in nodes:
            message = node.message
            role = message.role
            if role == "assistant":
                for block in message.content:
                    if block.type == "tool_call":
                        call_owner.pop(block.id, None)
                        if pending:
                            pending.pop(block.id, None)
            elif role == "tool":
                result_of.pop(message.content[0].call_id, None)  # type: ignore[union-attr]


def replay(events: Iterable[Event]) -> Surface:
    """Fold a whole log into a fresh surface."""
    surface = Surface()
    for event in events:
        surface.apply(event)
    return surface
