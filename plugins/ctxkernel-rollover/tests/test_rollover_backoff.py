"""Automatic rollover when the window is full but its surface is small (the system prompt and the
tools take the rest): the minimal seed is always admitted, and a switch that cannot help is
reported once and not retried on every request.

The provider reports usage honestly here (a figure far from the meter's count is set aside, see
docs/security.md), so the header is what fills the window: :func:`fill_window` grows the
profile's system prompt until the request reaches a given share of the effective window."""

from __future__ import annotations

from helpers_rollover import rollover_kernel, rollover_summaries

from ctxkernel import Message
from ctxkernel_rollover.plugin import RETRY_GROWTH, RETRY_MIN_GROWTH
from ctxkernel_rollover.seed import NOT_SHOWN
from ctxkernel_rollover.state import state_of

# effective window 5,000 tokens; the automatic switch is due at 4,500
WINDOW, RESERVE = 6_000, 1_000
#: the recall tools from the first request, so the header is the same bytes before and after a
#: switch and the share of the window it takes is what fill_window set
FIXED_HEADER = {"offer": "always"}


def instruction(n: int) -> str:
    return f"instruction {n}: " + "keep the parser strict about trailing commas and report the line " * 2


def small_turn(session, text: str) -> None:
    """A user message and one reply, with the usage an honest provider reports."""
    session.user(text)
    request = session.prepare_request()
    reply = Message.assistant("ok")
    session.commit_reply(
        reply, usage={"prompt_tokens": request.pressure.tokens, "completion_tokens": session.meter.count_message(reply)}
    )
    session.end_turn()


#: one token per repetition with cl100k (checked by fill_window)
FILLER = "alpha "


def fill_window(session, ratio: float) -> str:
    """Make the next request ``ratio`` of the effective window while the surface stays small: the
    provider reports the tokens its own framing adds (a usage figure within the plausible band,
    docs/security.md), which no switch can remove. A system prompt that large would be refused by
    the kernel up front (``HeaderTooLargeError``). Returns the system prompt (unchanged)."""
    target = int(ratio * session.pressure().effective_window)
    # the band admits a figure up to twice the meter's count plus a slack of an eighth of the
    # window: a surface of a few hundred tokens lets the figure reach the target
    while 2 * session.pressure().tokens + 600 < target:
        small_turn(session, "context: " + "the parser reads every module and records its imports " * 25)
    session.user("status?")
    request = session.prepare_request()
    reply = Message.assistant("ok")
    counted = request.pressure.tokens
    session.commit_reply(reply, usage={"prompt_tokens": counted, "completion_tokens": 1})
    session.end_turn()
    pressure = session.pressure()
    missing = int(ratio * pressure.effective_window) - pressure.tokens
    assert missing > 0, (ratio, pressure)
    session.user("status again?")
    request = session.prepare_request()
    session.commit_reply(reply, usage={"prompt_tokens": request.pressure.tokens + missing, "completion_tokens": 1})
    session.end_turn()
    pressure = session.pressure()
    assert pressure.anchored and abs(pressure.tokens - int(ratio * pressure.effective_window)) <= 40, pressure
    return session.kernel.profile.profile.system_prompt


def failures(session):
    return [e.data for e in session.events if e.type == "rollover/failed"]


def notices(session):
    return [
        e
        for e in session.events
        if e.type == "user/message" and "[rollover]" in Message.from_dict(e.data["message"]).text
    ]


def test_the_seed_budget_admits_the_minimal_seed(tmp_path):
    # fifty earlier instructions, each shown with a floor of 200 characters, make the smallest full
    # seed larger than seed_ratio of the window; the switch then uses the minimal seed, not a failure
    session = rollover_kernel(tmp_path, instructions_count=50).open_session()
    for n in range(50):
        small_turn(session, instruction(n))
    surface = session.meter.surface_tokens()
    assert surface < 0.9 * (WINDOW - RESERVE)
    small_turn(session, "one more small step")
    fill_window(session, 0.93)
    session.user("and the next one")
    session.prepare_request()
    assert failures(session) == [], failures(session)
    assert [d["trigger"] for d in rollover_summaries(session)] == ["auto"]
    seed = session.surface.nodes[0].message.text
    assert NOT_SHOWN in seed and "and the next one" in seed  # the minimal seed keeps the pending input
    # the seed within seed_ratio, plus the user's instructions the kernel keeps ([instructions])
    budget = session.kernel.profile.instructions.budget_ratio
    assert session.meter.surface_tokens() < (0.25 + budget) * (WINDOW - RESERVE)


def test_a_failed_automatic_switch_backs_off_until_the_surface_grows(tmp_path):
    window, reserve = WINDOW, RESERVE
    session = rollover_kernel(tmp_path, window=window, reserve=reserve, tools=FIXED_HEADER).open_session()
    # the provider's framing fills the window while the surface is small: a new window could not
    # relieve it, so the automatic switch fails (loudly) ...
    small_turn(session, "hi")
    prompt = fill_window(session, 0.93)
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
    while session.meter.surface_tokens() + 40 < retry_at and session.pressure().ratio < 0.97:
        small_turn(session, f"small step {requests}")
        requests += 1
    assert requests >= 3
    assert len(failures(session)) == 1
    # a restarted process folds the failure from the log and backs off the same way
    kernel = rollover_kernel(tmp_path, window=window, reserve=reserve, tools=FIXED_HEADER)
    kernel.profile.profile.system_prompt = prompt
    reopened = kernel.open_session(session.id)
    assert state_of(reopened.context).last_failure is not None
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
    session = rollover_kernel(tmp_path, tools=FIXED_HEADER).open_session()
    small_turn(session, "hi")
    fill_window(session, 0.93)
    session.user("go on")
    session.prepare_request()
    assert [d["trigger"] for d in failures(session)] == ["auto"]
    session.commit_reply(Message.assistant("ok"))
    session.end_turn()
    fill_window(session, 1.05)
    session.user("next")
    session.prepare_request()  # over the window now: a different situation, so it is tried
    tried = [d["trigger"] for d in failures(session)] + [d["trigger"] for d in rollover_summaries(session)]
    assert tried == ["auto", "overflow"]
