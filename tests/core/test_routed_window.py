"""The routed window: ``set_route(provider, model, context_window=...)`` drives pressure and every
strategy's thresholds, live and after the session is reopened (issue 15).

Each shipped profile runs on a 128,000-token model; the session is routed to an 8,000-token one.
The strategy must act (compact, switch, remind, archive) once the routed window's threshold is
crossed, long before the profile's window would be anywhere near it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxkernel import Kernel, Message
from ctxkernel.errors import ConfigError
from ctxkernel.events import COMPACTION_SUMMARY, REQUEST_CONTEXT, USER_MESSAGE
from ctxkernel.profile import load_profile
from ctxkernel.store.jsonl import JsonlStore

ROUTED_WINDOW = 8_000

#: profile -> (the share of the effective window at which it first acts, how to tell it acted)
ACTS_AT = {
    "basic": 0.8,  # [strategies.basic] threshold_ratio
    "decay": 0.70,  # the first of [strategies.decay] warn_ratios: a reminder
    "handoff": 0.70,  # a reminder 0.1 below the host's threshold, then the switch at 0.8
    "rollover": 0.75,  # reminder_ratio: save notes, then a rollover at 0.90
    "chapters": 0.75,  # pressure_suggestion_ratio, then compact_at_ratio 0.90
}


def acted(session, profile: str, since: int) -> bool:
    for event in session.events[since:]:
        if event.type == COMPACTION_SUMMARY and event.data.get("strategy") == profile:
            return True
        if event.type == USER_MESSAGE:
            source = event.data["message"].get("source", {})
            if source.get("kind") == "plugin" and source.get("plugin") == profile:
                return True
    return False


def kernel_for(profile: str, home: Path) -> Kernel:
    return Kernel(load_profile(profile), store=JsonlStore(home, fsync=False), home=home)


def one_turn(session, i: int) -> None:
    session.user(f"request {i}: " + " ".join(f"word{i}x{j}" for j in range(120)))
    session.prepare_request()
    session.commit_reply(Message.assistant(f"answer {i}: " + " ".join(f"reply{i}y{j}" for j in range(120))))
    session.end_turn()


@pytest.mark.parametrize("reopen", [False, True], ids=["live", "reopened"])
@pytest.mark.parametrize("profile", sorted(ACTS_AT))
def test_strategies_act_at_the_routed_windows_threshold(profile, reopen, tmp_path, monkeypatch):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    kernel = kernel_for(profile, tmp_path / "home")
    session = kernel.open_session()
    default = session.pressure().effective_window
    session.set_route(kernel.profile.model.provider, kernel.profile.model.name, context_window=ROUTED_WINDOW)
    routed = session.pressure()
    assert routed.context_window == ROUTED_WINDOW
    assert routed.effective_window == ROUTED_WINDOW - ROUTED_WINDOW // 8 < default // 10
    one_turn(session, 0)
    if reopen:  # a new process: the route, and so the window, is folded from the log
        session_id = session.id
        del session
        kernel = kernel_for(profile, tmp_path / "home")
        session = kernel.open_session(session_id)
        assert session.pressure().effective_window == routed.effective_window
        assert session.model_settings().context_window == ROUTED_WINDOW
    for i in range(1, 40):
        before = session.next_seq
        ratio = session.pressure().ratio
        one_turn(session, i)
        if acted(session, profile, before):
            # it acted at the routed window's threshold, far below the profile's own window
            assert ratio + 0.1 >= ACTS_AT[profile], f"{profile} acted at {ratio:.2f} of the routed window"
            assert session.pressure().tokens < default * 0.1
            return
    pytest.fail(f"{profile} never acted although the routed window filled up (pressure {session.pressure().ratio:.2f})")


def test_a_bad_routed_window_is_refused_and_nothing_is_written(tmp_path):
    kernel = kernel_for("basic", tmp_path)
    session = kernel.open_session()
    session.user("hello")
    before = (tmp_path / f"{session.id}.jsonl").read_bytes() if (tmp_path / f"{session.id}.jsonl").exists() else None
    events = len(session.events)
    for bad in (0, -5, 255, 10**12, True, 8000.5, "8000"):
        with pytest.raises(ConfigError, match="context_window must be a whole number of tokens from 256"):
            session.set_route("openai", "small", context_window=bad)  # type: ignore[arg-type]
    assert len(session.events) == events
    if before is not None:
        assert (tmp_path / f"{session.id}.jsonl").read_bytes() == before


def test_a_routed_window_outlives_profile_edits_but_the_profile_window_does_not(tmp_path):
    kernel = kernel_for("basic", tmp_path)
    pinned = kernel.open_session()
    pinned.set_route("openai", "small", context_window=20_000)
    plain = kernel.open_session()
    plain.set_route("openai", "gpt-4o")
    assert [e.data.get("routed_window") for e in pinned.events if e.type == REQUEST_CONTEXT] == [20_000]
    edited = load_profile("basic")
    edited.model = edited.model.model_copy(update={"context_window": 64_000})
    kernel = Kernel(edited, store=JsonlStore(tmp_path, fsync=False), home=tmp_path)
    assert kernel.open_session(pinned.id).pressure().context_window == 20_000
    assert kernel.open_session(plain.id).pressure().context_window == 64_000


def test_a_routed_window_too_small_for_the_reserve_keeps_a_proportionate_one(tmp_path):
    kernel = kernel_for("basic", tmp_path)
    session = kernel.open_session()
    session.set_route("openai", "tiny", context_window=4_000)  # the profile reserves 8192 for output
    pressure = session.pressure()
    assert (pressure.context_window, pressure.reserved_output_tokens) == (4_000, 500)
    session.set_route("openai", "big", context_window=1_000_000)  # a reserve that fits is kept
    assert session.pressure().reserved_output_tokens == 8_192
