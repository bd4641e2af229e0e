"""The search for the protected instructions a compaction would take off the surface answers what
the plain search does (every kept text normalised and searched), while normalising and searching
only when an instruction's inner words all occur among the kept texts' words."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message
from ctxkernel import instructions as instructions_module
from ctxkernel.instructions import Instruction, _kept_texts, _missing_from_kept, _missing_in, normalized
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 60000, "reserved_output_tokens": 500}
#: few words, so kept texts and instructions share most of them; white space of several kinds
WORDS = st.sampled_from(["tabs", "use", "keep", "the", "parser", "strict", "ab", "a", "b", "tabsuse", "x."])
SPACES = st.sampled_from([" ", "  ", "\n", "\t", " \n "])


@st.composite
def texts(draw: Any, max_words: int = 8) -> str:
    words = draw(st.lists(WORDS, min_size=1, max_size=max_words))
    out = draw(st.sampled_from(["", " ", "\n"]))
    for word in words:
        out += word + draw(SPACES)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts(), min_size=1, max_size=8), st.lists(texts(4), min_size=1, max_size=8), st.data())
def test_the_search_for_lost_instructions_is_the_plain_search(tmp_path_factory, messages, wanted, data):
    kernel = build_kernel(tmp_path_factory.mktemp("search"), model=WINDOW)
    session = kernel.open_session()
    for text in messages:
        session.user(text)
        session.prepare_request()
        session.commit_reply(Message.assistant(data.draw(texts())))
        session.end_turn()
    seqs = [n.seq for n in session.surface.nodes]
    cited = set(data.draw(st.lists(st.sampled_from(seqs), max_size=len(seqs))))
    # an instruction is drawn anew, or cut out of a message (so a kept text may quote it mid-word)
    items = []
    for n, text in enumerate(wanted):
        source = normalized(data.draw(st.sampled_from([text, *messages])))
        a = data.draw(st.integers(0, len(source)))
        b = data.draw(st.integers(a, len(source)))
        items.append(Instruction(session.id, n, data.draw(st.sampled_from([text, source[a:b] or text]))))
    expected = _missing_in(items, _kept_texts(session, cited))
    assert _missing_from_kept(session, items, cited) == expected
    assert [i for i in items if i.normalized not in "\n".join(_kept_texts(session, cited))] == expected


def test_an_instruction_no_kept_text_can_hold_is_not_searched_for(tmp_path, monkeypatch):
    kernel = build_kernel(tmp_path, model=WINDOW)
    session = kernel.open_session()
    session.user("keep the parser strict and the tests fast")
    session.user("something else entirely, said later")
    first = session.surface.nodes[0].seq
    lost = Instruction(session.id, first, "keep the parser strict and the tests fast")
    quoted = Instruction(session.id, 99, "else entirely, said")
    normalised: list[str] = []
    real = instructions_module.normalized
    monkeypatch.setattr(instructions_module, "normalized", lambda t: normalised.append(t) or real(t))
    assert _missing_from_kept(session, [lost], {first}) == [lost]
    assert normalised == []  # no kept text was normalised: "parser" is in none of them
    assert _missing_from_kept(session, [lost, quoted], {first}) == [lost]
    assert normalised == ["something else entirely, said later"]  # searched, for the quoted one
