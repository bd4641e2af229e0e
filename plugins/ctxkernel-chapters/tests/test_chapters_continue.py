"""chapters_continue and chapters_fork: range rules, budget preflight, the child session, lineage."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers_chapters import (
    archive_file,
    archive_files,
    call_tool,
    chapters_kernel,
    continue_all,
    do_turn,
    log_bytes,
    registry,
    result_json,
    run_turns,
)

from ctxkernel import Message, ScriptedModel, ToolCallBlock
from ctxkernel_chapters import manifest


def _turn_ends(session) -> list[int]:
    return [e.seq for e in session.events if e.type == "turn/end"]


def _ranges(*pairs):
    return [{"start_seq": a, "end_seq": b, "title": f"part {a}"} for a, b in pairs]


@pytest.fixture
def parent(tmp_path):
    kernel = chapters_kernel(tmp_path)
    session = kernel.open_session()
    run_turns(session, 4)
    return session


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ("gap", "gap: events"),
        ("overlap", "overlaps chapter 0"),
        ("past", "past the archive ceiling"),
        ("short", "gap: events"),
        ("late_start", "gap: events 0.."),
        ("backwards", "ends (seq"),
    ],
)
def test_bad_ranges_are_refused_and_nothing_is_written(parent, tmp_path, shape, reason):
    ends = _turn_ends(parent)
    ceiling = ends[-1]
    mid = ends[1]
    ranges = {
        "gap": _ranges((0, mid), (mid + 2, ceiling)),
        "overlap": _ranges((0, mid), (mid, ceiling)),
        "past": _ranges((0, mid), (mid + 1, ceiling + 1)),
        "short": _ranges((0, mid)),
        "late_start": _ranges((1, ceiling)),
        "backwards": _ranges((0, mid), (ceiling, mid + 1)),
    }[shape]
    before_log = log_bytes(parent)
    before_kv = registry(parent).get(parent.id)
    sessions = parent.kernel.sessions()
    outcome = call_tool(parent, "chapters_continue", title="next", handoff_note="carry on", chapters=ranges)
    assert outcome.is_error
    assert reason in outcome.content and "Nothing was written" in outcome.content
    assert log_bytes(parent) == before_log
    assert archive_files(tmp_path) == []
    assert registry(parent).get(parent.id) == before_kv
    assert parent.kernel.sessions() == sessions


def test_over_budget_is_refused_with_the_numbers(parent, tmp_path):
    ceiling = _turn_ends(parent)[-1]
    before = log_bytes(parent)
    note = "decision: keep the parser streaming. " * 2000
    outcome = call_tool(parent, "chapters_continue", title="next", handoff_note=note, chapters=_ranges((0, ceiling)))
    assert outcome.is_error
    assert "over the budget of" in outcome.content and "continuation_budget_ratio 0.25" in outcome.content
    assert "effective window 19000" in outcome.content and "system prompt and tools" in outcome.content
    assert log_bytes(parent) == before and archive_files(tmp_path) == []


def test_continue_writes_chapters_and_a_child_with_one_seed_event(parent, tmp_path):
    ends = _turn_ends(parent)
    before = log_bytes(parent)
    outcome = call_tool(
        parent,
        "chapters_continue",
        title="Parser work, part 2",
        handoff_note="Next: wire the lexer into main().",
        chapters=_ranges((0, ends[1]), (ends[1] + 1, ends[-1])),
    )
    data = result_json(outcome)
    assert outcome.conclude_turn and outcome.continue_in == data["session"]
    assert log_bytes(parent) == before  # the parent is untouched (the harness writes the tool result)
    assert len(data["chapters"]) == 2
    child = parent.kernel.open_session(data["session"])
    # the seed, then the parent's route (seed 003: the model selection goes with the work)
    assert [e.type for e in child.events] == ["user/message", "request/context"]
    assert child.route == parent.route and child.route is not None
    assert child.header.parent is None  # the registry is the sole authority on ancestry
    seed = child.events[0]
    assert seed.seq == 0 and seed.type == "user/message" and seed.surface == {"op": "append"}
    message = Message.from_dict(seed.data["message"])
    assert message.source.plugin == "chapters" and message.source.form == "snapshot"
    assert "Next: wire the lexer into main()." in message.text
    for chapter in data["chapters"]:
        assert chapter["path"] in message.text
    assert child.header.parent is None and child.header.profile == parent.header.profile
    assert registry(parent).get(child.id)["parent"] == parent.id
    # the same tools, and the recall tools from the start: the child opens from a table of
    # contents of chapters it can only read with them (the parent still shows all they hold,
    # and its header stays as every process composes it from its log)
    recall = ["chapters_read", "chapters_search", "chapters_artifact"]
    assert all(name in child.request_header().system for name in recall)
    parent.owns_tool("")  # brings the parent's registry up to date
    assert child.tools.names() == parent.tools.names() + recall
    state = registry(parent).get(child.id)
    assert state["parent"] == parent.id and state["root"] == parent.id
    assert [c["session"] for c in registry(parent).get(parent.id)["children"]] == [child.id]
    assert len(archive_files(tmp_path)) >= 2


def test_the_child_survives_a_process_restart_and_reads_every_ancestor_chapter(parent, tmp_path):
    ends = _turn_ends(parent)
    first = result_json(
        call_tool(parent, "chapters_continue", title="two", handoff_note="go on", chapters=_ranges((0, ends[-1])))
    )
    child = parent.kernel.open_session(first["session"])
    run_turns(child, 3, start=10)
    child_ends = _turn_ends(child)
    second = result_json(
        call_tool(
            child, "chapters_continue", title="three", handoff_note="still going", chapters=_ranges((0, child_ends[-1]))
        )
    )
    grandchild_id = second["session"]
    expected = [c["id"] for c in first["chapters"]] + [c["id"] for c in second["chapters"]]
    script = f"""
import json, sys
sys.path.insert(0, {str(tmp_path.parent)!r})
from pathlib import Path
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
from helpers_chapters import chapters_kernel, call_tool
kernel = chapters_kernel(Path({str(tmp_path)!r}))
session = kernel.open_session({grandchild_id!r})
out = {{"events": [e.type for e in session.events], "reads": {{}}}}
for cid in {expected!r}:
    outcome = call_tool(session, "chapters_read", chapter=cid)
    out["reads"][cid] = [outcome.is_error, outcome.content[:400]]
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["events"] == ["user/message", "request/context"]
    assert set(out["reads"]) == set(expected)
    for is_error, text in out["reads"].values():
        assert not is_error, text
        assert "sha256 verified" in text
    # the grandchild's table of contents lists every ancestor chapter
    seed = parent.kernel.open_session(grandchild_id).surface.nodes[0].message.text
    for record in registry(parent).lineage_records(grandchild_id):
        assert record["path"] in seed
    chain = manifest(registry(parent).kv, grandchild_id)["chain"]
    assert [c["session"] for c in chain] == [parent.id, child.id, grandchild_id]


def test_tampered_chapter_is_refused_on_read_and_search(parent):
    ends = _turn_ends(parent)
    data = result_json(
        call_tool(parent, "chapters_continue", title="t", handoff_note="n", chapters=_ranges((0, ends[-1])))
    )
    child = parent.kernel.open_session(data["session"])
    record = registry(parent).lineage_records(child.id)[0]
    path = archive_file(child, record["path"])
    assert not call_tool(child, "chapters_read", chapter=record["id"]).is_error
    path.write_text(path.read_text().replace("task 0", "task 9"))
    outcome = call_tool(child, "chapters_read", chapter=record["id"])
    assert outcome.is_error and "refused" in outcome.content and "sha256" in outcome.content
    found = call_tool(child, "chapters_search", query="task")
    assert "refused (integrity check failed" in found.content and record["id"] in found.content
    assert "task 9" not in found.content


def test_read_is_paged_and_contained(parent):
    ends = _turn_ends(parent)
    data = result_json(
        call_tool(parent, "chapters_continue", title="t", handoff_note="n", chapters=_ranges((0, ends[-1])))
    )
    child = parent.kernel.open_session(data["session"])
    cid = data["chapters"][0]["id"]
    page = call_tool(child, "chapters_read", chapter=cid, offset=0, limit=10)
    assert "next page: offset=10" in page.content
    nxt = call_tool(child, "chapters_read", chapter=cid, offset=10, limit=10)
    assert "11:" not in nxt.content.splitlines()[0]
    for bad in ["../../sessions/x.jsonl", "/etc/passwd", "nope/1"]:
        outcome = call_tool(child, "chapters_read", chapter=bad)
        assert outcome.is_error and "no chapter" in outcome.content
    hits = call_tool(child, "chapters_search", query="task 2")
    assert "match(es)" in hits.content and cid in hits.content


def test_ranges_must_be_empty_before_the_first_turn_ends(tmp_path):
    kernel = chapters_kernel(tmp_path)
    session = kernel.open_session()
    session.user("start")
    outcome = call_tool(session, "chapters_continue", title="t", handoff_note="n", chapters=_ranges((0, 1)))
    assert outcome.is_error and "no completed turn" in outcome.content
    data = result_json(
        call_tool(session, "chapters_continue", title="t", handoff_note="everything so far: start", chapters=[])
    )
    # the turn in progress is the parent's last chapter: nothing of it is lost to the child
    [chapter] = data["chapters"]
    assert chapter["in_progress"] and chapter["seqs"] == [0, len(session.events) - 1]
    child = kernel.open_session(data["session"])
    assert chapter["path"] in child.surface.nodes[0].message.text
    assert "**User** #1: start" in call_tool(child, "chapters_read", chapter=chapter["id"]).content
    assert [e.type for e in child.events] == ["user/message"]  # no request yet: no route to carry


def test_fork_keeps_the_parent_going_and_registers_a_sibling(parent):
    before = log_bytes(parent)
    outcome = call_tool(parent, "chapters_fork", title="try the other approach")
    data = result_json(outcome)
    assert not outcome.conclude_turn and outcome.continue_in is None
    assert log_bytes(parent) == before
    fork = parent.kernel.open_session(data["session"])
    assert [e.type for e in fork.events] == ["user/message", "request/context"]
    assert registry(parent).get(fork.id)["origin"] == "fork"
    # a second fork archives nothing new: the first one's chapters are listed again
    again = result_json(call_tool(parent, "chapters_fork", title="third way"))
    assert again["chapters"] == []
    seed = parent.kernel.open_session(again["session"]).surface.nodes[0].message.text
    for chapter in data["chapters"]:
        assert chapter["path"] in seed


def test_a_fork_reads_none_of_what_its_parent_archives_after_the_fork(tmp_path):
    """The fork is a branch: the chapters its parent writes afterwards hold the other branch's
    turns. Its lineage read them all (chapters_read by id or number, chapters_search)."""
    kernel = chapters_kernel(tmp_path)
    parent = kernel.open_session()
    model = run_turns(parent, 4)
    forked = result_json(call_tool(parent, "chapters_fork", title="the other way"))
    run_turns(parent, 4, start=10, model=model)  # the parent goes on after the fork
    floor = registry(parent).archived_through(parent.id) + 1
    later = result_json(
        call_tool(
            parent,
            "chapters_continue",
            title="later",
            handoff_note="n",
            chapters=[{"start_seq": floor, "end_seq": _turn_ends(parent)[-1], "title": "after the fork"}],
        )
    )
    fork = kernel.open_session(forked["session"])
    before = log_bytes(fork)
    for chapter in later["chapters"]:
        for ref in (chapter["id"], chapter["path"], chapter["id"].rsplit("/", 1)[1]):
            outcome = call_tool(fork, "chapters_read", chapter=ref)
            assert outcome.is_error and "no chapter" in outcome.content, outcome.content[:200]
    found = call_tool(fork, "chapters_search", query="task 12")
    assert found.content.startswith("0 match(es)"), found.content[:300]
    assert [r["id"] for r in registry(parent).lineage_records(fork.id)] == [c["id"] for c in forked["chapters"]]
    # what the fork's table of contents cites stays readable; the parent's lineage keeps its own
    for chapter in forked["chapters"]:
        assert not call_tool(fork, "chapters_read", chapter=chapter["id"]).is_error
    assert [r["id"] for r in registry(parent).lineage_records(later["session"])] == [
        c["id"] for c in forked["chapters"] + later["chapters"]
    ]
    assert log_bytes(fork) == before


def test_the_model_can_continue_inside_a_turn(tmp_path):
    """The call comes from the model mid-turn: the turn in progress goes to the handoff note."""
    kernel = chapters_kernel(tmp_path)
    session = kernel.open_session()
    run_turns(session, 2)
    ceiling = _turn_ends(session)[-1]
    args = {"title": "t", "handoff_note": "was fixing the lexer", "chapters": _ranges((0, ceiling))}
    model = ScriptedModel([Message.assistant("continuing", [ToolCallBlock("k1", "chapters_continue", args)])])
    session.user("continue please")
    request = session.prepare_request()
    reply = model.complete(request.messages, system=request.system, tools=request.tools)
    session.commit_reply(reply.message, usage=reply.usage)
    outcome = session.run_tool(session.pending_calls[0])
    session.tool_result("k1", outcome)
    assert session.conclude_turn and not session.wants_another_step
    session.end_turn()
    child = kernel.open_session(outcome.continue_in)
    child.user("go on")
    request = child.prepare_request()
    assert request.messages[0].source.form == "snapshot"
    assert "was fixing the lexer" in request.messages[0].text


def test_a_second_continue_in_the_same_reply_is_refused(tmp_path):
    """Two chapters_continue calls in one reply made two children, each answered with continue_in:
    the harness followed the last, and the first, with its handoff note, was left behind."""
    kernel = chapters_kernel(tmp_path)
    session = kernel.open_session()
    run_turns(session, 2)
    ceiling = _turn_ends(session)[-1]
    first = {"title": "t", "handoff_note": "was fixing the lexer", "chapters": _ranges((0, ceiling))}
    second = {"title": "t2", "handoff_note": "something else", "chapters": []}
    calls = [ToolCallBlock("k1", "chapters_continue", first), ToolCallBlock("k2", "chapters_continue", second)]
    session.user("continue please")
    session.prepare_request()
    session.commit_reply(Message.assistant("continuing", calls))
    outcome = session.run_tool(session.pending_calls[0])
    session.tool_result("k1", outcome)
    children = registry(session).get(session.id)["children"]
    before = log_bytes(session)
    again = session.run_tool(session.pending_calls[0])
    assert again.is_error and again.continue_in is None
    assert outcome.continue_in in again.content and "Nothing was written" in again.content
    assert log_bytes(session) == before and registry(session).get(session.id)["children"] == children
    session.tool_result("k2", again)
    session.end_turn()
    # the next turn of this session may continue again (a harness that did not follow the child)
    session.user("continue now")
    session.prepare_request()
    rest = _ranges((registry(session).archived_through(session.id) + 1, _turn_ends(session)[-1]))
    session.commit_reply(
        Message.assistant("", [ToolCallBlock("k3", "chapters_continue", {**second, "chapters": rest})])
    )
    assert not session.run_tool(session.pending_calls[0]).is_error


def test_a_tampered_ancestor_chapter_is_reported_not_cited(parent):
    ends = _turn_ends(parent)
    first = result_json(
        call_tool(
            parent,
            "chapters_continue",
            title="t",
            handoff_note="n",
            chapters=_ranges((0, ends[1]), (ends[1] + 1, ends[-1])),
        )
    )
    child = parent.kernel.open_session(first["session"])
    bad = registry(parent).lineage_records(child.id)[0]
    path = archive_file(child, bad["path"])
    path.write_text(path.read_text() + "\nappended later")
    run_turns(child, 2, start=20)
    ceiling = _turn_ends(child)[-1]
    second = result_json(
        call_tool(child, "chapters_continue", title="t2", handoff_note="n2", chapters=_ranges((0, ceiling)))
    )
    seed = parent.kernel.open_session(second["session"]).events[0].data["message"]["content"][0]["text"]
    assert "Not cited (integrity check failed)" in seed and bad["id"] in seed
    good = registry(parent).lineage_records(child.id)[1]
    assert f"[chapters/{good['path']}]" in seed
    # its bullet from the child's own table of contents is withdrawn too
    assert f"[chapters/{bad['path']}]" not in seed


def test_the_handoff_note_is_never_truncated(parent):
    ends = _turn_ends(parent)
    note = "\n\n".join(f"Point {i}: the lexer keeps state {i} across calls; see commit {i:04x}." for i in range(40))
    data = result_json(
        call_tool(parent, "chapters_continue", title="t", handoff_note=note, chapters=_ranges((0, ends[-1])))
    )
    seed = parent.kernel.open_session(data["session"]).events[0].data["message"]["content"][0]["text"]
    assert note in seed


def test_the_steward_does_not_try_a_continuation_that_would_be_refused(tmp_path):
    from ctxkernel_chapters import plugin as chapters_plugin

    kernel = chapters_kernel(tmp_path, window=6_000, continuation_budget_ratio=0.01, pressure_suggestion_ratio=0.3)
    session = kernel.open_session()
    model = None
    for t in range(40):
        model = run_turns(session, 1, start=t, model=model)
        if chapters_plugin.state(session.context)["suggested"]:
            break
    session.user("next")
    request = session.prepare_request()
    assert chapters_plugin.state(session.context)["suggested"] and request.pressure.ratio >= 0.3
    before = log_bytes(session)
    assert session.kernel.hooks.steward_actions(session, request) == []
    assert log_bytes(session) == before
    assert not [f for f in archive_files(tmp_path) if "/chapters/" in f]  # the dry run wrote no chapter


def test_the_model_can_defer_a_result_below_the_size_floor_and_keep_one_above_it(tmp_path):
    """Seed 003's keep/defer decision goes both ways: ``defer`` moves a small result to an
    artifact, ``keep_inline`` keeps a large one in the chapter; one seq cannot be in both."""
    kernel = chapters_kernel(tmp_path, tool_result_defer_floor_tokens=200)
    session = kernel.open_session()
    run_turns(session, 2, lines=3)  # every result is far below the 200-token floor
    small = [e.seq for e in session.events if e.type == "tool/result"]
    end = _turn_ends(session)[-1]
    refused = call_tool(
        session,
        "chapters_continue",
        title="t",
        handoff_note="n",
        chapters=[{"start_seq": 0, "end_seq": end, "title": "all", "keep_inline": small[:1], "defer": small[:1]}],
    )
    assert refused.is_error and "both in keep_inline and defer" in refused.content
    data = result_json(
        call_tool(
            session,
            "chapters_continue",
            title="t",
            handoff_note="n",
            chapters=[{"start_seq": 0, "end_seq": end, "title": "all", "defer": small[:1]}],
        )
    )
    text = archive_file(session, data["chapters"][0]["path"]).read_text()
    assert f"**Result** #{small[0]} (" in text
    deferred, kept = (next(line for line in text.splitlines() if f"#{seq} (" in line) for seq in small[:2])
    assert "[artifact `" in deferred and "[artifact" not in kept
    assert text.count("[artifact `") == 1  # the other small results stay inline, as the floor says


def test_the_turn_in_progress_is_the_parents_last_chapter_and_no_call_loses_its_results(tmp_path):
    """A continuation mid-turn archives the turn's completed steps after the model's ranges as an
    in-progress chapter the child's table of contents lists; the step in flight (the message
    calling chapters_continue, with a sibling call still waiting) is not in it, so no call in any
    chapter is split from its results. Before, those steps were in no chapter the child could read."""
    kernel = chapters_kernel(tmp_path)
    session = kernel.open_session()
    run_turns(session, 2)
    ceiling = _turn_ends(session)[-1]
    session.user("fix the lexer now")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading it", [ToolCallBlock("r1", "read", {"path": "lexer.py"})]))
    session.tool_result("r1", "def lex(text): ...  # the lexer under repair")
    session.prepare_request()
    args = {"title": "t", "handoff_note": "lexer half fixed", "chapters": _ranges((0, ceiling))}
    in_flight = session.commit_reply(
        Message.assistant(
            "", [ToolCallBlock("k1", "chapters_continue", args), ToolCallBlock("r2", "read", {"path": "x.py"})]
        )
    )
    assert in_flight.tool_calls
    flight_seq = max(e.seq for e in session.events if e.type == "assistant/message")
    outcome = session.run_tool(session.pending_calls[0])
    data = result_json(outcome)
    tail = data["chapters"][-1]
    assert tail["in_progress"] and tail["seqs"] == [ceiling + 1, flight_seq - 1]
    assert not any(c.get("in_progress") for c in data["chapters"][:-1])
    child = kernel.open_session(outcome.continue_in)
    toc_text = child.surface.nodes[0].message.text
    # listed; its request is the handoff note's to quote (seed 003), read back in full from the chapter
    assert tail["path"] in toc_text and "lexer half fixed" in toc_text
    body = call_tool(child, "chapters_read", chapter=tail["id"], limit=5000).content
    assert "fix the lexer now" in body and "the lexer under repair" in body and "reading it" in body
    assert "chapters_continue" not in body  # the step in flight stays out (its results are not in)
    # the pairing rule, on every chapter of the parent: each call's result is in the same chapter
    for chapter in data["chapters"]:
        start, end = chapter["seqs"]
        calls, results = set(), set()
        for event in session.events[start : end + 1]:
            message = event.data.get("message") or {}
            for block in message.get("content", []):
                if block.get("type") == "tool_call":
                    calls.add(block["id"])
                elif block.get("type") == "tool_result":
                    results.add(block["call_id"])
        assert calls == results, chapter


def test_a_fork_by_another_process_leaves_the_parents_header_as_its_log_composes_it(tmp_path):
    """Process B forks a session process A holds open: A's next request carries the tools a
    reopened session composes from the log (a parent's header does not depend on the registry)."""
    a = chapters_kernel(tmp_path).open_session()
    run_turns(a, 3)
    a.request_header()
    b = chapters_kernel(tmp_path).open_session(a.id)
    b.user("fork it")
    b.prepare_request()
    b.commit_reply(Message.assistant("", [ToolCallBlock("f1", "chapters_fork", {"title": "x"})]))
    b.tool_result("f1", b.run_tool(b.pending_calls[0]))
    b.prepare_request()
    b.commit_reply(Message.assistant("forked"))
    b.end_turn()
    a.refresh()
    a.user("go on")
    live = a.prepare_request()
    reopened = chapters_kernel(tmp_path).open_session(a.id).request_header()
    assert [t["function"]["name"] for t in live.tools] == [t["function"]["name"] for t in reopened.tools]
    assert live.system == reopened.system


def test_the_continuation_budget_leaves_room_for_the_childs_header(tmp_path):
    """The child's header carries the recall tools from its first request, which the parent's may
    not yet: the table of contents' budget is what the child's window leaves."""
    parent = chapters_kernel(tmp_path).open_session()
    run_turns(parent, 3)
    data = continue_all(parent)
    child = parent.kernel.open_session(data["session"])
    ratio = parent.kernel.strategy_settings("chapters").continuation_budget_ratio
    effective = parent.context.model.effective_window
    assert abs(data["budget"] - int(ratio * (effective - child.request_header().tokens))) <= 5, data["budget"]


def test_a_long_line_of_a_chapter_is_read_in_pieces_and_found_across_a_cut(tmp_path):
    """A chapter line holds a whole message: a pasted log of 42,000 characters came back whole in
    one page. A line over 2,000 characters is read in pieces, cut at a space (the line break stands
    for it), a page stops at 20,000 characters, and a search finds words across a cut, naming the
    piece where they start."""
    pasted = " ".join(f"w{i:05d}" for i in range(6_000))
    session = chapters_kernel(tmp_path, window=64_000).open_session()
    do_turn(session, ScriptedModel([Message.assistant("noted")]), pasted)
    data = continue_all(session)
    child = session.kernel.open_session(data["session"])
    cid = data["chapters"][0]["id"]
    lines, offset = [], 0
    while True:
        page = call_tool(child, "chapters_read", chapter=cid, offset=offset, limit=5000).content
        assert len(page) < 21_000
        head, *body, tail = page.splitlines()
        lines += body
        if "next page: offset=" not in tail:
            break
        offset = int(tail.rsplit("offset=", 1)[1].rstrip(")"))
    start = next(i for i, line in enumerate(lines) if line.startswith("**User** #"))
    pieces = [line for line in lines[start:] if line.startswith("w") or line.startswith("**User**")]
    assert len(pieces) > 20 and max(map(len, pieces)) <= 2_000
    assert " ".join(pieces).split(": ", 1)[1] == pasted  # nothing lost or doubled at the cuts
    last_word, next_word = pieces[0].rsplit(" ", 1)[1], pieces[1].split(" ", 1)[0]
    hits = call_tool(child, "chapters_search", query=f"{last_word} {next_word}").content
    assert hits.startswith("1 match(es)"), hits
    line = int(hits.splitlines()[1].split(" line ", 1)[1].split(":", 1)[0])
    read = call_tool(child, "chapters_read", chapter=cid, offset=line, limit=1).content
    assert read.splitlines()[1].endswith(last_word)
