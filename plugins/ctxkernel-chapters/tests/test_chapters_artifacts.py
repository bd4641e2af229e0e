"""Artifacts: large results leave the context before the next request; reads stay in the store."""

from __future__ import annotations

import re

import pytest
from helpers_chapters import archive_file, call_tool, chapters_kernel, do_turn, log_bytes, result_json

from ctxkernel import Message, ScriptedModel, ToolCallBlock

BIG = "\n".join(f"line {i}: value = {i * 7} # measurement" for i in range(3000))


def _one_big_result(tmp_path, **settings):
    # ~37,900 tokens in a 47,000-token effective window: over pressure_suggestion_ratio, so moved
    kernel = chapters_kernel(tmp_path, window=48_000, **settings)
    session = kernel.open_session()
    model = ScriptedModel(
        [Message.assistant("run it", [ToolCallBlock("c1", "bash", {"command": "dump"})]), Message.assistant("seen")]
    )
    do_turn(session, model, "dump the table", tool_output=lambda call: BIG)
    return session, model


def test_a_large_result_becomes_a_handle_before_the_next_request(tmp_path):
    session, model = _one_big_result(tmp_path)
    # the second request (after the result) already carried the handle, not the result
    second = model.calls[1]["messages"]
    shown = second[-1].tool_result.content
    assert shown.startswith("[artifact ") and "chapters_artifact" in shown and len(shown) < 1200
    # and the tool it names: the move is the first thing hidden, which brings the recall tools
    assert [t["function"]["name"] for t in model.calls[0]["tools"]] == ["chapters_continue", "chapters_fork"]
    assert "chapters_artifact" in [t["function"]["name"] for t in model.calls[1]["tools"]]
    prune = [e for e in session.events if e.type == "compaction/prune"]
    assert len(prune) == 1 and prune[0].data["strategy"] == "chapters" and prune[0].data["reason"] == "artifact"
    original = next(e for e in session.events if e.type == "tool/result" and e.surface == {"op": "append"})
    assert original.data["message"]["content"][0]["content"] == BIG  # the log keeps the original


def test_small_results_stay_inline(tmp_path):
    kernel = chapters_kernel(tmp_path, window=60_000)
    session = kernel.open_session()
    model = ScriptedModel(
        [Message.assistant("run", [ToolCallBlock("c1", "bash", {"command": "ls"})]), Message.assistant("ok")]
    )
    do_turn(session, model, "list", tool_output=lambda call: "a.py\nb.py")
    assert not any(e.type == "compaction/prune" for e in session.events)


def test_a_result_of_few_characters_but_many_tokens_becomes_a_handle(tmp_path):
    """The band is in tokens: a result under the threshold in characters but over it in tokens
    (a rare CJK or Cyrillic letter is several tokens) is moved too (it was judged by characters)."""
    from ctxkernel_chapters.strategy import settings_of

    kernel = chapters_kernel(tmp_path, window=48_000, pressure_suggestion_ratio=0.1)
    session = kernel.open_session()
    threshold = settings_of(session.context).artifact_threshold(session.model_settings().effective_window)
    dense = "\n".join(f"{i} " + "ꙮ" * 60 for i in range(threshold // 70))
    assert len(dense) <= threshold < session.meter.count_text(dense)
    model = ScriptedModel(
        [Message.assistant("run", [ToolCallBlock("c1", "bash", {"command": "dump"})]), Message.assistant("seen")]
    )
    do_turn(session, model, "dump the glyphs", tool_output=lambda call: dense)
    shown = model.calls[1]["messages"][-1].tool_result.content
    assert shown.startswith("[artifact ") and len(shown) < 1200
    assert [e.data["reason"] for e in session.events if e.type == "compaction/prune"] == ["artifact"]


def _handle(session) -> str:
    text = session.surface.nodes[[n.role for n in session.surface.nodes].index("tool")].message.tool_result.content
    return text.split("[artifact ", 1)[1].split(":", 1)[0]


def test_artifact_tool_reads_toc_search_and_pages(tmp_path):
    session, _ = _one_big_result(tmp_path)
    handle = _handle(session)
    listing = call_tool(session, "chapters_artifact", op="toc")
    assert handle in listing.content
    overview = call_tool(session, "chapters_artifact", op="toc", artifact=handle)
    assert overview.content.startswith("3000 lines")
    found = call_tool(session, "chapters_artifact", op="search", artifact=handle, query="value = 14000 ")
    assert "2001: line 2000: value = 14000" in found.content
    page = call_tool(session, "chapters_artifact", op="read", artifact=handle, offset=100, limit=5)
    assert page.content.splitlines()[0] == "101: line 100: value = 700 # measurement"
    assert "next page: offset=105" in page.content


@pytest.mark.parametrize(
    "name",
    [
        "../../sessions",
        "../x/artifacts/" + "0" * 64 + ".txt",
        "/etc/passwd",
        "{root}/../../kv",
        "{root}/artifacts/../../../etc/passwd",
    ],
)
def test_no_path_escapes(tmp_path, name):
    session, _ = _one_big_result(tmp_path)
    root = _handle(session).split("/", 1)[0]
    before = log_bytes(session)
    for op in ("read", "toc", "search"):
        outcome = call_tool(session, "chapters_artifact", op=op, artifact=name.format(root=root), query="x")
        assert outcome.is_error and "refused" in outcome.content, outcome.content
        assert "absolute" in outcome.content or "'..'" in outcome.content
    assert log_bytes(session) == before


def test_symlink_out_of_the_store_is_refused(tmp_path):
    session, _ = _one_big_result(tmp_path)
    root = _handle(session).split("/", 1)[0]
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    link = archive_file(session, f"{root}/artifacts/{'f' * 64}.txt")
    link.symlink_to(secret)
    outcome = call_tool(session, "chapters_artifact", op="read", artifact=f"{root}/artifacts/{'f' * 64}.txt")
    assert outcome.is_error and "outside the store's blobs folder" in outcome.content
    assert "secret" not in outcome.content.replace("secret.txt", "")


def test_changed_artifact_is_refused(tmp_path):
    session, _ = _one_big_result(tmp_path)
    handle = _handle(session)
    path = archive_file(session, handle)
    path.write_text("tampered")
    outcome = call_tool(session, "chapters_artifact", op="read", artifact=handle)
    assert outcome.is_error and "sha256" in outcome.content


def test_restart_does_not_move_a_result_twice(tmp_path):
    session, _ = _one_big_result(tmp_path)
    again = session.kernel.open_session(session.id)
    again.user("more")
    again.prepare_request()
    assert len([e for e in again.events if e.type == "compaction/prune"]) == 1


WHOLE_FILE = "\n".join(f"def handler_{i}(request):\n    return respond(request, code={i})" for i in range(400))


def test_long_tool_call_arguments_become_an_artifact_the_chapter_names(tmp_path):
    """A ``write`` of a whole file: its arguments are kept verbatim as an artifact the chapter line
    names (read back with chapters_artifact), as a large result is. Before, the chapter clipped
    them at 2,000 characters and named only the log."""
    import orjson
    from helpers_chapters import result_json

    kernel = chapters_kernel(tmp_path, window=48_000)
    session = kernel.open_session()
    arguments = {"file_path": "src/handlers.py", "content": WHOLE_FILE}
    short = {"file_path": "src/small.py", "content": "x = 1"}
    model = ScriptedModel(
        [
            Message.assistant(
                "writing", [ToolCallBlock("w1", "write", arguments), ToolCallBlock("w2", "write", short)]
            ),
            Message.assistant("written"),
        ]
    )
    do_turn(session, model, "write the handlers")
    ceiling = [e.seq for e in session.events if e.type == "turn/end"][-1]
    data = result_json(
        call_tool(
            session,
            "chapters_continue",
            title="next",
            handoff_note="carry on",
            chapters=[{"start_seq": 0, "end_seq": ceiling, "title": "handlers"}],
        )
    )
    child = kernel.open_session(data["session"])  # the continuation reads the chapters
    body = call_tool(child, "chapters_read", chapter=data["chapters"][0]["id"], limit=5000).content
    full = orjson.dumps(arguments).decode()
    line = next(x for x in body.splitlines() if "→ `write`" in x and "handlers.py" in x)
    assert "[artifact `" in line and f"{len(full)} chars]" in line and len(line) < 600
    assert "→ `write` " + orjson.dumps(short).decode() in body  # short arguments stay inline
    assert "artifacts 1" in body.splitlines()[0]  # the frontmatter counts it
    handle = line.split("[artifact `", 1)[1].split("`", 1)[0]
    # verbatim: the arguments as the model sent them (one JSON line, read as lines of 2,000 characters)
    assert _read_pages(child, handle)[0] == full


def test_search_finds_what_the_artifacts_of_archived_chapters_hold(tmp_path):
    """chapters_search covers the large results a chapter itemises, not only the chapter's prose:
    a line only the artifact holds is found, and the hit names the handle to read it with."""
    import json

    from helpers_chapters import call_tool

    session, model = _one_big_result(tmp_path)
    ends = [e.seq for e in session.events if e.type == "turn/end"]
    ranges = [{"start_seq": 0, "end_seq": ends[-1], "title": "the dump"}]
    made = call_tool(session, "chapters_continue", title="t", handoff_note="n", chapters=ranges)
    child = session.kernel.open_session(json.loads(made.content)["session"])
    found = call_tool(child, "chapters_search", query="line 2999: value = 20993").content
    assert found.startswith("1 match(es)"), found
    hit = found.splitlines()[1]
    assert " artifact " in hit and hit.endswith(" line 3000: line 2999: value = 20993 # measurement")
    handle = hit.split(" artifact ")[1].split(" ")[0]  # the hit's line numbers are the artifact's, from 1
    read = call_tool(child, "chapters_artifact", op="read", artifact=handle, offset=2999, limit=1).content
    assert read.startswith("3000: line 2999: value = 20993")


def test_no_result_is_pruned_without_pressure(tmp_path):
    # issue 38: a result above the artifact band was moved out on arrival with the window nearly
    # empty (cued recall 0.93 on a run far below its window). ~9,000 tokens in 127,000 stay inline
    kernel = chapters_kernel(tmp_path, window=128_000)
    session = kernel.open_session()
    large = "\n".join(f"line {i}: value = {i * 7} # measurement" for i in range(750))
    assert session.meter.count_text(large) > 6_000  # over tool_result_artifact_tokens
    model = ScriptedModel(
        [Message.assistant("run it", [ToolCallBlock("c1", "bash", {"command": "dump"})]), Message.assistant("seen")]
    )
    do_turn(session, model, "dump the table", tool_output=lambda call: large)
    assert model.calls[1]["messages"][-1].tool_result.content == large
    assert not [e for e in session.events if e.type.startswith("compaction/")]


def _read_pages(session, handle: str) -> tuple[str, int]:
    """An artifact read back page after page with ``chapters_artifact``, and how many numbered
    lines it took: ``N:`` starts a line, ``N+`` continues the line before it."""
    text, numbered, offset = "", 0, 0
    while True:
        page = call_tool(session, "chapters_artifact", op="read", artifact=handle, offset=offset, limit=5000)
        assert not page.is_error and len(page.content) < 21_000, page.content[:200]
        *body, tail = page.content.splitlines()
        for line in body:
            number, mark, piece = re.fullmatch(r"(\d+)([:+]) (.*)", line).groups()  # type: ignore[union-attr]
            numbered += 1
            assert int(number) == numbered, line[:40]
            text += ("\n" if mark == ":" and numbered > 1 else "") + piece
        if "next page: offset=" not in tail:
            return text, numbered
        offset = int(tail.rsplit("offset=", 1)[1].rstrip(")"))


def test_a_page_of_an_artifact_never_brings_it_back_whole(tmp_path):
    """A one-line artifact (a JSON document) was read in one page, the whole result the artifact
    moved out of the context; a page of many long lines likewise. Long lines are read in pieces
    (2,000 characters each, numbered ``N+`` after the first), and a page stops at a budget (20,000
    characters). A search finds a match across the cut between two pieces, numbered where it starts."""
    document = '{"k": [' + ",".join(f'"value number {i}"' for i in range(12_000)) + "]}\nlast line"
    kernel = chapters_kernel(tmp_path, window=48_000)
    session = kernel.open_session()
    model = ScriptedModel(
        [Message.assistant("run it", [ToolCallBlock("c1", "bash", {"command": "dump"})]), Message.assistant("seen")]
    )
    do_turn(session, model, "dump the document", tool_output=lambda call: document)
    handle = _handle(session)
    before = log_bytes(session)
    first = call_tool(session, "chapters_artifact", op="read", artifact=handle)
    assert len(first.content) < 21_000 and first.content.startswith('1: {"k": ["value number 0"')
    assert first.content.splitlines()[1].startswith("2+ ")
    text, numbered = _read_pages(session, handle)  # every part of the line is reachable, page by page
    assert text == document and numbered == -(-(len(document) - 10) // 2_000) + 1
    overview = call_tool(session, "chapters_artifact", op="toc", artifact=handle)
    assert overview.content.startswith(f"{numbered} lines")
    found = call_tool(session, "chapters_artifact", op="search", artifact=handle, query='"value number 11999"')
    assert found.content.startswith(f"1 matching line(s):\n{numbered - 1}: ")
    across = document[1_990:2_010]  # 10 characters on each side of the first cut
    found = call_tool(session, "chapters_artifact", op="search", artifact=handle, query=across)
    assert found.content.splitlines()[:2] == ["1 matching line(s):", f"1: {document[1_910:2_150]}"]
    assert log_bytes(session) == before


def test_the_artifact_listing_holds_only_what_this_branch_has_seen(tmp_path):
    """Artifacts of a lineage share one folder; a fork's own artifacts are the other branch's
    work, and the parent's listing named them (and a sibling fork's listing too)."""
    parent, _ = _one_big_result(tmp_path)
    mine = _handle(parent)
    fork = parent.kernel.open_session(result_json(call_tool(parent, "chapters_fork", title="the other way"))["session"])
    model = ScriptedModel(
        [Message.assistant("run", [ToolCallBlock("f1", "bash", {"command": "dump"})]), Message.assistant("seen")]
    )
    do_turn(fork, model, "dump the other table", tool_output=lambda call: BIG.replace("value", "other"))
    theirs = _handle(fork)
    assert theirs != mine
    assert theirs.split("/", 1)[0] == mine.split("/", 1)[0]  # one lineage root, one folder
    before = log_bytes(parent)
    listing = call_tool(parent, "chapters_artifact", op="toc").content
    assert mine in listing and theirs not in listing, listing
    assert listing.startswith("1 artifact(s)")
    assert log_bytes(parent) == before
    in_fork = call_tool(fork, "chapters_artifact", op="toc").content
    assert theirs in in_fork and mine in in_fork  # the parent's, archived into the fork's chapters
