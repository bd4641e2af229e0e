"""Property: any mix of reads, notes, new_context calls (alone or mid batch), turn ends and
restarts keeps every request within the window and balanced, replays to the live surface, keeps
the window chain increasing and consumes each intent at most once."""

from __future__ import annotations

from collections import Counter

from helpers_rollover import call, rollover_kernel, rollover_summaries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message
from ctxkernel.surface import replay
from ctxkernel.testing import check_snapshot_equivalence, request_orphans
from ctxkernel_rollover.state import state_of

ACTION = st.one_of(
    st.tuples(st.just("read"), st.integers(min_value=5, max_value=900)),
    st.tuples(st.just("note"), st.sampled_from(["goal", "plan", "a/b"]), st.text(max_size=40)),
    st.tuples(st.just("new_context")),
    st.tuples(st.just("mixed")),
    st.tuples(st.just("end_turn")),
    st.tuples(st.just("restart")),
)


def reply_for(action, n):
    kind = action[0]
    if kind == "read":
        return Message.assistant("", [call(f"r{n}", "read_file", path=f"f{n}", words=action[1])])
    if kind == "note":
        return Message.assistant("", [call(f"n{n}", "note_append", path=action[1], text=action[2])])
    if kind == "new_context":
        return Message.assistant("", [call(f"c{n}", "new_context", next_goal=f"goal {n}")])
    return Message.assistant(
        "",
        [
            call(f"m{n}a", "note_create", path=f"m/{n}", content="x"),
            call(f"m{n}b", "new_context"),
            call(f"m{n}c", "run", cmd="ls"),
        ],
    )


def check_state(session):
    state = state_of(session.context)
    assert state.chain == sorted(state.chain) and len(set(state.chain)) == len(state.chain)
    assert [n.seq for n in session.surface.nodes] == [n.seq for n in replay(session.events).nodes]
    counts = Counter(s["intent_id"] for s in rollover_summaries(session) if s["intent_id"])
    assert all(v == 1 for v in counts.values())
    if state.number > 1:
        assert session.surface.nodes[0].seq == state.seed_seq


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.lists(ACTION, min_size=1, max_size=24))
def test_rollover_invariants_hold_for_any_session(tmp_path_factory, actions):
    home = tmp_path_factory.mktemp("prop")
    kernel = rollover_kernel(home, window=12_000, reserve=1_000)
    session = kernel.open_session()
    session.user("start")
    for n, action in enumerate(actions):
        if action[0] == "end_turn":
            session.end_turn()
            session.user(f"next {n}")
            continue
        if action[0] == "restart":
            live = ([x.seq for x in session.surface.nodes], state_of(session.context).to_dict())
            session = rollover_kernel(home, window=12_000, reserve=1_000).open_session(session.id)
            assert ([x.seq for x in session.surface.nodes], state_of(session.context).to_dict()) == live
            if not session.turn_open:
                session.user(f"after restart {n}")
            continue
        if not session.turn_open:
            session.user(f"again {n}")
        request = session.prepare_request()
        assert request.pressure.tokens <= request.pressure.effective_window
        assert request_orphans(request) == []
        session.commit_reply(reply_for(action, n))
        for c in session.pending_calls:
            if session.owns_tool(c.name):
                session.tool_result(c.id, session.run_tool(c))
            else:
                session.tool_result(c.id, "word " * c.arguments.get("words", 3))
        if session.conclude_turn:
            session.end_turn()
        check_state(session)
    request = session.prepare_request() if session.turn_open else None
    if request is not None:
        assert request.pressure.tokens <= request.pressure.effective_window
        assert state_of(session.context).pending is None  # an owed switch happened at this pre-step
    check_state(session)


def _kernel(home, snapshots=True):
    kernel = rollover_kernel(home, window=12_000, reserve=1_000)
    kernel.profile.store = kernel.profile.store.model_copy(update={"snapshot_every": 1000 if snapshots else 0})
    return kernel


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.lists(ACTION.filter(lambda a: a[0] != "restart"), min_size=1, max_size=24), st.data())
def test_open_from_a_snapshot_at_random_cuts_equals_the_full_fold(tmp_path_factory, actions, data):
    """The window chain, intents, reminders and failures restored from a session snapshot and
    folded on over the tail are what a fold of the whole log builds, wherever the snapshot was
    taken (between a switch's events, before an owed switch); the open reads no event before it."""
    home = tmp_path_factory.mktemp("snapcut")
    session = _kernel(home).open_session()
    session.user("start")
    for n, action in enumerate(actions):
        if action[0] == "end_turn":
            session.end_turn()
            session.user(f"next {n}")
            continue
        if not session.turn_open:
            session.user(f"again {n}")
        session.prepare_request()
        session.commit_reply(reply_for(action, n))
        for c in session.pending_calls:
            if session.owns_tool(c.name):
                session.tool_result(c.id, session.run_tool(c))
            else:
                session.tool_result(c.id, "word " * c.arguments.get("words", 3))
        if session.conclude_turn:
            session.end_turn()
    length = len(session.events)
    cuts = []
    for _ in range(3):
        cut = data.draw(st.integers(1, length), label="cut")
        cuts.append((cut, data.draw(st.integers(cut, length), label="end")))
    checked = check_snapshot_equivalence(lambda on: _kernel(home, on), session.id, cuts)
    assert [c.loaded_before_snapshot for c in checked] == [0] * len(cuts)
