"""`invalidate_header()` has the next request register the tools again: a strategy may offer a
tool only while it is useful (the `mask` strategy offers the history tools once something is off
the surface), and the request, the recorded header and a reopened session agree on the set."""

from __future__ import annotations

from types import SimpleNamespace

import ctxkernel
from ctxkernel import Message
from ctxkernel.testing import build_kernel


class _NoArgs(ctxkernel.ToolArgs):
    pass


STRATEGY = ctxkernel.Strategy("late-tool", capabilities={"tools"})


def _plugin():
    @ctxkernel.hookimpl
    def register_strategy(register):
        register(STRATEGY.spec)

    @ctxkernel.hookimpl
    def register_tools(register, ctx):
        # offered once the user has said "unlock": decided from the log alone
        if any(e.type == "user/message" and "unlock" in str(e.data) for e in ctx.events):
            register(STRATEGY.tool("late_tool", "a tool offered late", _NoArgs, lambda ctx, args: "ok"))

    @ctxkernel.hookimpl
    def pre_step(ctx, step):
        STRATEGY.on(ctx).invalidate_header()

    return SimpleNamespace(register_strategy=register_strategy, register_tools=register_tools, pre_step=pre_step)


def _names(request) -> set[str]:
    return {t["function"]["name"] if "function" in t else t["name"] for t in request.tools}


def test_invalidate_header_registers_the_tools_again(tmp_path):
    kernel = build_kernel(tmp_path, strategies=["late-tool"], plugins=[("late-tool", _plugin())], fsync=False)
    session = kernel.open_session()
    session.user("hello")
    assert "late_tool" not in _names(session.prepare_request())
    session.commit_reply(Message.assistant("hi"))
    session.user("unlock it")
    request = session.prepare_request()
    assert "late_tool" in _names(request)
    assert session.run_tool({"id": "c1", "name": "late_tool", "arguments": {}}).content == "ok"
    again = build_kernel(tmp_path, strategies=["late-tool"], plugins=[("late-tool", _plugin())], fsync=False)
    assert _names(again.open_session(session.id).request_header()) == _names(request)
