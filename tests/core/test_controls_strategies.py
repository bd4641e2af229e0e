"""``compact now`` in each shipped strategy's own terms (issue #15), through the installed plugins
and the shipped profiles: basic summarises, decay writes the seed's ``/compact`` checkpoint before
the current turn, handoff and rollover switch windows, chapters continues in a new session (or
archives in place)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxkernel import Kernel, Message, Session
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def kernel_for(name: str, home: Path) -> Kernel:
    profile = make_profile(
        PROFILES / f"{name}.toml",
        model={"provider": "scripted", "name": "scripted-1", "context_window": 20_000, "reserved_output_tokens": 1_000},
    )
    profile.model_policies = []
    return Kernel(profile, store=JsonlStore(home), home=home, entry_points=True)


def grow(session: Session, turns: int = 10) -> None:
    for turn in range(turns):
        # the bulk is the model's output: the user's instructions, which the kernel keeps verbatim
        # through every compaction within their budget, stay small
        session.user(f"turn {turn}: check module {turn} and report what it does, with care")
        session.prepare_request()
        session.commit_reply(Message.assistant(f"module {turn} parses input " + "and more " * 240))
        session.end_turn()


def kinds(session: Session) -> list[tuple[str, str]]:
    return [(e.data["strategy"], e.data["kind"]) for e in session.events if e.type == "compaction/summary"]


@pytest.mark.parametrize(
    ("profile", "strategy", "kind"),
    [
        ("basic", "basic", "summary"),
        ("decay", "decay", "checkpoint"),
        ("handoff", "handoff", "window"),
        ("rollover", "rollover", "window"),
    ],
)
def test_compact_now_acts_in_the_strategys_own_terms(tmp_path, profile, strategy, kind):
    session = kernel_for(profile, tmp_path).open_session()
    grow(session)
    assert kinds(session) == []  # nothing compacted by itself at this size
    outcome = session.compact_now(by="cli")
    assert outcome.committed and outcome.strategy == strategy, outcome
    assert kinds(session) == [(strategy, kind)]
    assert outcome.tokens_after is not None and outcome.tokens_before is not None
    assert outcome.tokens_after < outcome.tokens_before
    # the session goes on as before
    session.user("and now the tests")
    assert session.prepare_request().messages[-1].text.endswith("and now the tests")  # (decay anchors it)


def test_decay_manual_checkpoint_keeps_the_current_turn_and_is_not_a_decay_block(tmp_path):
    session = kernel_for("decay", tmp_path).open_session()
    grow(session)
    session.user("the open turn's own instruction")
    session.prepare_request()
    session.commit_reply(Message.assistant("working on it"))
    outcome = session.compact_now()
    assert outcome.committed, outcome
    texts = [n.message.text for n in session.surface.nodes]
    assert "the open turn's own instruction" in texts and "working on it" in texts
    panel = session.project()["strategies"]["decay"]
    assert not panel.get("blocks"), panel  # an ordinary checkpoint, not a decay block


def test_chapters_compact_continues_in_a_child_that_keeps_the_route_and_has_no_header_parent(tmp_path):
    kernel = kernel_for("chapters", tmp_path)
    session = kernel.open_session()
    grow(session)
    session.set_route("scripted", "scripted-small", context_window=12_000)
    outcome = session.compact_now()
    assert outcome.committed and outcome.strategy == "chapters", outcome
    child_id = outcome.continued_in
    assert child_id and kernel.store.exists(child_id)
    assert kernel.store.header(child_id).parent is None  # the registry alone records ancestry
    child = kernel.open_session(child_id)
    assert child.route is not None
    assert (child.route["model"], child.route["context_window"]) == ("scripted-small", 12_000)
    assert child.project()["strategies"]["chapters"]["parent"] == session.id  # from the registry


def test_chapters_archive_archives_in_place(tmp_path):
    session = kernel_for("chapters", tmp_path).open_session()
    grow(session)
    outcome = session.compact_now("archive")
    assert outcome.committed and outcome.strategy == "chapters" and outcome.continued_in is None, outcome
    assert kinds(session) == [("chapters", "chapters")]
