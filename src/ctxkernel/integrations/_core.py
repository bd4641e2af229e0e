"""What the three framework adapters share: a kernel from a profile, one session bound to one
framework conversation, and the per-call sequence (reconcile, prepare, commit, strategy tools).

The adapters only convert messages; everything that touches the session happens here, through
the Session API, so a behaviour is the same behind every door.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from ..convert import prompt_cache_key
from ..errors import SessionExistsError
from ..events import utc_now
from ..kernel import Kernel
from ..messages import Message, ToolCallBlock
from ..pairing import CallIds
from ..session import Request, Session
from ..store.base import SessionHeader
from ..tools import ToolOutcome
from ._reconcile import _CONTINUES, IntegrationError, LogIndex, reconcile

ProfileArg = "str | os.PathLike[str] | Kernel"


def open_kernel(profile: str | os.PathLike[str] | Kernel) -> Kernel:
    """A kernel for ``profile``: a profile name (searched as ``Kernel.from_profile`` does), a
    path to a TOML file, or a :class:`~ctxkernel.Kernel` already built."""
    if isinstance(profile, Kernel):
        return profile
    if not isinstance(profile, (str, os.PathLike)):
        msg = f"profile must be a profile name, a path or a ctxkernel.Kernel, got {type(profile).__name__}"
        raise IntegrationError(msg)
    return Kernel.from_profile(profile)


def strategy_tool_schemas(kernel: Kernel) -> list[dict[str, Any]]:
    """The profile's strategy tools (OpenAI function schemas), for frameworks that need the tool
    list before any session exists: every tool a strategy may offer, also those it offers only
    once it has something to do (a session's request carries what it offers then,
    :meth:`ManagedSession.tool_schemas`). Asked of a session object that is never stored."""
    probe = Session(kernel, SessionHeader(id="integrations-probe", created=utc_now(), profile=kernel.profile.name))
    return [dict(schema) for schema in probe.offerable_tools.schemas()]


class ManagedSession:
    """One framework conversation bound to one ctxkernel session.

    The session is opened on first use: resumed when ``session_id`` exists in the profile's
    store, created under that id otherwise (a new id when None). Calls are serialised by a lock,
    so a framework that runs its history processor in a worker thread is safe.
    """

    def __init__(self, kernel: Kernel, session_id: str | None = None, *, origin: str, every_tool: bool = False) -> None:
        self.kernel = kernel
        self._id = session_id
        self._origin = origin
        #: the framework sends every strategy tool with every call (Session.offer_every_tool)
        self._every_tool = every_tool
        self._session: Session | None = None
        self._lock = threading.RLock()
        self._index = LogIndex()
        #: results of strategy tools this adapter ran, by call id, until their result is committed
        self._outcomes: dict[str, ToolOutcome] = {}
        self._harness_tools: list[dict[str, Any]] | None = None

    @property
    def session(self) -> Session:
        with self._lock:
            if self._session is None:
                self._session = self._open()
                if self._every_tool:
                    self._session.offer_every_tool()
            return self._session

    def _open(self) -> Session:
        kernel = self.kernel
        if self._id is not None and kernel.store.exists(self._id):
            return kernel.open_session(self._id)
        try:
            return kernel.open_session(self._id, create=True, origin=self._origin)
        except SessionExistsError:  # another process created it between our check and now
            return kernel.open_session(self._id)

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def prompt_cache_key(self) -> str | None:
        """The session's OpenAI ``prompt_cache_key`` (docs/cache.md), None with
        ``[cache] hints = false``."""
        return prompt_cache_key(self.id) if self.kernel.profile.cache.hints else None

    # -- the per-call sequence ------------------------------------------------------------------------
    def sync(self, history: Sequence[Message], usages: dict[int, Any] | None = None, *, partial: bool = False) -> int:
        """Append what ``history`` holds that the log does not (see :func:`reconcile`)."""
        with self._lock:
            session = self.session
            appended = reconcile(session, history, self._index, self._outcomes, usages, partial=partial)
            for call_id in [c for c in self._outcomes if c in self._index.resolved]:
                del self._outcomes[call_id]
            return appended

    def prepare(
        self,
        history: Sequence[Message],
        *,
        system: str | None = None,
        harness_tools: list[dict[str, Any]] | None = None,
        usages: dict[int, Any] | None = None,
    ) -> Request:
        """Reconcile, then let the strategies compose the next request from the surface.

        ``system`` is the framework's own system prompt (None keeps the profile's); the
        strategies add their sections after it. ``harness_tools`` are the framework's own tool
        schemas (OpenAI function format), counted by the meter with the strategies' tools.
        """
        with self._lock:
            session = self.session
            self.sync(history, usages)
            session.set_harness_system(system)
            if harness_tools is not None and harness_tools != self._harness_tools:
                session.set_harness_tools(harness_tools)
                self._harness_tools = list(harness_tools)
            if session.surface.pending_calls:
                msg = (
                    f"the framework asked for a model call while tool calls {list(session.surface.pending_calls)} "
                    "have no result in its history"
                )
                raise IntegrationError(msg)
            if not session.turn_open:
                # the framework calls the model with nothing new since the last final reply
                session.user(Message.user("(the conversation continues)", _CONTINUES))
            return session.prepare_request()

    def commit(self, reply: Message, usage: Any = None) -> Message:
        """Commit the model's reply to the prepared request; returns the committed message."""
        with self._lock:
            session = self.session
            committed = session.commit_reply(reply, usage=usage)
            self._index.update(session)
            self._index.alias(reply, self._index.replies[-1])
            return committed

    def abandon(self, reason: str = "error") -> None:
        """Close the step :meth:`prepare` opened when its model call raised (no reply to commit),
        so the log holds no half step; the next :meth:`prepare` starts a new one."""
        with self._lock:
            session = self.session
            if session.step_open and not session.surface.pending_calls:
                session.abandon_step(reason)

    def call_ids(self) -> CallIds:
        """The ids a reply's tool calls may take: none the session holds already, none twice in
        one reply (:class:`ctxkernel.pairing.CallIds`), nor one the log holds (a call the
        surface no longer shows). An adapter that commits the reply itself renames a reused one
        before it hands the reply back to the framework, so the framework's tool results answer
        the new id; a reply committed from the framework's history is renamed by
        :func:`reconcile` in the same way."""
        with self._lock:
            session = self.session
            return CallIds(session.surface.call_owner, self._index.update(session).call_owner)

    # -- strategy tools -------------------------------------------------------------------------------
    def owns_tool(self, name: str) -> bool:
        return self.session.owns_tool(name)

    def run_tool(self, call_id: str, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Run a strategy tool for the framework's tool executor. The outcome is kept until the
        framework shows its result in the history, then committed as the tool's own outcome."""
        with self._lock:
            session = self.session
            if not isinstance(arguments, dict):
                arguments = {"_value": arguments}
            # a reused id the log renamed when it took the reply from the framework's history
            logged = self._index.framework_ids.get(call_id)
            if logged is not None and logged in session.surface.pending_calls:
                call_id = logged
            outcome = session.run_tool(ToolCallBlock(call_id, name, arguments))
            if outcome.continue_in:
                # a child session (chapters_continue) is not followed through a framework's history
                outcome = ToolOutcome(
                    f"{outcome.content}\n(note: this framework adapter stays in session {session.id}; "
                    f"the continuation {outcome.continue_in} is not followed)",
                    is_error=outcome.is_error,
                    conclude_turn=outcome.conclude_turn,
                    defer_message=outcome.defer_message,
                )
            self._outcomes[call_id] = outcome
            return outcome

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The strategy tools' schemas for this session (what ``prepare`` adds to a request)."""
        session = self.session
        session.owns_tool("")
        return [dict(s) for s in session.tools.schemas()]


__all__ = ["IntegrationError", "ManagedSession", "open_kernel", "strategy_tool_schemas"]
