"""Pressure reminders: growth, warning levels, cooldown, re-baselining; reminders never compress."""

from __future__ import annotations

from ctxkernel import Message, ToolCallBlock
from ctxkernel.events import USER_MESSAGE
from ctxkernel_decay import current_state


def _notices(session):
    return [
        n.message.text
        for n in session.surface
        if n.message.source.plugin == "decay" and n.message.source.form == "notice"
    ]


def _reminders(session):
    return [e.data for e in session.events if e.type == "decay/reminder"]


def _grow(session, n: int, size: int, start: int = 0, per_turn: int = 3) -> list:
    """``n`` steps, each adding one tool result of about ``size`` tokens; a new turn every
    ``per_turn`` steps (the current turn is never compressed, so only earlier turns leave
    something for a reminder to name)."""
    requests = []
    for i in range(start, start + n):
        if i > start and i % per_turn == 0:
            session.end_turn()
            session.user(f"go on with part {i}")
        requests.append(session.prepare_request())
        session.commit_reply(Message.assistant("", [ToolCallBlock(f"g{i}", "read", {"path": f"{i}.txt"})]))
        session.tool_result(f"g{i}", " ".join(f"w{i}x{k}" for k in range(size // 3)))
    return requests


def test_a_growth_reminder_then_warnings_per_level(make_decay_kernel):
    session = make_decay_kernel(
        window=21_000, reserve=1_000, settings={"growth_tokens": 3_000, "cooldown_steps": 3}
    ).open_session()
    session.user("start")
    _grow(session, 30, 600)
    fired = _reminders(session)
    levels = [r["level"] for r in fired]
    assert levels[0] == 0  # growth first, long before any warning
    assert 1 in levels and 2 in levels  # 70% then 81% of 20k
    growth = [r for r in fired if r["level"] == 0]
    assert all(r["grew"] >= 3_000 for r in growth)
    # a warning names its level, and a growth reminder the growth (read from the log: the guard's
    # basic summary at the full window may have summarised the earliest notices away)
    notes = [
        m.text
        for e in session.events
        if e.type == USER_MESSAGE
        and (m := Message.from_dict(e.data["message"])).source.plugin == "decay"
        and m.source.form == "notice"
    ]
    assert any("Warning 1/3" in t for t in notes) and any("grew" in t for t in notes)
    # reminders never compress: the model decides (only basic's emergency fallback may act)
    assert not any(e.type == "compaction/start" and e.data["strategy"] == "decay" for e in session.events)


def test_cooldown_limits_one_reminder_per_level(make_decay_kernel):
    session = make_decay_kernel(
        window=6_600, reserve=500, settings={"growth_tokens": 10**6, "cooldown_steps": 5}, strategies=("decay",)
    ).open_session()
    session.user("start")
    _grow(session, 14, 250)
    steps_by_level: dict[int, list[int]] = {}
    steps = 0
    for e in session.events:
        if e.type == "step/start":
            steps += 1
        elif e.type == "decay/reminder":
            steps_by_level.setdefault(e.data["level"], []).append(steps)
    assert steps_by_level, "no warning fired"
    for fired in steps_by_level.values():
        assert all(b - a >= 5 for a, b in zip(fired, fired[1:], strict=False)), fired


def test_a_compression_rebaselines_growth(make_decay_kernel, make_driver):
    session = make_decay_kernel(window=200_000, settings={"growth_tokens": 2_000, "cooldown_steps": 0}).open_session()
    driver = make_driver(session)
    session.user("start")
    _grow(session, 8, 600)
    first = _reminders(session)
    assert first and first[-1]["level"] == 0
    baseline = current_state(session.context).baseline
    # the two finished turns: ⟦p1⟧ "start" and three results, ⟦p5⟧ "go on" and three results (a
    # tool-call-only message carries no anchor); the open third turn is never compressed
    out = driver.run_tool("compress", {"spans": [{"from": "p1", "to": "p8", "summary": "read six files"}]})
    assert not out.is_error, out.content
    session.prepare_request()  # pre_step notices the drop in pressure
    rebased = [e.data for e in session.events if e.type == "decay/baseline"]
    assert rebased and rebased[-1]["tokens"] < baseline
    assert current_state(session.context).baseline == rebased[-1]["tokens"]


def test_reminder_state_survives_a_restart(make_decay_kernel):
    kernel = make_decay_kernel(window=21_000, reserve=1_000, settings={"growth_tokens": 3_000})
    session = kernel.open_session()
    session.user("start")
    _grow(session, 12, 600)
    live = current_state(session.context)
    again = make_decay_kernel(window=21_000, reserve=1_000, settings={"growth_tokens": 3_000}).open_session(session.id)
    state = current_state(again.context)
    assert (state.baseline, state.fired, state.steps) == (live.baseline, live.fired, live.steps)


def test_a_reminder_names_the_compressible_range_and_none_fires_inside_one_turn(make_decay_kernel):
    session = make_decay_kernel(
        window=21_000, reserve=1_000, settings={"growth_tokens": 3_000, "cooldown_steps": 3}
    ).open_session()
    session.user("start")  # ⟦p1⟧, then twelve results ⟦p2⟧..⟦p13⟧ (the call messages carry no anchor)
    _grow(session, 12, 600, per_turn=100)
    # everything is the current turn, which is never compressed: a reminder could only be refused
    assert not _reminders(session) and not _notices(session)
    session.end_turn()
    session.user("next")  # ⟦p14⟧
    _grow(session, 2, 600, start=12, per_turn=100)
    (reminder,) = _notices(session)
    assert "grew" in reminder
    assert "compressible: ⟦p1⟧ through ⟦p13⟧; the current turn (from ⟦p14⟧) stays verbatim" in reminder
