"""The ninth round's cuts to a request's work (the surface's kept message lists, the reply's
surrogate check and its one ``to_dict``, the model settings read once per request, hooks nobody
implements not dispatched, the excerpt bound's mark on the index of large nodes) leave the log's
bytes as they were. Drawn sessions (client-held history written with the request, as ``serve``
does, and the usual user/request/reply steps with tool calls, oversized results, compactions,
routes and system prompts) are run twice, once on these paths and once with each of them put back
to what it replaced; the two jsonl logs are byte-identical once the event times and the random
ids (compaction ids, lease tokens) are numbered in order of appearance."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from request_memos_support import clear_large_mark, excerpt_after, run, step, twin_sessions, words

from ctxkernel import Message, Session
from ctxkernel.messages import ToolCallBlock
from ctxkernel.plugins import HookFacade
from ctxkernel.session import reply as session_module
from ctxkernel.session.route import Routing
from ctxkernel.surface import Surface
from ctxkernel.text import storable


def _storable_message_before(message: Message) -> tuple[Message, dict[str, Any]]:
    """The reply's cleaning as it was: storable() walks its dict, and the dict is built again."""
    data = message.to_dict()
    cleaned = storable(data)
    message = message if cleaned is data else Message.from_dict(cleaned)
    return message, message.to_dict()


@contextlib.contextmanager
def paths_before() -> Iterator[None]:
    model_settings = Routing.model_settings

    def settings_fresh(self: Routing) -> Any:
        self._memo = None
        return model_settings(self)

    def always_dispatch(self: HookFacade, name: str, session: Any, /, **kwargs: Any) -> None:
        self._caller(name, session)(ctx=session.context, **kwargs)

    with (
        mock.patch.object(Surface, "messages", lambda self: [n.message for n in self.nodes]),
        mock.patch.object(Surface, "seqs", lambda self: [n.seq for n in self.nodes]),
        mock.patch.object(session_module, "_storable_message", _storable_message_before),
        mock.patch.object(Routing, "model_settings", settings_fresh),
        mock.patch.object(HookFacade, "_call_if_implemented", always_dispatch),
        excerpt_after(clear_large_mark),
    ):
        yield


def serve_request(session: Session, n: int, calls: int) -> None:
    """A proxy's request: the client's new user message held and written with the reply."""
    if session.surface.pending_calls or session.step_open:
        return
    request = session.prepare_request(history=[Message.user(words(8, n))], defer_write=True)
    blocks = [ToolCallBlock(f"s{n}_{k}", "read_file", {"path": f"s{k}.py"}) for k in range(calls)]
    reply = Message.assistant(words(10, n) + (" \ud800" if n % 5 == 0 else ""), blocks)  # a lone surrogate too
    session.commit_reply(reply, usage={"prompt_tokens": request.pressure.tokens, "completion_tokens": 9})
    for call in blocks:
        session.tool_result(call.id, words(30, n))


_RANDOM = re.compile(rb'"(compaction_id|token)":"([0-9a-f]+)"')
_TIMES = re.compile(rb'"(time|started)":"[^"]*"')


def normalised(path: Path) -> bytes:
    """The events' lines (the header line, with the session's own id, left out)."""
    data = _TIMES.sub(rb'"\1":"T"', path.read_bytes().split(b"\n", 1)[1])
    seen: dict[bytes, int] = {}
    return _RANDOM.sub(lambda m: b'"%s":"id%d"' % (m.group(1), seen.setdefault(m.group(2), len(seen))), data)


drawn = st.one_of(step, st.tuples(st.just("serve"), st.integers(0, 2)), st.tuples(st.just("serve"), st.just(0)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(drawn, min_size=1, max_size=25))
def test_the_log_is_byte_identical_to_the_paths_before(tmp_path_factory: Any, steps: list[Any]) -> None:
    now, before = twin_sessions(tmp_path_factory, "now", "before")
    for n, action in enumerate(steps):
        for session, paths in ((now, contextlib.nullcontext()), (before, paths_before())):
            with paths:
                if action[0] == "serve":
                    serve_request(session, n, action[1])
                else:
                    run(session, action, n)
    logs = [normalised(s.store.path(s.id)) for s in (now, before)]
    assert logs[0] == logs[1]
    assert len(now.events) == len(before.events)
