from ctxkernel import Message, ScriptedModel, ToolCallBlock
from ctxkernel.testing import build_kernel


def test_basic_loop_compacts_and_replays(tmp_path):
    kernel = build_kernel(tmp_path, model={"context_window": 6000, "reserved_output_tokens": 1000})
    session = kernel.open_session()
    counter = {"n": 0}

    def script(messages, system, tools):
        counter["n"] += 1
        n = counter["n"]
        if n % 3:
            return Message.assistant(f"reading {n}", [ToolCallBlock(f"c{n}", "read", {"path": f"f{n}.py"})])
        return Message.assistant(f"done {n}")

    model = ScriptedModel(script)
    for turn in range(20):
        session.user(f"task {turn}")
        while True:
            request = session.prepare_request()
            assert request.pressure.tokens <= request.pressure.effective_window
            reply = model.complete(request.messages, system=request.system, tools=request.tools)
            session.commit_reply(reply.message, usage=reply.usage)
            for call in session.pending_calls:
                session.tool_result(call.id, "x = 1\n" * 100)
            if not session.wants_another_step:
                break
        session.end_turn()
    assert any(e.type == "compaction/summary" for e in session.events)
    again = kernel.open_session(session.id)
    assert [n.seq for n in again.surface] == [n.seq for n in session.surface]
    assert again.pressure() == session.pressure()
