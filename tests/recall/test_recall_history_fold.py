"""The history index's one-pass fold (``History._scan``, store8) is the per-event fold it replaced.

The reference below is the fold as it was before: three calls per event (``_index`` for the call
ids and instructions, ``_fold`` for the windows and task pointers, ``role_of`` for the role),
copied unchanged. Drawn logs, including the malformed shapes a fold meets (plugin-sourced user
messages, replaced rather than appended ones, unknown summary kinds, repeated call ids, several
todo calls in one message), are folded by both, whole, in drawn pieces, and from a drawn snapshot
cut (whose head is folded on first read), and every index must come out the same.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.events import (
    ASSISTANT_MESSAGE,
    COMPACTION_SUMMARY,
    SESSION_TASK,
    TOOL_RESULT,
    USER_MESSAGE,
    Event,
)
from ctxkernel.recall.history import GOAL_SCAN, TODO_TOOLS, WINDOW_KINDS, History, Window
from ctxkernel.recall.history_index import _source_kind
from ctxkernel.task import substantive


class ReferenceHistory(History):
    """The fold before store8: ``_index``, ``_fold`` and ``role_of`` called per event."""

    def sync(self) -> int:
        events = self.session.events
        if not self.windows:
            self.windows.append(Window(1, 0, started=events[0].time if events else ""))
            self.window_starts.append(0)
        start, end = self.cursor, len(events)
        if start == end:
            return 0
        if not self.windows[0].started:
            self.windows[0].started = events[0].time
        for i in range(start, end):
            event = events[i]
            self._reference_index(event, self._tool_names, self._call_seqs, self._instructions)
            self._reference_fold(event)
            self._role_by_seq.append(self.role_of(event))
        self.cursor = end
        self.scanned += end - start
        return end - start

    def _fold_head(self) -> None:
        head, self._head = self._head, 0
        if not head:
            return
        events = self.session.events
        names: dict[str, str] = {}
        seqs: dict[str, int] = {}
        instructions: list[int] = []
        roles = []
        for i in range(head):
            event = events[i]
            self._reference_index(event, names, seqs, instructions)
            roles.append(self.role_of(event))
        self._role_by_seq[:0] = roles
        self._instructions[:0] = instructions
        self._tool_names = {**names, **self._tool_names}
        self._call_seqs = {**seqs, **self._call_seqs}

    @staticmethod
    def _reference_index(event: Event, names: dict[str, str], seqs: dict[str, int], instructions: list[int]) -> None:
        t = event.type
        if t == ASSISTANT_MESSAGE:
            for block in event.data["message"].get("content", ()):
                if block.get("type") == "tool_call":
                    call_id = block.get("id")
                    names[call_id] = block.get("name")
                    seqs[call_id] = event.seq
        elif t == USER_MESSAGE and (event.surface or {}).get("op") == "append" and _source_kind(event.data) == "user":
            instructions.append(event.seq)

    def _reference_fold(self, event: Event) -> None:
        t = event.type
        if t == ASSISTANT_MESSAGE:
            for i, block in enumerate(event.data["message"].get("content", ())):
                if block.get("type") == "tool_call" and block.get("name") in TODO_TOOLS:
                    self.todo_seq, self.todo_call = event.seq, i
        elif t == USER_MESSAGE:
            if (
                self._goal_scanned < GOAL_SCAN
                and (event.surface or {}).get("op") == "append"
                and _source_kind(event.data) == "user"
            ):
                self._goal_scanned += 1
                if substantive(self.text_of(event)):
                    self.goal_instruction, self._goal_scanned = event.seq, GOAL_SCAN
                elif self.goal_instruction is None:
                    self.goal_instruction = event.seq
        elif t == SESSION_TASK:
            d = event.data
            if isinstance(d.get("goal"), str):
                self.goal_seq = event.seq if d["goal"] else None
            if isinstance(d.get("todos"), list):
                self.task_todos_seq = event.seq
        elif t == COMPACTION_SUMMARY and event.data.get("kind") in WINDOW_KINDS:
            d = event.data
            outgoing = self.windows[-1]
            outgoing.end_seq = event.seq
            outgoing.closed_by = event.seq
            outgoing.ended = event.time
            window_id = d.get("window_id")
            self.windows.append(
                Window(
                    outgoing.number + 1,
                    event.seq + 1,
                    id=window_id if isinstance(window_id, str) else None,
                    opened_by=event.seq,
                    reason=d.get("reason") if isinstance(d.get("reason"), str) else None,
                    strategy=d.get("strategy"),
                    started=event.time,
                    opened_as=WINDOW_KINDS[d["kind"]],
                )
            )
            self.window_starts.append(event.seq + 1)


TEXTS = st.sampled_from(["hi", "ok", "", "fix the parser in src/parse.py", "go on please now", "thanks"])
TOOL_NAMES = st.sampled_from(["read_file", "TodoWrite", "update_plan", "bash", "todo_write"])
CALL_IDS = st.sampled_from(["c1", "c2", "c3", "c4"])  # few: repeated ids overwrite
BLOCKS = st.one_of(
    st.builds(lambda text: {"type": "text", "text": text}, TEXTS),
    st.builds(lambda text: {"type": "reasoning", "text": text}, TEXTS),
    st.builds(
        lambda call_id, name: {"type": "tool_call", "id": call_id, "name": name, "arguments": {"todos": []}},
        CALL_IDS,
        TOOL_NAMES,
    ),
)
SURFACES = st.sampled_from([{"op": "append"}, {"op": "replace", "start": 0, "end": 0, "cites": [0]}, None])
SOURCES = st.sampled_from([None, {"kind": "user"}, {"kind": "plugin", "plugin": "t"}, {}])


def _user(text: str, source: dict | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": text}]}
    if source is not None:
        message["source"] = source
    return {"message": message}


# (type, data, surface) of one drawn event
DRAWN_EVENTS = st.one_of(
    st.tuples(st.just(USER_MESSAGE), st.builds(_user, TEXTS, SOURCES), SURFACES),
    st.tuples(
        st.just(ASSISTANT_MESSAGE),
        st.builds(lambda blocks: {"message": {"role": "assistant", "content": blocks}}, st.lists(BLOCKS, max_size=4)),
        st.just({"op": "append"}),
    ),
    st.tuples(
        st.just(TOOL_RESULT),
        st.builds(lambda call_id: {"message": {"role": "tool", "content": [], "call_id": call_id}}, CALL_IDS),
        st.just({"op": "append"}),
    ),
    st.tuples(
        st.just(COMPACTION_SUMMARY),
        st.fixed_dictionaries(
            {"compaction_id": st.just("x"), "summary": TEXTS, "cites": st.just([0])},
            optional={
                "kind": st.sampled_from(["window", "summary", "checkpoint", "prune", "other"]),
                "window_id": st.one_of(st.just("w-1"), st.integers(0, 3)),
                "reason": st.one_of(st.just("full"), st.none()),
                "strategy": st.just("handoff"),
            },
        ),
        st.none(),
    ),
    st.tuples(
        st.just(SESSION_TASK),
        st.fixed_dictionaries(
            {"by": st.just("api")},
            optional={
                "goal": st.one_of(TEXTS, st.integers(0, 2)),
                "todos": st.one_of(st.just([{"text": "a", "status": "pending"}]), st.just("no")),
            },
        ),
        st.none(),
    ),
    st.tuples(st.sampled_from(["step/start", "turn/end", "handoff/note"]), st.just({"turn": 1, "step": 1}), st.none()),
)


def drawn_log(drawn: list[tuple[str, dict, dict | None]]) -> list[Event]:
    return [
        Event(seq, etype, data, f"2026-01-01T00:00:{seq % 60:02d}.000Z", surface, etype == "handoff/note")
        for seq, (etype, data, surface) in enumerate(drawn)
    ]


def fake_session(events: list[Event]) -> Any:
    """What History reads of a session: its events, its state and the snapshot's indexes."""
    return SimpleNamespace(id="s", events=events, state={}, snapshot_indexes={})


def indexes(history: History) -> dict[str, Any]:
    """Everything the fold builds, read through the properties (which fold a snapshot's head)."""
    return {
        "tool_names": history.tool_names,
        "call_seqs": history.call_seqs,
        "instructions": history.instructions,
        "roles": history._role_by_seq,
        "windows": history.windows,
        "window_starts": history.window_starts,
        "todo": (history.todo_seq, history.todo_call),
        "goal": (history.goal_seq, history.goal_instruction, history._goal_scanned),
        "task_todos_seq": history.task_todos_seq,
        "cursor": history.cursor,
    }


@settings(max_examples=200, deadline=None)
@given(drawn=st.lists(DRAWN_EVENTS, max_size=60), cuts=st.lists(st.integers(0, 60), max_size=3))
def test_one_pass_fold_is_the_per_event_fold(drawn, cuts):
    events = drawn_log(drawn)
    expected = ReferenceHistory(fake_session(events))
    expected.sync()
    whole = History(fake_session(events))
    whole.sync()
    assert indexes(whole) == indexes(expected)
    # folded in pieces, as a live session's queries fold what was appended since the last one
    log: list[Event] = []
    pieces = History(fake_session(log))
    for cut in [*sorted(cuts), len(events)]:
        log.extend(events[len(log) : max(len(log), cut)])
        pieces.sync()
    assert indexes(pieces) == indexes(expected)


@settings(max_examples=200, deadline=None)
@given(drawn=st.lists(DRAWN_EVENTS, min_size=1, max_size=60), cut=st.integers(1, 60))
def test_a_snapshots_head_folds_as_the_per_event_fold(drawn, cut):
    events = drawn_log(drawn)
    cut = min(cut, len(events))
    expected = ReferenceHistory(fake_session(events))
    expected.sync()
    before = History(fake_session(events[:cut]))
    folded = before.folded()
    restored = History(fake_session(events))
    restored._restore(folded)
    assert restored._head == cut
    restored.sync()
    assert indexes(restored) == indexes(expected)
