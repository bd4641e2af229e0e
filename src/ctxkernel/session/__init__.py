"""The Session: the API integrators call once per model request, and its parts.

:class:`Session` (:mod:`.facade`) is the integrator's object; strategies see its
:class:`~ctxkernel.Context` instead. Its parts, each owning its own state and memos:

- :mod:`.log`: the events folded so far and the one write path (checked, all or nothing);
- :mod:`.track`: what the log's kernel events say (turn, step, open compaction, header, route,
  disabled strategies, task, usage anchor, instructions);
- :mod:`.tooling`: the strategies' tools, the harness's, and the composed request header;
- :mod:`.route` and :mod:`.pressure`: the routed model's settings, and how full the next request is;
- :mod:`.turns`: turns and steps, a front door's history, repair after a crash;
- :mod:`.compose`: composing a request (``pre_step``, the bound, decorations, ``step/start``);
- :mod:`.reply`: replies, provider errors and tool results;
- :mod:`.snapshots`: when snapshots are written, and opening from one.
"""

from ..context import ReplyDraft, Request, RequestHeader, StepContext
from ..convert import normalize_usage
from ..errors import ConflictError
from ..events import EventSpec
from .facade import Session
from .log import COUNTED_ENTRIES
from .route import ROUTE_WINDOW_KEY

__all__ = [
    "COUNTED_ENTRIES",
    "ROUTE_WINDOW_KEY",
    "ConflictError",
    "EventSpec",
    "ReplyDraft",
    "Request",
    "RequestHeader",
    "Session",
    "StepContext",
    "normalize_usage",
]
