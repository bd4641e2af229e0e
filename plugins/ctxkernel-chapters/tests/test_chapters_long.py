"""A long scripted session with large outputs: it never exceeds the effective window, and every
original event stays recoverable from verified chapters (or the log, which is never rewritten)."""

from __future__ import annotations

import pytest
from helpers_chapters import chapters_kernel, registry

from ctxkernel import ContextOverflowError, Message, ScriptedModel, ToolCallBlock
from ctxkernel_chapters.archive import read_verified
from ctxkernel_chapters.artifacts import load
from ctxkernel_chapters.storage import Archive


def _output(n: int) -> str:
    # every few calls a result too large to be reasoning context at all
    lines = 900 if n % 7 == 0 else 25 + (n * 37) % 120
    return f"## output {n}\n" + "\n".join(f"{n}.{i}: status=ok value={i * n % 997}" for i in range(lines))


@pytest.mark.slow
def test_hundreds_of_steps_stay_inside_the_window_and_remain_recoverable(tmp_path):
    window, reserve = 12_000, 2_000
    kernel = chapters_kernel(tmp_path, window=window, reserve=reserve)
    session = kernel.open_session()
    counter = {"n": 0}

    def script(messages, system, tools):
        counter["n"] += 1
        n = counter["n"]
        if n % 4:
            calls = [ToolCallBlock(f"c{n}a", "bash", {"command": f"run {n}"})]
            if n % 3 == 0:
                calls.append(ToolCallBlock(f"c{n}b", "read", {"path": f"src/file{n}.py"}))
            return Message.assistant(f"step {n}: checking", calls)
        return Message.assistant(f"step {n}: finished this part")

    model = ScriptedModel(script, overflow_above=window - reserve)
    steps = 0
    peak = 0
    turn = 0
    while steps < 400:
        turn += 1
        session.user(f"instruction {turn}: process batch {turn}")
        while True:
            request = session.prepare_request()
            peak = max(peak, request.pressure.tokens)
            assert request.pressure.tokens <= request.pressure.effective_window
            try:
                reply = model.complete(request.messages, system=request.system, tools=request.tools)
            except ContextOverflowError as exc:  # the provider's own count must agree with the meter
                raise AssertionError(f"step {steps}: {exc}") from None
            steps += 1
            session.commit_reply(reply.message, usage=reply.usage)
            for call in session.pending_calls:
                session.tool_result(call.id, _output(steps))
            if not session.wants_another_step:
                break
        session.end_turn()
    assert steps >= 400
    summaries = [e for e in session.events if e.type == "compaction/summary"]
    assert len(summaries) >= 5 and all(s.data["strategy"] == "chapters" for s in summaries)
    assert any(e.type == "compaction/prune" for e in session.events)
    assert peak > 0.8 * (window - reserve)  # the run did press against the window

    # every original message is on the surface, or in a verified chapter (its big results as artifacts)
    records = registry(session).get(session.id)["chapters"]
    where = Archive.of(session.context)
    bodies = []
    for record in sorted(records, key=lambda r: r["start_seq"]):
        chapter = read_verified(where, record)
        bodies.append((record["start_seq"], record["end_seq"], chapter.body))
    visible = {n.seq for n in session.surface.nodes}
    covered_through = max(r["end_seq"] for r in records)
    # a result moved to the artifact store on arrival is shown as a handle (the prune's replacement)
    shown_as = {e.data["target"]: e.seq + 1 for e in session.events if e.type == "compaction/prune"}
    for event in session.events:
        if event.type not in ("user/message", "assistant/message", "tool/result") or event.surface != {"op": "append"}:
            continue
        if event.seq in visible:
            continue
        if shown_as.get(event.seq) in visible:
            handle_text = session.surface.node(shown_as[event.seq]).message.tool_result.content
            handle = handle_text.split("[artifact ", 1)[1].split(":", 1)[0]
            assert load(where, handle) == event.data["message"]["content"][0]["content"]
            continue
        assert event.seq <= covered_through, f"event {event.seq} left the surface without being archived"
        body = next(b for s, e, b in bodies if s <= event.seq <= e)
        message = Message.from_dict(event.data["message"])
        marker = {"user/message": "**User**", "assistant/message": "**Assistant**", "tool/result": "**Result**"}[
            event.type
        ]
        if event.type == "user/message" and message.source.kind == "plugin":
            marker = "**Table of contents**" if message.text.startswith("<chapters-toc>") else "**Notice**"
        line = next(
            line
            for line in body.splitlines()
            if line.startswith(f"{marker} #{event.seq} ") or line.startswith(f"{marker} #{event.seq}:")
        )
        if event.type == "tool/result":
            content = message.tool_result.content
            if "[artifact `" in line:
                handle = line.split("[artifact `", 1)[1].split("`", 1)[0]
                assert load(where, handle) == content
            else:
                assert content.strip() in body
        elif event.type == "user/message" and message.source.kind == "user":
            assert message.text in line
    # ranges are contiguous from 0: nothing of the log is skipped
    spans = sorted((r["start_seq"], r["end_seq"]) for r in records)
    assert spans[0][0] == 0 and all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))
