"""basic does not loop: a compaction that cannot lower the pressure is not repeated at every step."""

from __future__ import annotations

from ctxkernel import Message
from ctxkernel.events import COMPACTION_START, COMPACTION_SUMMARY
from ctxkernel.testing import build_kernel, make_profile

WINDOW = 20_000
RESERVED = 1_000  # effective window 19,000; threshold 0.8 = 15,200 tokens
#: a system prompt of ~9,000 tokens (under half the window: the kernel refuses a larger header up
#: front) and a provider that reports 7,000 tokens of its own framing on top of what it was sent
#: (within the plausible band) keep every request above the threshold whatever the surface holds
STUCK_SYSTEM_PROMPT = "alpha " * 9_000
PROVIDER_FRAMING = 7_000
TURNS = 60


def _kernel(home, **basic):
    profile = make_profile(
        model={"context_window": WINDOW, "reserved_output_tokens": RESERVED}, strategies={"basic": basic}
    )
    profile.profile.system_prompt = STUCK_SYSTEM_PROMPT
    return build_kernel(home, strategies=["basic"], profile=profile)


def _turn(session, n: int) -> None:
    session.user(f"request {n}: " + " ".join(f"word{n}_{i}" for i in range(30)))
    session.prepare_request()
    reply = Message.assistant(f"answer {n}: " + " ".join(f"fact{n}_{i}" for i in range(30)))
    sent = session.request_header().tokens + session.meter.surface_tokens()  # the meter's count of the request
    usage = {"prompt_tokens": sent + PROVIDER_FRAMING, "completion_tokens": session.meter.count_message(reply)}
    session.commit_reply(reply, usage=usage)
    session.end_turn()


def _compactions(session) -> int:
    return sum(1 for e in session.events if e.type == COMPACTION_SUMMARY and e.data.get("strategy") == "basic")


def test_a_compaction_that_leaves_the_pressure_high_is_not_repeated_every_request(tmp_path):
    session = _kernel(tmp_path).open_session()
    for n in range(TURNS):
        _turn(session, n)
    assert session.pressure().ratio >= 0.8  # the pressure stayed high the whole time
    compactions = _compactions(session)
    # each turn adds ~300 tokens; a new compaction waits for 10% of the window (1,900 tokens)
    assert 1 <= compactions <= TURNS // 4, compactions


def test_without_the_back_off_the_same_session_compacts_at_every_request(tmp_path):
    # the control: proves the workload above is a compaction storm when nothing holds basic back
    session = _kernel(tmp_path, regrow_ratio=0).open_session()
    for n in range(TURNS):
        _turn(session, n)
    assert _compactions(session) > TURNS // 2, _compactions(session)


def test_a_reopened_session_holds_back_like_the_live_one(tmp_path):
    kernel = _kernel(tmp_path)
    session = kernel.open_session()
    n = 0
    while True:  # run until a turn ends with a fresh compaction
        before = _compactions(session)
        _turn(session, n)
        n += 1
        if _compactions(session) > before:
            break
        assert n < TURNS
    reopened = _kernel(tmp_path).open_session(session.id)
    starts = sum(1 for e in reopened.events if e.type == COMPACTION_START)
    _turn(reopened, n)  # far less growth than 10% of the window since that compaction
    assert reopened.pressure().ratio >= 0.8
    assert sum(1 for e in reopened.events if e.type == COMPACTION_START) == starts
