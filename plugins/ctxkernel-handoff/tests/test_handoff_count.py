"""A switch counts its handoff from the activity lines counted when their excerpts were rendered
(issue 21, item 2): exactly the meter's count of the whole message, tokenising only what no step
counted (the frame, the snapshot, the notes). Its extractive body is built in one pass over the
region's excerpts: the same text as the earlier implementation, kept here as the oracle.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxkernel_handoff
import ctxkernel_handoff.engine as engine
from ctxkernel import Message, Node, Source, Summary, ToolCallBlock
from ctxkernel.events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, TOOL_RESULT, USER_MESSAGE, Event
from ctxkernel.recall.history import History
from ctxkernel.testing import build_kernel
from ctxkernel.text import guard, keep_newest
from ctxkernel_handoff.engine import state_for, tokens_of_span
from ctxkernel_handoff.handoff import (
    _FILES,
    FRAMES,
    Excerpts,
    Handoff,
    _clip,
    assemble,
    extract,
    handoff_tokens,
    line_tokens,
)

#: characters that stress the pretokenizer at a line break: whitespace of every kind, letters,
#: digits, punctuation, the handoff's own tag characters, non-Latin scripts and emoji
LINE_ALPHABET = st.sampled_from(list(" \t\r\n\u00a0\u2028\u3000abcXYZ019.,;:!?'\"-_<>/()[]{}#*&é中文🙂ß\u0301"))
TEXTS = st.text(LINE_ALPHABET, max_size=60)


def _message_tokens(session: Any, text: str) -> int:
    """The meter's own count of the handoff message, tokenising the whole text (no memo)."""
    return session.meter.count_message(Handoff(text, text, Summary(text)).message())


@pytest.fixture(scope="module")
def counting_session(tmp_path_factory: Any) -> Any:
    """One session of the bundled profile (cl100k_base), for its meter and its history."""
    return build_kernel(tmp_path_factory.mktemp("count")).open_session()


# -- nodes of any text -------------------------------------------------------------------------------
def _node(seq: int, message: Message) -> Node:
    kind = {"user": USER_MESSAGE, "assistant": ASSISTANT_MESSAGE, "tool": TOOL_RESULT}[message.role]
    return Node(Event(seq, kind, {"message": message.to_dict()}, "", None), message)


def _previous_handoff(kind: str, lines: list[str]) -> Message:
    body = "\n".join(lines)
    text = (
        f'<window_handoff window="win_2">\nsnapshot\n\n<{kind}_handoff>\n{body}\n</{kind}_handoff>\n</window_handoff>'
    )
    return Message.user(text, Source.plugin_form("handoff", "handoff"))


#: more files than a body lists (:data:`ctxkernel_handoff.handoff.FILES_LISTED`)
MANY_PATHS = [f"src/m{n}.py" for n in range(30)]


@st.composite
def regions(draw: Any, max_nodes: int = 14) -> list[Node]:
    """A region of any messages: user text, replies with tool calls naming files, results,
    notices, and earlier handoffs (extractive ones merged line by line, generated ones carried)."""
    nodes: list[Node] = []
    for seq in range(10, 10 + draw(st.integers(1, max_nodes))):
        kind = draw(st.sampled_from(["user", "reply", "call", "result", "notice", "extractive", "generated"]))
        text = draw(TEXTS)
        if kind == "user":
            message = Message.user(text)
        elif kind == "reply":
            message = Message.assistant(text)
        elif kind == "call":
            paths = draw(
                st.lists(st.sampled_from(["src/a.py", "docs/x.md", text[:30] or "z", *MANY_PATHS]), max_size=3)
            )
            calls = [
                ToolCallBlock(f"c{seq}_{n}", "read", {"path": path}) for n, path in enumerate(paths or ["src/b.py"])
            ]
            message = Message.assistant(text, calls)
        elif kind == "result":
            message = Message.tool(f"c{seq}", text, name="read")
        elif kind == "notice":
            message = Message.user(text, Source.plugin_form("decay", "notice"))
        else:
            lines = [f"- item_{n} user: {draw(TEXTS)}" for n in range(draw(st.integers(0, 4)))]
            if draw(st.booleans()):
                listed = st.lists(st.sampled_from(["src/a.py", "q.txt", *MANY_PATHS[:4]]), max_size=3)
                lines.insert(0, _FILES + ", ".join(draw(listed)))
            message = _previous_handoff(kind, lines if kind == "extractive" else [text, *lines])
        nodes.append(_node(seq, message))
    return nodes


def _reference_body(history: Any, nodes: list[Node], budget: int, excerpts: Excerpts) -> str:
    """The extractive body as the fourth round built it (entries gathered, then ``keep_newest``):
    the oracle of :func:`extract`."""
    carried = ""
    entries: list[str] = []
    files: dict[str, None] = {}
    for node in nodes:
        part = excerpts.of(history, node)
        if part.carried is not None:
            carried = part.carried
        entries.extend(part.entries)
        if part.moves:
            for path in part.files:
                files.pop(path, None)
                files[path] = None
        else:
            files.update(dict.fromkeys(part.files))
    parts: list[str] = []
    if files:
        parts.append(guard(_FILES + ", ".join(_clip(f, 120) for f in list(files)[-20:]), *FRAMES))
    if carried:
        parts.append(_clip(carried, max(0, int((budget - sum(len(p) for p in parts)) * 0.3))))
    fixed = sum(len(p) + 2 for p in parts)
    head = "Activity so far, oldest first (read any item in full with history_read_item):"
    kept = keep_newest(entries, budget - fixed - len(head) - 80)
    lines = [head]
    if len(kept) < len(entries):
        lines.append(f"(… {len(entries) - len(kept)} earlier entries omitted: history_list_items lists them)")
    lines.extend(kept)
    parts.append("\n".join(lines))
    text = "\n\n".join(p for p in parts if p)
    return text if len(text) <= budget else _clip(text, budget)


@settings(max_examples=300, deadline=None)
@given(nodes=regions(), budget=st.integers(0, 1_500))
def test_the_one_pass_body_is_the_reference_body(counting_session, nodes, budget):
    history = History.for_session(counting_session)
    excerpts = Excerpts()
    assert extract(history, nodes, budget, excerpts).text == _reference_body(history, nodes, budget, excerpts)


# 80 examples: each is a long region of up to 60 nodes with up to 25 groups of calls, which takes
# every path of the newest-first walk (stopping at the twentieth file, merging an opener's list)
# many times; 200 only lengthened `make test`
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    nodes=regions(max_nodes=60),
    budget=st.integers(0, 8_000),
    opener=st.sampled_from(["none", "extractive", "generated"]),
    calls=st.lists(st.lists(st.sampled_from(MANY_PATHS), min_size=1, max_size=4), max_size=25),
)
def test_the_body_selected_from_the_newest_end_is_the_reference_body(counting_session, nodes, budget, opener, calls):
    """Long regions naming more files than a body lists (the newest-first walk stops at the
    twentieth), opened by an earlier handoff as a window is (its list merged from the oldest end)
    or holding one anywhere (folded from the oldest): the body is the reference body, and its
    lines and their counts are the reference's last lines."""
    if opener != "none":
        lines = ["- item_3 user: earlier", _FILES + "src/m1.py, q.txt, src/m29.py"]
        nodes = [_node(9, _previous_handoff(opener, lines)), *nodes]
    for n, paths in enumerate(calls, start=nodes[-1].seq + 1):  # a run of calls naming many files
        reply = Message.assistant("", [ToolCallBlock(f"m{n}_{i}", "edit", {"path": p}) for i, p in enumerate(paths)])
        nodes.append(_node(n, reply))
    history = History.for_session(counting_session)
    excerpts = Excerpts()
    for node in nodes:
        excerpts.of(history, node, counting_session.meter)
    body = extract(history, nodes, budget, excerpts)
    assert body.text == _reference_body(history, nodes, budget, excerpts)
    everything = [
        (e, n)
        for node in nodes
        for e, n in zip(excerpts.of(history, node).entries, excerpts.of(history, node).tokens, strict=True)
    ]
    if body.lines:
        assert list(zip(body.lines, body.counts, strict=True)) == everything[len(everything) - len(body.lines) :]


@settings(max_examples=300, deadline=None)
@given(nodes=regions(), warm=st.lists(st.booleans(), min_size=14, max_size=14), budget=st.integers(600, 6_000))
def test_a_handoff_counted_from_its_warm_lines_is_its_exact_count(counting_session, nodes, warm, budget):
    """Any region, its excerpts rendered at step ends (counted) or cold at the switch (not: a run
    of those lines is tokenised with its neighbours): the count from the pieces equals the meter's
    count of the whole message, and a piece of unknown count never borders another."""
    session = counting_session
    history = History.for_session(session)
    excerpts = Excerpts()
    for node, counted in zip(nodes, warm, strict=False):
        excerpts.of(history, node, session.meter if counted else None)
    handoff = assemble(
        history,
        nodes,
        [],
        budget=budget,
        mode="extractive",
        reason="manual",
        generated=None,
        excerpts=excerpts,
    )
    assert handoff_tokens(session, handoff) == _message_tokens(session, handoff.text)
    if handoff.pieces:
        assert "".join(handoff.pieces) == handoff.text
        for piece, tokens in zip(handoff.pieces, handoff.piece_counts, strict=True):
            assert tokens is None or tokens == session.meter.count_text(piece)
        unknown = [tokens is None for tokens in handoff.piece_counts]
        assert not any(a and b for a, b in zip(unknown, unknown[1:], strict=False))
        if all(warm[: len(nodes)]):  # every activity line was counted: one piece of them
            assert len(handoff.pieces) == 3 and handoff.piece_counts[1] is not None


@given(entry=TEXTS)
@settings(max_examples=200, deadline=None)
def test_a_line_is_counted_only_where_the_cut_before_it_is_exact(counting_session, entry):
    meter = counting_session.meter
    tokens = line_tokens(meter, entry)
    if tokens is None:
        assert not meter.joins_exactly("\n", entry)
    else:
        assert tokens == meter.count_text(entry + "\n")
        assert meter.count_text("x:\n" + entry + "\n") == meter.count_text("x:\n") + tokens


# -- a real switch ----------------------------------------------------------------------------------------
def _spy_counts(monkeypatch: Any) -> list[tuple[int, int, int, int]]:
    """Wrap the switch's count: (count from pieces, whole count, characters tokenised for it,
    characters of the text taken from the counts of warmed lines) per call."""
    seen: list[tuple[int, int, int, int]] = []
    original = engine.handoff_tokens

    def spy(session: Any, handoff: Handoff) -> int:
        tokenised: list[str] = []
        count_text = session.meter.count_text
        monkeypatch.setattr(session.meter, "count_text", lambda text: tokenised.append(text) or count_text(text))
        try:
            tokens = original(session, handoff)
        finally:
            monkeypatch.setattr(session.meter, "count_text", count_text)
        warmed = sum(len(p) for p, n in zip(handoff.pieces, handoff.piece_counts, strict=True) if n is not None)
        seen.append((tokens, _message_tokens(session, handoff.text), sum(map(len, tokenised)), warmed))
        return tokens

    monkeypatch.setattr(engine, "handoff_tokens", spy)
    return seen


INSTRUCTION = st.text(st.sampled_from(list("ab c\t\n.é中🙂<>-!")), min_size=1, max_size=60)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(instructions=st.lists(INSTRUCTION, min_size=3, max_size=6))
def test_a_switch_counts_its_handoff_exactly_and_tokenises_only_what_no_step_counted(
    handoff_kernel, agent, monkeypatch, tmp_path_factory, instructions
):
    """A real switch over turns of odd text: the count the fit uses is the whole message's count,
    the activity lines rendered at step ends are not tokenised again, and the commit records the
    count of what landed."""
    kernel = handoff_kernel(window=200_000, home=tmp_path_factory.mktemp("home"))
    session = kernel.open_session()
    a = agent(session)
    for text in instructions:
        a.turn(text)
    a.turn("continue")  # a step after the last reply: its lines are rendered too
    with monkeypatch.context() as patch:  # one example's patches end with it
        seen = _spy_counts(patch)
        outcome = ctxkernel_handoff.compact_now(session)
    assert outcome.committed, outcome.detail
    (tokens, whole, tokenised, warmed) = seen[0]
    assert tokens == whole
    assert warmed > 0
    handoff = session.surface.nodes[0]
    assert tokenised <= len(handoff.message.text) - warmed
    summary = next(e for e in reversed(session.events) if e.type == COMPACTION_SUMMARY)
    assert summary.data["spans"][0]["tokens_after"] == session.meter.count_message(handoff.message)


def test_the_kernel_checks_the_shrink_when_the_switch_could_not_prove_it(handoff_kernel, agent, monkeypatch):
    """The transaction's shrink check is skipped only when the switch's own exact count proved
    the handoff smaller than its region; otherwise the kernel counts and decides, as before."""
    kernel = handoff_kernel(window=200_000)
    session = kernel.open_session()
    a = agent(session)
    for t in range(4):
        a.turn(f"instruction {t}: keep the parser strict " + "detail " * 20)
    calls: list[dict[str, Any]] = []
    handle = type(engine.STRATEGY.on(session))
    compact = handle.compact
    monkeypatch.setattr(handle, "compact", lambda self, spans, **kw: calls.append(kw) or compact(self, spans, **kw))
    assert ctxkernel_handoff.compact_now(session).committed
    assert calls[-1]["check_shrink"] is False  # proven by the exact count from parts
    a.turn("instruction 9: and now the tests " + "detail " * 20)
    # the switch's count says no shrink (whatever the budget): the kernel's check runs
    monkeypatch.setattr(engine, "handoff_tokens", lambda session, handoff: 10**9)
    outcome = ctxkernel_handoff.compact_now(session)
    assert calls[-1]["check_shrink"] is True
    assert outcome.committed  # the kernel's own count finds the handoff smaller: it commits
    assert state_for(session).switches == 2


def test_the_counted_lines_follow_the_excerpts_held(handoff_kernel, agent):
    """Lines are counted as their excerpts are rendered at step ends, each count kept on its
    excerpt, and forgotten with it (a switch forgets the nodes it replaced), so the counts stay
    bounded by the surface."""
    kernel = handoff_kernel(window=200_000)
    session = kernel.open_session()
    a = agent(session)
    for t in range(5):
        a.turn(f"instruction {t}: keep the parser strict")
    excerpts = state_for(session).excerpts
    history = History.for_session(session)
    # the first user message came before the process's first step: rendered at the switch
    warmed = [e for node in session.surface.nodes[:-1] if None not in (e := excerpts.of(history, node)).tokens]
    assert sum(len(e.entries) for e in warmed) > 10
    for held in warmed:
        assert held.tokens == tuple(session.meter.count_text(entry + "\n") for entry in held.entries)
    assert ctxkernel_handoff.compact_now(session).committed
    assert len(excerpts) <= len(session.surface)
    a.turn("instruction 6: and the tests")
    assert len(excerpts) <= len(session.surface)


@pytest.mark.parametrize("keep_share", [None, 0.0, 0.3, 0.8])
def test_a_regions_tokens_are_its_nodes_tokens(handoff_kernel, agent, keep_share):
    """Counted over the fewer nodes (the surface's total less the others for a region holding
    most of it): the same as adding the region's own counts, and as the commit's tokens_before."""
    from ctxkernel import head_region, whole_surface_but_last

    kernel = handoff_kernel(window=200_000)
    session = kernel.open_session()
    a = agent(session)
    for t in range(6):
        a.turn(f"instruction {t}: " + "detail " * (5 + 10 * t))
    surface = session.surface
    if keep_share is None:
        region = whole_surface_but_last(surface, 1)
    else:  # a small share kept: the region holds most of the surface; a large one: the other way
        region = head_region(surface, session.meter, int(keep_share * session.meter.surface_tokens()), min_nodes=2)
    assert region is not None
    nodes = surface.span(*region)
    assert tokens_of_span(session, nodes) == sum(session.meter.node_tokens(n) for n in nodes)
    assert tokens_of_span(session, [surface.nodes[-1]]) == session.meter.node_tokens(surface.nodes[-1])
    outcome = ctxkernel_handoff.compact_now(session)
    summary = next(e for e in reversed(session.events) if e.type == COMPACTION_SUMMARY)
    assert outcome.record["window_record"]["region_tokens"] == summary.data["spans"][0]["tokens_before"]


def test_a_tool_calls_arguments_are_excerpted_as_json(counting_session):
    """(The oracle and the pass share the excerpt itself: one check that it is the one rendered.)"""
    call = ToolCallBlock("c1", "read", {"path": "src/a.py"})
    node = _node(3, Message.assistant("", [call]))
    (entry,) = Excerpts().of(History.for_session(counting_session), node).entries
    assert entry == f"- item_3 call read {orjson.dumps(call.arguments).decode()}"


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), INSTRUCTION),
        st.tuples(st.sampled_from(["reopen", "shrink", "switch"]), st.just("")),
    ),
    min_size=2,
    max_size=9,
)


# 25 examples: each is a whole session of up to 9 operations (steps, switches, a replaced result,
# a reopen from a snapshot) checked at every point; 25 sessions reach each operation and each
# keep_share several times, at about a second each
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, keep_share=st.sampled_from([None, 0.2, 0.6]), budget=st.integers(300, 6_000))
def test_the_material_kept_at_step_ends_gives_the_body_built_from_nothing(
    handoff_kernel, agent, tmp_path_factory, ops, keep_share, budget
):
    """The body's material is kept as steps end, through switches, a kept result replaced in
    place and a reopened session (a new process, from its snapshot): at every point, the body of
    a region (the whole surface but its last message, or a head keeping a share) is the body built
    from nothing, its lines are the region's last lines, and each line's count is its count."""
    from ctxkernel import head_region, whole_surface_but_last

    home = tmp_path_factory.mktemp("material")
    kernel = handoff_kernel(window=200_000, home=home)
    session = kernel.open_session()
    a = agent(session)
    a.turn("start: read the files")
    for op, text in ops:
        if op == "turn":
            a.turn(text)
        elif op == "reopen":
            session = handoff_kernel(window=200_000, home=home).open_session(session.id)
            a = type(a)(session, a.model, a.tool_output)  # the same model: its call ids go on
        elif op == "shrink":
            results = [n for n in session.surface.nodes if n.role == "tool"]
            if results:
                engine.STRATEGY.on(session).replace_tool_result(results[0].seq, "shrunk", reason="fit")
        else:
            ctxkernel_handoff.compact_now(session)
        surface = session.surface
        if keep_share is None:
            region = whole_surface_but_last(surface, 1)
        else:
            region = head_region(surface, session.meter, int(keep_share * session.meter.surface_tokens()), min_nodes=2)
        if region is None:
            continue
        nodes = surface.span(*region)
        history = History.for_session(session)
        held = state_for(session).excerpts
        body = extract(history, nodes, budget, held)
        assert body.text == _reference_body(history, nodes, budget, Excerpts())
        assert held.material.seqs[: len(nodes)] == [n.seq for n in nodes]
        everything = [e for node in nodes for e in held.of(history, node).entries]
        assert body.lines == everything[len(everything) - len(body.lines) :]
        for line, tokens in zip(body.lines, body.counts, strict=True):
            assert tokens is None or tokens == session.meter.count_text(line + "\n")
