"""Automatic rollover when the window is full but its surface is small (the provider's count, the
system prompt and the tools take the rest): the minimal seed is always admitted, and a switch
that cannot help is reported once and not retried on every request."""

from __future__ import annotations

from helpers_rollover import rollover_kernel, rollover_summaries

from ctxkernel import Message
from ctxkernel_rollover.plugin import RETRY_GROWTH, RETRY_MIN_GROWTH
from ctxkernel_rollover.seed import NOT_SHOWN
from ctxkernel_rollover.state import state_of

# effective window 5,000 tokens; the automatic switch is due at 4,500
WINDOW, RESERVE = 6_000, 1_000


def instruction(n: int) -> str:
    return f"instruction {n}: " + "keep the parser strict about trailing commas and report the line " * 2


def small_turn(session, text: str, *, prompt_tokens: int | None = None) -> None:
    """A user message and one reply; ``prompt_tokens`` is what the provider says the request cost."""
    session.user(text)
    session.prepare_request()
    usage = None if prompt_tokens is None else {"prompt_tokens": prompt_tokens, "completion_tokens": 5}
    session.commit_reply(Message.assistant("ok"), usage=usage)
    session.end_turn()


def failures(session):
    return [e.data for e in session.events if e.type == "rollover/failed"]


def notices(session):
    return [e for e in session.events if e.type == "user/message" and "[rollover]" in Message.from_dict(e.data["message"]).text]


def test_the_seed_budget_admits_the_minimal_seed(tmp_path):
    # fifty earlier instructions, each shown with a floor of 200 characters, make the smallest full
    # seed larger than seed_ratio of the window; the switch then uses the minimal seed, not a failure
    session = rollover_kernel(tmp_path, instructions_count=50).open_session()
    for n in range(50):
        small_turn(session, instruction(n))
    surface = session.meter.surface_tokens()
    assert surface < 0.9 * (WINDOW - RESERVE)
    small_turn(session, "one more small step", prompt_tokens=int(0.93 * (WINDOW - RESERVE)))
    session.user("and the next one")
    session.prepare_request()
    assert failures(session) == [], failures(session)
    assert [d["trigger"] for d in rollover_summaries(session)] == ["auto"]
    seed = session.surface.nodes[0].message.text
    assert NOT_SHOWN in seed and "and the next one" in seed  # the minimal seed keeps the pending input
    assert session.meter.surface_tokens() < 0.25 * (WINDOW - RESERVE)


def test_a_failed_automatic_switch_backs_off_until_the_surface_grows(tmp_path):
    window, reserve = 20_000, 1_000
    session = rollover_kernel(tmp_path, window=window, reserve=reserve).open_session()
    # the provider says the window is nearly full while the surface is a few dozen tokens: a new
    # window could not relieve it, so the automatic switch fails (loudly) ...
    small_turn(session, "hi", prompt_tokens=int(0.93 * (window - reserve)))
    session.user("go on")
    session.prepare_request()
    assert [d["trigger"] for d in failures(session)] == ["auto"]
    assert "cannot relieve" in failures(session)[0]["error"]
    assert len(notices(session)) == 1  # reported to the model, no summary fallback
    session.commit_reply(Message.assistant("ok"))
    session.end_turn()
    failed_at = failures(session)[0]["surface_tokens"]
    retry_at = failed_at + max(int(failed_at * RETRY_GROWTH), int((window - reserve) * RETRY_MIN_GROWTH))
    # ... and is not retried on every request while the surface stays about the same
    requests = 0
    while session.meter.surface_tokens() + 40 < retry_at:
        small_turn(session, f"small step {requests}")
        requests += 1
    assert requests >= 3
    assert len(failures(session)) == 1
    # a restarted process folds the failure from the log and backs off the same way
    reopened = rollover_kernel(tmp_path, window=window, reserve=reserve).open_session(session.id)
    assert state_of(reopened).last_failure is not None
    reopened.user("after the restart")
    reopened.prepare_request()
    assert len(failures(reopened)) == 1
    reopened.commit_reply(Message.assistant("ok"))
    reopened.end_turn()
    # once the surface has grown materially the switch is tried again (and fails loudly again)
    small_turn(reopened, "a long instruction: " + "describe every module and its tests in detail " * 60)
    reopened.user("go")
    reopened.prepare_request()
    assert len(failures(reopened)) == 2


def test_the_protective_overflow_switch_is_not_held_back_by_an_automatic_failure(tmp_path):
    session = rollover_kernel(tmp_path).open_session()
    small_turn(session, "hi", prompt_tokens=int(0.93 * (WINDOW - RESERVE)))
    session.user("go on")
    session.prepare_request()
    assert [d["trigger"] for d in failures(session)] == ["auto"]
    session.commit_reply(Message.assistant("ok"), usage={"prompt_tokens": WINDOW, "completion_tokens": 5})
    session.end_turn()
    session.user("next")
    session.prepare_request()  # over the window now: a different situation, so it is tried
    assert [d["trigger"] for d in failures(session)] == ["auto", "overflow"]
