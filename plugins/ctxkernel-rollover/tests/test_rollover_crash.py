"""Crash consistency: the chain, notes and pending intent come from the log alone; a kill at any
point between intent and committed switch resumes with the old or the new window, never a
mixture, and an intent never causes two switches."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from helpers_rollover import call, rollover_kernel, rollover_summaries, step

from ctxkernel import Message, ScriptedModel
from ctxkernel.recall.notes import Notes
from ctxkernel.surface import replay
from ctxkernel_rollover.state import state_of

HERE = Path(__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {here!r})
    from pathlib import Path
    from helpers_rollover import call, rollover_kernel, step
    from ctxkernel import Message, ScriptedModel
    from ctxkernel.store.jsonl import JsonlStore

    when, kill_at = {when!r}, {kill_at!r}
    original = JsonlStore.append

    def append(self, session_id, events, expected_seq):
        if kill_at in [e.type for e in events]:
            if when == "before":
                os._exit(9)  # killed before this batch reached the disk
            original(self, session_id, events, expected_seq)
            os._exit(9)  # killed right after this batch became durable
        return original(self, session_id, events, expected_seq)

    JsonlStore.append = append
    home = Path({home!r})
    kernel = rollover_kernel(home, window=32_000, reserve=2_000)
    session = kernel.open_session("crashy", create=True)
    session.user("work")
    step(session, ScriptedModel([Message.assistant("", [
        call("a", "note_create", path="goal", content="SURVIVES"),
        call("b", "new_context", next_goal="after the crash"),
    ])]))
    session.end_turn()
    session.user("resume please")
    session.prepare_request()
    os._exit(0)
    """
)


@pytest.mark.parametrize(
    ("when", "kill_at", "switched"),
    [
        ("after", "rollover/intent", False),  # the intent is durable, its tool result is not
        ("before", "compaction/start", False),  # the switch's batch never reached the disk
        ("after", "compaction/end", True),  # the switch committed, nothing after it did
    ],
)
def test_kill_between_intent_and_switch_resumes_old_or_new_window_once(tmp_path, when, kill_at, switched):
    child = CHILD.format(here=str(HERE), home=str(tmp_path), when=when, kill_at=kill_at)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr
    kernel = rollover_kernel(tmp_path, window=32_000, reserve=2_000)
    session = kernel.open_session("crashy")
    state = state_of(session.context)
    committed = rollover_summaries(session)
    if switched:  # the new window, the intent consumed
        assert len(committed) == 1 and state.pending is None and state.number == 2
        assert session.surface.nodes[0].message.source.form == "seed"
    else:  # the old window, the intent still owed
        assert committed == [] and state.pending is not None and state.number == 1
        assert all(n.message.source.form != "seed" for n in session.surface.nodes)
    assert Notes.for_session(session).read("goal").content == "SURVIVES"
    surface_after_open = [n.seq for n in session.surface.nodes]
    again = rollover_kernel(tmp_path, window=32_000, reserve=2_000).open_session("crashy")
    assert [n.seq for n in again.surface.nodes] == surface_after_open  # resume replays the same surface
    model = ScriptedModel([Message.assistant("continuing"), Message.assistant("still here")])
    if not again.turn_open:
        again.user("resume please")
    step(again, model)
    step_seq = len(again.events)
    assert len(rollover_summaries(again)) == 1  # exactly one switch for the one intent
    assert again.surface.nodes[0].message.source.form == "seed"
    assert (
        "after the crash" in again.surface.nodes[0].message.text and "SURVIVES" in again.surface.nodes[0].message.text
    )
    again.end_turn()
    third = rollover_kernel(tmp_path, window=32_000, reserve=2_000).open_session("crashy")
    third.user("more")
    step(third, model)
    assert len(rollover_summaries(third)) == 1  # the consumed intent is not replayed into a second switch
    assert len(third.events) > step_seq


def full_log(home: Path) -> Path:
    """A session with manual and automatic switches; returns its log file."""
    kernel = rollover_kernel(home, window=12_000, reserve=1_000)
    session = kernel.open_session("full", create=True)
    count = {"n": 0}

    def script(messages, system, tools):
        count["n"] += 1
        n = count["n"]
        if n == 1:
            return Message.assistant("", [call("g", "note_create", path="goal", content="G1")])
        if n % 25 == 0:
            return Message.assistant(
                "",
                [
                    call(f"w{n}", "note_append", path="goal", text=f"+{n}"),
                    call(f"c{n}", "new_context", next_goal=f"goal {n}"),
                    call(f"x{n}", "run", cmd="ls"),
                ],
            )
        return Message.assistant("", [call(f"r{n}", "read_file", path="f")])

    model = ScriptedModel(script)
    for turn in range(6):
        session.user(f"turn {turn}")
        for _ in range(20):
            step(session, model, harness=lambda c: "line of output\n" * 150)
            if not session.wants_another_step:
                break
        session.end_turn()
    summaries = rollover_summaries(session)
    assert {"manual", "auto"} <= {s["trigger"] for s in summaries}
    return session.store.path(session.id)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_crash_point_replays_to_a_whole_window(tmp_path):
    log = full_log(tmp_path / "full")
    lines = log.read_bytes().splitlines(keepends=True)
    header, events = lines[0], lines[1:]
    checked = 0
    for cut in range(1, len(events) + 1, 3):
        home = tmp_path / f"cut{cut}"
        (home / "sessions").mkdir(parents=True)
        (home / "sessions" / log.name).write_bytes(header + b"".join(events[:cut]))
        kernel = rollover_kernel(home, window=12_000, reserve=1_000)
        session = kernel.open_session("full", repair=False)
        state = state_of(session.context)
        # never a mixture: the first node is the current window's seed, or there was no switch yet
        if state.number > 1:
            assert session.surface.nodes[0].seq == state.seed_seq
            assert f'current="{state.current}"' in session.surface.nodes[0].message.text
        else:
            assert all(n.message.source.form != "seed" for n in session.surface.nodes)
        assert [n.seq for n in session.surface.nodes] == [n.seq for n in replay(session.events).nodes]
        intents = Counter(s["intent_id"] for s in rollover_summaries(session) if s["intent_id"])
        assert all(v == 1 for v in intents.values())
        # resume: repair, then continue one step; a pending intent is consumed exactly once
        resumed = rollover_kernel(home, window=12_000, reserve=1_000).open_session("full")
        pending = state_of(resumed.context).pending
        before = len(rollover_summaries(resumed))
        if not resumed.turn_open:
            resumed.user("resume")
        if resumed.surface.pending_calls:
            for c in resumed.pending_calls:
                resumed.tool_result(c.id, "late")
        step(resumed, ScriptedModel([Message.assistant("ok")]))
        after = rollover_summaries(resumed)
        if pending is not None:
            assert len(after) == before + 1 and after[-1]["intent_id"] == pending["intent_id"]
        intents = Counter(s["intent_id"] for s in after if s["intent_id"])
        assert all(v == 1 for v in intents.values())
        checked += 1
        shutil.rmtree(home)
    assert checked > 20
