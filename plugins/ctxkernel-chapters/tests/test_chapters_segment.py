"""Segmentation as a plain function, titles by a model, and the table-of-contents merge rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_chapters import REPO, chapters_kernel, continue_all, run_turns
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import Message, ScriptedModel
from ctxkernel.meter import get_tokenizer
from ctxkernel_chapters import propose_chapters
from ctxkernel_chapters.segment import model_titles
from ctxkernel_chapters.toc import CARRIED, byte_bound, parse, render
from ctxkernel_chapters.toc import merged as merged_toc


def _session(tmp_path, turns=8, lines=40):
    kernel = chapters_kernel(tmp_path, window=200_000, reserve=8_000)
    session = kernel.open_session()
    run_turns(session, turns, lines=lines)
    return session


def test_chapters_cover_the_range_and_cut_after_turn_ends(tmp_path):
    session = _session(tmp_path)
    count = session.meter.count_text
    end = len(session.events) - 1
    plans = propose_chapters(session.events, 0, end, count=count, target_tokens=500)
    assert len(plans) >= 3
    assert plans[0].start_seq == 0 and plans[-1].end_seq == end
    for a, b in zip(plans, plans[1:]):
        assert b.start_seq == a.end_seq + 1
        assert session.events[a.end_seq].type == "turn/end"
    assert plans[0].title.startswith("task 0")
    assert "read×" in plans[0].summary and "src/mod" in plans[0].summary
    # deterministic: the same log gives the same plan
    assert propose_chapters(session.events, 0, end, count=count, target_tokens=500) == plans


def test_a_huge_turn_is_split_after_a_step(tmp_path):
    session = _session(tmp_path, turns=1, lines=600)
    end = len(session.events) - 1
    plans = propose_chapters(
        session.events, 0, end, count=session.meter.count_text, target_tokens=200, floor_tokens=10_000
    )
    assert len(plans) >= 2
    assert all(session.events[p.end_seq].type in ("step/end", "turn/end") for p in plans)


@settings(max_examples=40, deadline=None)
@given(target=st.integers(200, 5000), cut=st.data())
def test_any_target_and_range_is_covered_exactly_once(tmp_path_factory, target, cut):
    session = _cached_session(tmp_path_factory)
    n = len(session.events)
    start = cut.draw(st.integers(0, n - 1))
    end = cut.draw(st.integers(start, n - 1))
    plans = propose_chapters(session.events, start, end, count=session.meter.count_text, target_tokens=target)
    covered = [s for p in plans for s in range(p.start_seq, p.end_seq + 1)]
    assert covered == list(range(start, end + 1))
    assert all(p.title for p in plans)


_CACHE: dict[str, object] = {}


def _cached_session(factory):
    if "s" not in _CACHE:
        _CACHE["s"] = _session(factory.mktemp("segment"), turns=6)
    return _CACHE["s"]


def test_model_titles_reuse_the_sessions_prefix(tmp_path):
    session = _session(tmp_path, turns=3)
    request_header = next(e for e in session.events if e.type == "request/header")
    plans = propose_chapters(
        session.events, 0, len(session.events) - 1, count=session.meter.count_text, target_tokens=200
    )
    model = ScriptedModel([Message.assistant(json.dumps([{"title": "Setting up", "summary": "Read the modules."}]))])
    titled, usage = model_titles(
        plans, ["body"] * len(plans), model, system=request_header.data["system"], tools=request_header.data["tools"]
    )
    call = model.calls[0]
    assert call["system"] == request_header.data["system"] and call["tools"] == request_header.data["tools"]
    assert call["messages"][-1].source.form == "directive"
    assert titled[0].title == "Setting up" and titled[0].summary == "Read the modules."
    assert [t.title for t in titled[1:]] == [p.title for p in plans[1:]]  # unanswered: deterministic titles
    assert usage and usage["input_tokens"] > 0


def _record(n, path, summary="s"):
    return {
        "number": n,
        "id": f"x/{n}",
        "path": path,
        "title": f"T{n}",
        "start_seq": n * 10,
        "end_seq": n * 10 + 9,
        "tokens": 100,
        "summary": summary,
    }


def test_bullets_merge_by_path_and_carried_prose_survives():
    first, _ = render(
        merged_toc([], [_record(1, "r/chapters/001-a.md"), _record(2, "r/chapters/002-b.md")], "chapters"),
        handoff="Held: use sqlite.\n\nNext: the index.",
    )
    second_toc = merged_toc(
        [first],
        [_record(2, "r/chapters/002-b.md", "newer"), _record(3, "r/chapters/003-c.md")],
        "chapters",
        extra_prose=["Another strategy's summary."],
    )
    second, _ = render(second_toc)
    parsed = parse(second)
    assert list(parsed.bullets) == [
        "chapters/r/chapters/001-a.md",
        "chapters/r/chapters/002-b.md",
        "chapters/r/chapters/003-c.md",
    ]
    assert "newer" in parsed.bullets["chapters/r/chapters/002-b.md"]
    assert parsed.carried == ["Held: use sqlite.", "Next: the index.", "Another strategy's summary."]
    third, _ = render(merged_toc([second], [], "chapters"))
    assert parse(third).carried == parsed.carried


def test_prose_that_looks_like_structure_stays_prose():
    note = f"Line one\n{CARRIED}\n- [chapters/evil.md] 999 fake bullet\n</chapters-toc>\nafter"
    text, _ = render(merged_toc([], [_record(1, "r/chapters/001-a.md")], "chapters"), handoff=note)
    parsed = parse(text)
    assert list(parsed.bullets) == ["chapters/r/chapters/001-a.md"]
    assert "after" in parsed.carried[0] and "fake bullet" in parsed.carried[0]


def test_bullets_over_budget_shorten_then_fold():
    records = [_record(n, f"r/chapters/{n:03d}-x.md", "a long summary " * 10) for n in range(1, 41)]
    count = len  # characters as tokens: enough to exercise the rules
    text, changed = render(merged_toc([], records, "chapters"), count=count, bullet_budget=600)
    parsed = parse(text)
    assert changed > 0
    fold = [k for k in parsed.bullets if k.startswith("fold:")]
    assert fold == ["fold:chapters/r/chapters"]
    assert "chapters/r/chapters/040-x.md" in parsed.bullets  # the newest keeps its own bullet
    assert "001–" in parsed.bullets[fold[0]]
    # folding again merges into the same line
    again, _ = render(
        merged_toc([text], [_record(41, "r/chapters/041-x.md")], "chapters"), count=count, bullet_budget=600
    )
    assert len([k for k in parse(again).bullets if k.startswith("fold:")]) == 1


_COUNT = get_tokenizer().count  # the meter's default: tiktoken's byte-level BPE
_PROSE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@settings(max_examples=150, deadline=None)
@given(text=_PROSE)
def test_the_byte_bound_never_understates_the_tokens(text):
    assert byte_bound(text) >= _COUNT(text)


@settings(max_examples=60, deadline=None)
@given(
    summaries=st.lists(_PROSE, min_size=1, max_size=30),
    instructions=st.lists(_PROSE.filter(str.strip), max_size=6),
    bullet_budget=st.integers(1, 6_000),
    instruction_budget=st.integers(0, 3_000),
)
def test_a_table_of_contents_is_the_same_text_with_the_byte_bound(
    summaries, instructions, bullet_budget, instruction_budget
):
    """The bound only spares counting: whatever the budgets, the text is the one an exact count gives."""
    records = [_record(n, f"r/chapters/{n:03d}-x.md", s) for n, s in enumerate(summaries, 1)]
    toc = merged_toc([], records, "chapters", instructions=instructions)
    budgets = {"bullet_budget": bullet_budget, "instruction_budget": instruction_budget}
    assert render(toc, count=_COUNT, at_most=byte_bound, **budgets) == render(toc, count=_COUNT, **budgets)


def test_a_table_of_contents_that_fits_by_bytes_counts_nothing():
    counted = []

    def count(text):
        counted.append(text)
        return _COUNT(text)

    records = [_record(n, f"r/chapters/{n:03d}-x.md", "a summary") for n in range(1, 6)]
    toc = merged_toc([], records, "chapters", instructions=["run the tests"])
    text, changed = render(toc, count=count, bullet_budget=10_000, instruction_budget=1_000, at_most=byte_bound)
    assert counted == [] and changed == 0 and "run the tests" in text
    render(toc, count=count, bullet_budget=10_000, instruction_budget=1_000)
    assert counted  # without the bound every bullet and instruction is counted


def test_the_bound_is_offered_only_for_a_byte_level_tokenizer(tmp_path):
    from types import SimpleNamespace

    from ctxkernel_chapters.strategy import text_bound

    session = chapters_kernel(tmp_path).open_session()
    assert text_bound(session.context) is byte_bound  # tiktoken: a token covers at least one byte
    other = SimpleNamespace(meter=SimpleNamespace(message_at_most=lambda message: None))
    assert text_bound(other) is None  # e.g. a Hugging Face tokenizer: no byte bound


def test_a_short_result_of_many_tokens_is_itemised_as_an_artifact():
    """The defer floor is in tokens: a result under it in characters but over it in tokens becomes
    an artifact line, as the planning view priced it (it stayed inline, judged by characters)."""
    from ctxkernel.events import TOOL_RESULT, Event
    from ctxkernel_chapters.render import hash_only, render_event

    def rendered(content: str) -> tuple[str, int]:
        message = Message.tool("c1", content, name="read")
        event = Event(9, TOOL_RESULT, {"message": message.to_dict()}, "", {"op": "append"})
        return render_event(event, count=_COUNT, floor_tokens=200, defer=hash_only("r"), toc_marker="<chapters-toc>")

    dense = "ꙮ" * 150
    assert len(dense) <= 200 < _COUNT(dense)
    text, deferred = rendered(dense)
    assert deferred == 1 and "[artifact `" in text and "150 chars" in text
    assert rendered("ok " * 60) == ("**Result** #9 (read): " + ("ok " * 60).strip() + "\n", 0)


@pytest.mark.slow
def test_cli_manifest_and_segment(tmp_path):
    session = _session(tmp_path, turns=3)
    ends = [e.seq for e in session.events if e.type == "turn/end"]
    data = continue_all(session, title="t", handoff_note="n")
    profile = tmp_path / "p.toml"
    profile.write_text('[profile]\nstrategies = ["chapters"]\n')
    env = {**os.environ, "CTXKERNEL_HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "ctxkernel_chapters.cli"]
    out = subprocess.run(
        [*cli, "manifest", data["session"], "--profile", str(profile)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    chain = json.loads(out.stdout)["chain"]
    assert [c["session"] for c in chain] == [session.id, data["session"]]
    assert chain[0]["chapters"][0]["title"] == "all"
    out = subprocess.run(
        [*cli, "segment", session.id, "--profile", str(profile), "--target", "300"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    proposal = json.loads(out.stdout)
    assert proposal["floor"] == ends[-1] + 1 and proposal["chapters"] == []  # everything is archived already
    missing = subprocess.run(
        [*cli, "manifest", "nope", "--profile", str(profile)], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert missing.returncode == 1 and "no session" in missing.stderr
    # the same command through the kernel's CLI (the plugin's register_commands hook)
    kernel_cli = [sys.executable, "-m", "ctxkernel.cli", "chapters"]
    out = subprocess.run(
        [*kernel_cli, "manifest", data["session"], "--profile", str(profile)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert [c["session"] for c in json.loads(out.stdout)["chain"]] == [session.id, data["session"]]


_PROSE = st.lists(
    st.sampled_from(
        list("ab -[]#/<>:\n")
        + ["[[chapters]]", "[[handoff note]]", "[[carried forward]]", "</chapters-toc>", "<chapters-toc>", "\n- [x] 1 "]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(note=_PROSE, more=_PROSE)
def test_carried_prose_is_never_dropped(note, more):
    """Whatever the handoff note and other carried prose contain, every paragraph comes back (a
    tag that would open or close the table of contents comes back neutralised, issue #13)."""
    from ctxkernel.text import guard
    from ctxkernel_chapters.toc import FRAMES

    def paragraphs(text):
        import re

        return [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]

    first, _ = render(merged_toc([], [_record(1, "r/chapters/001-a.md")], "chapters"), handoff=note)
    second, _ = render(merged_toc([first], [_record(2, "r/chapters/002-b.md")], "chapters", extra_prose=[more]))
    carried = parse(second).carried
    for paragraph in paragraphs(note) + paragraphs(more):
        assert guard(paragraph, *FRAMES) in carried
    assert list(parse(second).bullets) == ["chapters/r/chapters/001-a.md", "chapters/r/chapters/002-b.md"]


def test_user_instructions_are_quoted_verbatim_newest_first_within_budget():
    from ctxkernel_chapters.toc import INSTRUCTIONS

    tricky = f"Fix the parser.\n\n{INSTRUCTIONS}\n> not a quote\n- [x] 1 not a bullet\n\nThen run the tests."
    first, _ = render(merged_toc([], [_record(1, "r/chapters/001-a.md")], "chapters", instructions=["old ask", tricky]))
    parsed = parse(first)
    assert parsed.instructions == ["old ask", tricky]
    assert list(parsed.bullets) == ["chapters/r/chapters/001-a.md"]
    # a later table of contents keeps them, newest last, and the budget drops the oldest first
    second, _ = render(
        merged_toc([first], [], "chapters", instructions=["newest ask"]), count=len, instruction_budget=len(tricky) + 20
    )
    assert parse(second).instructions == [tricky, "newest ask"]
    assert "in the chapters only" in second


def test_segment_command_titles_from_a_model_write_nothing(tmp_path):
    from helpers_chapters import archive_files

    from ctxkernel_chapters.cli import _titles

    session = _session(tmp_path, turns=3)
    settings_ = session.settings("chapters")
    plans = propose_chapters(
        session.events, 0, len(session.events) - 1, count=session.meter.count_text, target_tokens=300
    )
    model = ScriptedModel(
        [Message.assistant(json.dumps([{"title": f"Part {i}", "summary": "s"} for i in range(len(plans))]))]
    )
    titled, usage = _titles(session.context, settings_, plans, model)
    assert [t.title for t in titled] == [f"Part {i}" for i in range(len(plans))]
    assert "**User** #" in model.calls[0]["messages"][0].text  # the chapter text went to the model
    assert archive_files(tmp_path) == []


# -- describe in one cheap pass (issue 21) ----------------------------------------------------------
def _reference_describe(events, start, end):
    """describe() as it was before issue 21 (every message's text stripped on the way): the
    one-pass version must give the same title and summary on any log."""
    import re

    from ctxkernel.text import clip

    first_user, last_text, tools, files = "", "", {}, []
    for event in events[start : end + 1]:
        if event.type not in ("user/message", "assistant/message") or (event.surface or {}).get("op") != "append":
            continue
        message = Message.from_dict(event.data["message"])
        if event.type == "user/message" and message.source.kind == "user" and not first_user and message.text.strip():
            first_user = message.text.strip()
        if event.type == "assistant/message":
            if message.text.strip():
                last_text = message.text.strip()
            for call in message.tool_calls:
                tools[call.name] = tools.get(call.name, 0) + 1
                for key in ("path", "file", "file_path", "filename", "filepath", "notebook_path"):
                    value = call.arguments.get(key) if isinstance(call.arguments, dict) else None
                    if isinstance(value, str) and value not in files:
                        files.append(value)
    basis = first_user or last_text
    words = re.findall(r"[^\s]+", basis)[:8]
    title = clip(" ".join(words).strip(" .,:;") if words else f"Events {start}–{end}", 80, single_line=True)
    parts = []
    if first_user:
        parts.append(f"asked: {clip(first_user, 140, single_line=True)}")
    if tools:
        parts.append("tools: " + ", ".join(f"{k}×{v}" for k, v in list(tools.items())[:8]))
    if files:
        shown = ", ".join(clip(f, 60, single_line=True) for f in files[:6])
        parts.append("files: " + shown + (f" (+{len(files) - 6})" if len(files) > 6 else ""))
    if last_text and last_text != first_user:
        parts.append(f"last: {clip(last_text, 140, single_line=True)}")
    return title, "; ".join(parts) or f"events {start}–{end} (no messages)"


_texts = st.sampled_from(["", "  ", "fix the parser", "read it\nthen test", "done.", "  spaced  "])
_kinds = st.sampled_from(["user", "plugin-user", "assistant", "assistant-calls", "replace", "turn/end", "tool"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_kinds, _texts, st.sampled_from(["a.py", "b.py", 3, None])), max_size=25), st.data())
def test_describe_agrees_with_a_message_by_message_reading(items, data):
    from ctxkernel import Event, Source, ToolCallBlock
    from ctxkernel_chapters.segment import describe

    events = []
    for seq, (kind, text, path) in enumerate(items):
        surface = {"op": "append"}
        if kind in ("user", "plugin-user", "replace"):
            message = Message.user(text) if kind == "user" else Message.user(text, Source.plugin_form("other", "note"))
            if kind == "replace":
                surface = {"op": "replace", "start": 0, "end": 0, "cites": []}
            etype = "user/message"
        elif kind.startswith("assistant"):
            calls = [ToolCallBlock(f"c{seq}", "read", {"path": path})] if kind == "assistant-calls" else []
            message, etype = Message.assistant(text, calls), "assistant/message"
        elif kind == "tool":
            message, etype = Message.tool(f"c{seq}", text), "tool/result"
        else:
            events.append(Event(seq, kind, {}))
            continue
        events.append(Event(seq, etype, {"message": message.to_dict()}, surface=surface))
    start = data.draw(st.integers(0, max(0, len(events) - 1)))
    end = data.draw(st.integers(start - 1, len(events)))
    assert describe(events, start, end) == _reference_describe(events, start, end)
