"""In-place archive: zero model tokens, accumulating tables of contents, retries and finalisation."""

from __future__ import annotations

from helpers_chapters import archive_files, call_tool, chapters_kernel, registry, result_json, run_turns

import ctxkernel
from ctxkernel import ContextOverflowError, ShrinkCheckError
from ctxkernel_chapters import plugin as chapters_plugin
from ctxkernel_chapters.archive import read_verified
from ctxkernel_chapters.storage import Archive
from ctxkernel_chapters.toc import parse


class NoModel:
    """A summarizer that fails the test if anything asks it for tokens."""

    provider, model = "none", "none"

    def complete(self, *args, **kwargs):
        raise AssertionError("the chapters strategy called a model")


def _session(tmp_path, **settings):
    kernel = chapters_kernel(tmp_path, window=6_000, reserve=1_000, **settings)
    kernel.summarizer = NoModel()
    return kernel.open_session()


def _summaries(session):
    return [e for e in session.events if e.type == "compaction/summary"]


def _run_until(session, condition, limit=60, model=None):
    for t in range(limit):
        model = run_turns(session, 1, start=t, model=model)
        if condition():
            return model
    raise AssertionError("condition never met")


def test_pressure_archives_in_place_without_a_model(tmp_path):
    session = _session(tmp_path)
    model = run_turns(session, 1)
    calls_before = len(model.calls)
    _run_until(session, lambda: len(_summaries(session)) >= 1, model=model)
    summary = _summaries(session)[0]
    assert summary.data["strategy"] == "chapters" and summary.data["kind"] == "chapters"
    assert summary.data["reason"] == "pressure"
    assert "usage" not in str(summary.data) and all("provider" not in s for s in summary.data["spans"])
    # the replacement is the table of contents, and it cites chapters whose files verify
    replacement = session.events[summary.seq + 1]
    message = ctxkernel.Message.from_dict(replacement.data["message"])
    assert message.source.plugin == "chapters" and message.text.startswith("<chapters-toc>")
    records = registry(session).get(session.id)["chapters"]
    assert records and all(r["status"] == "final" for r in records)
    # the newest archived instruction of the user is shown verbatim once: in the kernel's block
    # (it protects it), not quoted by the table of contents as well
    archived_users = [
        e
        for e in session.events[: records[-1]["end_seq"] + 1]
        if e.type == "user/message" and e.data["message"]["source"]["kind"] == "user"
    ]
    newest = archived_users[-1].data["message"]["content"][0]["text"]
    assert newest in message.text and "> " + newest not in message.text
    where = Archive.of(session.context)
    for record in records:
        assert record["path"] in message.text
        read_verified(where, record)
    assert calls_before <= len(model.calls)


def test_bullets_accumulate_and_are_unique_by_path(tmp_path):
    session = _session(tmp_path)
    _run_until(session, lambda: len(_summaries(session)) >= 3, limit=120)
    head = session.surface.nodes[0].message.text
    parsed = parse(head)
    paths = [r["path"] for r in registry(session).get(session.id)["chapters"]]
    assert len(paths) == len(set(paths)) >= 3
    for path in paths:
        assert head.count(f"[chapters/{path}]") == 1
    assert len(parsed.bullets) == len(paths)
    # archived ranges are contiguous from seq 0
    ranges = sorted((r["start_seq"], r["end_seq"]) for r in registry(session).get(session.id)["chapters"])
    assert ranges[0][0] == 0
    for (_, b), (c, _) in zip(ranges, ranges[1:]):
        assert c == b + 1


def test_a_continued_sessions_handoff_note_is_carried_through_compactions(tmp_path):
    session = _session(tmp_path)
    run_turns(session, 2)
    ceiling = [e.seq for e in session.events if e.type == "turn/end"][-1]
    note = "Decision held: never touch the vendored parser.\n\nNext: port the lexer tests."
    data = result_json(
        call_tool(
            session,
            "chapters_continue",
            title="t",
            handoff_note=note,
            chapters=[{"start_seq": 0, "end_seq": ceiling, "title": "start"}],
        )
    )
    child = session.kernel.open_session(data["session"])
    _run_until(child, lambda: len(_summaries(child)) >= 2, limit=120)
    head = child.surface.nodes[0].message.text
    assert "Decision held: never touch the vendored parser." in head and "Next: port the lexer tests." in head
    for chapter in data["chapters"]:  # the parent's chapters stay listed
        assert chapter["path"] in head


def test_a_retry_reuses_the_chapter_numbers(tmp_path, monkeypatch):
    session = _session(tmp_path, auto=False)
    run_turns(session, 6)
    root = registry(session).root_of(session.id)
    first = registry(session).next_number(root)
    real = type(session).compact
    attempts = []

    def flaky(self, *args, **kwargs):
        attempts.append(kwargs["data"]["chapters"])
        if len(attempts) == 1:
            raise ShrinkCheckError("forced by the test")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(session), "compact", flaky)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    numbers = [[int(cid.rsplit("/", 1)[1]) for cid in ids] for ids in attempts]
    assert numbers[0][0] == numbers[1][0] == first
    records = registry(session).get(session.id)["chapters"]
    assert [r["number"] for r in records] == numbers[1]
    assert all(r["status"] == "final" for r in records)
    # no file of the failed attempt is left behind
    files = [f for f in archive_files(tmp_path) if "/chapters/" in f]
    assert sorted(files) == sorted(r["path"] for r in records)


def test_a_failed_compaction_leaves_no_records_files_or_numbers(tmp_path, monkeypatch):
    session = _session(tmp_path, auto=False)
    run_turns(session, 6)
    root = registry(session).root_of(session.id)
    first = registry(session).next_number(root)

    def always_fails(self, *args, **kwargs):
        raise ShrinkCheckError("forced by the test")

    monkeypatch.setattr(type(session), "compact", always_fails)
    assert not chapters_plugin.compact_in_place(session.context, 800, reason="test")
    assert registry(session).get(session.id)["chapters"] == []
    assert [f for f in archive_files(tmp_path) if "/chapters/" in f] == []
    assert registry(session).next_number(root) == first


class Exploding:
    """A strategy whose commit hook raises: the transaction has committed by then."""

    @ctxkernel.hookimpl
    def register_strategy(self, register):
        register(ctxkernel.StrategySpec("exploding"))

    @ctxkernel.hookimpl
    def commit(self, ctx, result):
        raise RuntimeError("commit hook failed after the commit")


def test_records_are_final_when_a_hook_raises_after_the_commit(tmp_path, caplog):
    """Another strategy's commit hook that raises does not make the archive look failed: it
    committed, so compact_in_place says so, and the hook's error is logged naming it."""
    kernel = chapters_kernel(tmp_path, window=6_000, reserve=1_000, auto=False)
    with ctxkernel.testing.throwaway_plugin(kernel, Exploding(), "exploding"):
        session = kernel.open_session()
        run_turns(session, 6)
        with caplog.at_level("ERROR", logger="ctxkernel"):
            assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    assert any("'exploding'" in r.getMessage() and "after the commit" in r.getMessage() for r in caplog.records)
    assert len(_summaries(session)) == 1
    records = registry(session).get(session.id)["chapters"]
    assert records and all(r["status"] == "final" for r in records)


def test_overflow_archives_and_asks_for_a_retry(tmp_path):
    session = _session(tmp_path, auto=False)
    run_turns(session, 5)
    session.user("next")
    session.prepare_request()
    before = session.meter.surface_tokens()
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=9999, limit=5000)) is True
    assert session.meter.surface_tokens() < before
    assert _summaries(session)[-1].data["reason"] == "overflow"


def test_the_model_is_told_once_that_a_continuation_is_available(tmp_path):
    # these turns end just under compact_at_ratio; 100 tokens of headroom over _session's window
    # keep an in-place archive (which re-arms the suggestion) out of it as the tool schemas grow
    kernel = chapters_kernel(
        tmp_path, window=6_100, reserve=1_000, compact_at_ratio=0.99, pressure_suggestion_ratio=0.5
    )
    kernel.summarizer = NoModel()
    session = kernel.open_session()
    model = _run_until(session, lambda: session.pressure().ratio > 0.7)
    run_turns(session, 2, start=100, model=model)
    notices = [e for e in session.events if e.type == "user/message" and chapters_plugin.SUGGEST_MARK in str(e.data)]
    assert len(notices) == 1
    text = ctxkernel.Message.from_dict(notices[0].data["message"]).text
    assert "chapters_continue" in text and "events 0.." in text


def test_the_steward_continues_at_the_suggestion(tmp_path):
    session = _session(tmp_path, compact_at_ratio=0.99, pressure_suggestion_ratio=0.5)
    _run_until(session, lambda: chapters_plugin.state(session.context)["suggested"])
    session.user("one more")
    request = session.prepare_request()
    actions = session.kernel.hooks.steward_actions(session, request)
    assert [a["name"] for a in actions] == ["chapters_continue"]
    outcome = call_tool(session, "chapters_continue", **actions[0]["arguments"])
    assert not outcome.is_error, outcome.content
    assert (
        "one more" in session.kernel.open_session(outcome.continue_in).events[0].data["message"]["content"][0]["text"]
    )


def test_an_overflow_the_archive_could_not_help_does_not_disarm_the_next_request(tmp_path):
    """``overflow_retries`` counts the attempts of one request. The first request's overflow finds
    nothing to archive (a fresh session); a later request's can. Before the fix the streak the
    first left refused the later one's overflow path (nothing archived, no retry)."""
    session = _session(tmp_path, auto=False, overflow_retries=1)
    session.user("hello")
    session.prepare_request()
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=9999, limit=5000)) is False
    assert not _summaries(session)  # nothing the archive could take
    session.end_turn()
    run_turns(session, 5)
    session.user("next")
    session.prepare_request()
    before = session.meter.surface_tokens()
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=9999, limit=5000)) is True
    assert session.meter.surface_tokens() < before
    assert [e.data["reason"] for e in _summaries(session)] == ["overflow"]


def test_the_planning_view_collects_the_users_instructions_of_any_range(tmp_path):
    # the in-place path reads the archived events once (issue 21): the instructions its table of
    # contents quotes come from that pass and must be what user_instructions() finds
    from ctxkernel_chapters.strategy import settings_of, user_instructions

    session = _session(tmp_path)
    _run_until(session, lambda: len(_summaries(session)) >= 2)
    floor_tokens = settings_of(session.context).tool_result_defer_floor_tokens
    last = len(session.events) - 1
    ranges = [(0, last), (0, 0), (5, 4), (last // 3, 2 * last // 3), (_summaries(session)[0].seq, last)]
    for start, end in ranges:
        view = chapters_plugin.planning_view(session.context, start, end, floor_tokens, session.surface.nodes)
        assert view.instructions == user_instructions(session.context, start, end)
        assert len(view.tokens) == max(0, end - start + 1)
        for event, tokens in zip(session.events[start : end + 1], view.tokens, strict=True):
            node = session.surface.node(event.seq)
            if node is not None and event.surface["op"] == "append" and node.role != "tool":
                assert tokens == session.meter.node_tokens(node)  # a visible message: the meter's count
    assert user_instructions(session.context, 0, last)  # the ranges held instructions to find


def test_the_regions_count_knows_the_users_messages_and_counts_only_when_asked(tmp_path):
    """``read_region`` reads the region without tokenising anything; its ``count`` answers a
    user's message (as the table of contents quotes it) with the meter's count taken when it
    became visible, and tokenises any other text exactly (issue 21: the user's messages are
    looked up only when a quote does not fit by its bytes)."""
    from ctxkernel.testing import CountingTokenizer

    session = _session(tmp_path)
    run_turns(session, 3)
    nodes = list(session.surface.nodes)
    for node in nodes:
        session.meter.node_tokens(node)  # the meter counts every visible node for its pressure
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    region = chapters_plugin.read_region(session.context, nodes)
    asked = [n.message.text for n in nodes if n.role == "user" and n.message.source.kind == "user"]
    assert asked and counting.texts == []  # reading the region tokenises nothing
    whole = counting.inner.count
    assert [region.count(text) for text in asked] == [whole(text) for text in asked]
    assert [t for t in counting.texts if t] == []  # the messages' counts, not a tokenising
    assert region.count("not a message of the region") == whole("not a message of the region")
    assert counting.texts[-1] == "not a message of the region"


def test_the_steward_note_quotes_only_the_request_within_its_cap(tmp_path):
    import dataclasses

    from ctxkernel_chapters.tools import STEWARD_QUOTE_CHARS

    session = _session(tmp_path, compact_at_ratio=0.99, pressure_suggestion_ratio=0.5)
    _run_until(session, lambda: chapters_plugin.state(session.context)["suggested"])
    session.user("one more: " + "check every call site. " * 100)
    request = session.prepare_request()
    hidden = dataclasses.replace(request, messages=[m for m in request.messages if m.source.kind != "user"])
    unseen = session.kernel.hooks.steward_actions(session, hidden)
    assert "one more" not in unseen[0]["arguments"]["handoff_note"]  # not on the request: not quoted
    chapters_plugin.state(session.context).pop("steward_tried")
    note = session.kernel.hooks.steward_actions(session, request)[0]["arguments"]["handoff_note"]
    (asked,) = [line for line in note.splitlines() if line.startswith("In progress: ")]
    assert asked == "In progress: " + ("one more: " + "check every call site. " * 100)[:STEWARD_QUOTE_CHARS]
