"""After an automatic rollover mid-loop, the new window shows the tool results the client has
just sent (issue 38: the new window left them out and the model started the task over)."""

from __future__ import annotations

from helpers_rollover import call, rollover_kernel, rollover_summaries

from ctxkernel import Message

FILE = "def f(x):\n    return x * 2  # a line of code\n" * 40  # about 600 tokens


def test_an_automatic_rollover_keeps_the_results_just_sent(tmp_path):
    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    session = kernel.open_session()
    session.user("read every file and report")
    counter = iter(range(1, 1_000))
    checked = 0
    for _ in range(60):
        request = session.prepare_request()
        switched = rollover_summaries(session)
        if len(switched) > checked:
            checked = len(switched)
            # the switch ran in this request's pre_step: the last result the client sent is in
            # the request, with its call, right after the seed
            last = [e for e in session.events if e.type == "tool/result"][-1]
            call_id = last.data["message"]["content"][0]["call_id"]
            shown = [m for m in request.messages if m.role == "tool"]
            assert shown and shown[-1].tool_result.call_id == call_id, "the new window left the result out"
            callers = [m for m in request.messages if m.role == "assistant" and m.tool_calls]
            assert callers and callers[-1].tool_calls[0].id == call_id
            assert request.messages[0].source.kind != "user" or "seed" in str(request.messages[0].source)
            assert request.pressure.tokens <= request.pressure.effective_window
        n = next(counter)
        reply = Message.assistant(f"reading {n}", [call(f"r{n}", "read_file", path=f"f{n}.py")])
        session.commit_reply(reply)
        for c in session.pending_calls:
            session.tool_result(c.id, FILE + f"# file {n}\n")
    assert checked >= 2, "the loop never rolled over"
    assert {s["trigger"] for s in rollover_summaries(session)} == {"auto"}
