"""The commit's surface check does not parse back the checkpoint the kernel rendered itself
(``checkpoint_message``, the default ``render``): it takes the message it built. Property tests
against the slow path: the message parsed from its own dict is the same message, and a session
whose compactions took the fast path holds the surface a replay of its log gives (a summary with
a lone surrogate is cleaned by ``storable`` and so parsed back, as before). A plugin's ``render``
or span ``message`` is always parsed back (hostile input)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Source, Span, balanced_cut_at_or_before
from ctxkernel.compaction import checkpoint_message
from ctxkernel.surface import replay
from ctxkernel.testing import build_kernel

summaries = st.text(min_size=1, max_size=60)
names = st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True)


@given(summaries, names)
def test_a_checkpoint_parsed_from_its_dict_is_itself(text, strategy):
    message = checkpoint_message(text, strategy)
    assert Message.from_dict(message.to_dict()) == message


def surface_of(session) -> list[tuple[int, Message]]:
    return [(n.seq, n.message) for n in session.surface]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 4), summaries, st.booleans()), min_size=1, max_size=4))
def test_a_session_compacted_on_the_fast_path_replays_to_the_same_surface(rounds):
    with tempfile.TemporaryDirectory() as home:
        kernel = build_kernel(Path(home), fsync=False)
        session = kernel.open_session()
        compacted: list[str] = []
        for turns, summary, first in rounds:
            for n in range(turns):
                session.user(f"turn {n}: {summary}")
                session.prepare_request()
                session.commit_reply(Message.assistant(f"reply {n} " + "word " * 80))
                session.end_turn()
            nodes = session.surface.nodes
            cut = balanced_cut_at_or_before(session.surface, len(nodes) - 1)
            if cut < 2:
                continue
            session.compact(
                Span(nodes[0].seq, nodes[cut - 1].seq, summary=summary), strategy="basic", summarize_first=first
            )
            compacted.append(summary)
        assert compacted or rounds[0][0] == 1  # a compaction ran whenever two turns were there
        assert surface_of(session) == [(n.seq, n.message) for n in replay(session.events)]
        reopened = build_kernel(Path(home), fsync=False).open_session(session.id)
        assert surface_of(reopened) == surface_of(session)


def test_a_plugins_render_is_still_parsed_back(tmp_path, monkeypatch):
    kernel = build_kernel(tmp_path, fsync=False)
    session = kernel.open_session()
    for n in range(3):
        session.user(f"question {n}")
        session.prepare_request()
        session.commit_reply(Message.assistant("an answer " * 20))
        session.end_turn()
    parsed: list[dict] = []
    original = Message.from_dict.__func__

    def counting(cls, data):
        parsed.append(data)
        return original(cls, data)

    monkeypatch.setattr(Message, "from_dict", classmethod(counting))
    nodes = session.surface.nodes
    own = Message.user("their own render", Source.plugin_form("basic", "checkpoint"))
    session.compact(Span(nodes[0].seq, nodes[1].seq, summary="s"), strategy="basic", render=lambda s, r: own)
    assert any(d["content"][0]["text"] == "their own render" for d in parsed)  # parsed back by the check
    parsed.clear()
    nodes = session.surface.nodes
    assert nodes[2].role == "assistant"
    session.compact(Span(nodes[2].seq, nodes[2].seq, summary="kernel's"), strategy="basic")
    assert checkpoint_message("kernel's", "basic") == session.surface.nodes[2].message
    assert not any("kernel's" in d["content"][0]["text"] for d in parsed)  # the kernel's own: not parsed
