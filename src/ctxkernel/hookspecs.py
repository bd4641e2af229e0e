"""The plugin contract: every hook a strategy can implement.

This is the only module that defines hooks. Strategies implement them with
``@ctxkernel.hookimpl`` on a module or an object that their entry point (group
``ctxkernel.strategies``) names. The kernel calls them through the typed facade in
:mod:`ctxkernel.plugins`, never through ``pm.hook`` directly.

Every hook about one session receives ``ctx``, a :class:`ctxkernel.Context`: the session as
strategies see it (read-only views of the log, the surface and the meter; pressure, the route,
the request header). One hook call passes the same ``ctx`` to every implementation; each
strategy acts through its own handle, ``STRATEGY.on(ctx)`` (a :class:`ctxkernel.StrategyHandle`:
settings, state, storage, compaction, reminders, notes and history, signed with its name). The
Session itself is the integrator's object and never reaches a strategy.

Call order: implementations run in the order the profile lists the strategies (the kernel
registers them so that pluggy's last-registered-first rule yields profile order);
``tryfirst``/``trylast`` move an implementation within that order. The built-in ``basic``
strategy's fallbacks are ``trylast`` so an installed strategy wins.

Lifecycle of one model request::

    session.prepare_request()
      ├─ pre_step(ctx, step)                 may compact, switch windows, queue reminders
      ├─ [step/start, request/header, request/context written when changed]
      ├─ decorate_request(ctx, request)      presentation only, counted by the meter
    harness calls the model with request.messages / request.tools
    session.commit_reply(reply, usage)
      ├─ sanitize_reply(ctx, reply)          clean the reply before it is written
      └─ [assistant/message written]
    (a provider error) session.request_failed(error)
      └─ request_error(ctx, error)           first non-None wins: retry after shrinking?
    after any compaction, switch or archive commits:
      └─ commit(ctx, result)

Around the requests: ``session_opened`` when a session is created or resumed (from its snapshot
plus the tail of its log), ``snapshot_state`` whenever the session writes a snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    from .context import Context, ReplyDraft, Request, StepContext
    from .errors import ModelError
    from .profile import Profile
    from .report import ValidationReport
    from .spans import CommitResult, ManualCompaction, ManualOutcome, Region, Summary
    from .spec import StrategySnapshot, StrategySpec
    from .tools import Tool

PROJECT = "ctxkernel"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_strategy(register: Callable[[StrategySpec], None]) -> None:
    """Declare the strategy this plugin provides.

    Called once when the plugin is loaded, before any session exists.

    :param register: call it with a :class:`ctxkernel.StrategySpec` giving the strategy's
        name (must equal its entry-point name), its settings model (a pydantic model whose
        config forbids unknown keys) and the capabilities it claims (``pressure``,
        ``overflow``, ``decoration``, ...). A name registered twice is an error naming both
        distributions.
    """


@hookspec
def session_opened(ctx: Context) -> None:
    """A session was created or resumed, after its log was replayed.

    Build per-session state here (in the handle's ``STRATEGY.on(ctx).state``), from the log
    alone, so that a restart or a second process gets the same state.

    :param ctx: the opened session; ``ctx.events`` holds its whole log (opened from a snapshot,
        the events before it are read from the store on first use: a hook that folds the whole
        log here makes every open cost the history again). Take the state this strategy put into
        the snapshot with ``STRATEGY.on(ctx).restored(version=..., load=...)`` (see
        :func:`snapshot_state`) and fold only the events after it; None means fold the whole log.
    """


@hookspec
def snapshot_state(ctx: Context) -> StrategySnapshot | None:
    """The strategy's folded state, to be written into the session's snapshot.

    Called whenever the session writes a snapshot (at each compaction commit and every ``[store]
    snapshot_every`` events), after the events it covers are durable and folded into the surface,
    on every loaded strategy. Bring the state up to the end of ``ctx.events`` first, then
    return ``STRATEGY.on(ctx).snapshot(data, version=N)``; the next open hands ``data`` back
    through ``StrategyHandle.restored`` instead of folding the log from the start.

    ``data`` must be plain JSON (sets as sorted lists, int keys as strings) and hold only what the
    fold of the log derives: restored and folded on over the tail, it must equal what a full fold
    of the same log builds (``ctxkernel.testing.check_snapshot_equivalence`` checks exactly
    that). This process's own transient state (a pending request, caches, retry counters not in
    the log) stays out. Bump ``version`` whenever the shape of ``data`` changes: a part of another
    version is set aside and the strategy folds the whole log once. Do not append events here.

    :param ctx: the session writing the snapshot.
    :return: a :class:`ctxkernel.StrategySnapshot`, or None to leave the strategy out (it then
        folds the whole log on open). A result that is not plain JSON is left out with a warning.
    """


@hookspec
def register_tools(register: Callable[[Tool], None], ctx: Context) -> None:
    """Contribute model-callable tools to a session.

    Called when a session opens and again whenever the set of enabled strategies changes
    (the registry is rebuilt, so a re-enabled strategy has exactly one of each tool). A strategy
    that offers tools only once they have something to do registers them all while
    ``ctx.header_in_full`` is True: the header guard weighs that header before the first request.

    :param register: call it with a :class:`ctxkernel.Tool` (``STRATEGY.tool(...)``); a name another
        strategy already registered raises :class:`ctxkernel.PluginConflictError` naming both. A
        tool's handler is called as ``handler(ctx, args)`` with the same kind of ``ctx``.
    :param ctx: the session the tools are for.
    """


@hookspec
def system_prompt(ctx: Context) -> str | None:
    """Contribute a section to the system prompt (the strategy's instructions to the model).

    Sections follow the profile's own ``system_prompt`` in profile order. The composed prompt is
    part of the recorded ``request/header`` and is counted by the meter.

    :return: the section text, or None for no section.
    """


@hookspec
def pre_step(ctx: Context, step: StepContext) -> None:
    """Before each model request, between steps: the place to manage context.

    Runs before ``step/start`` is written. An implementation may open a compaction
    transaction (``STRATEGY.on(ctx).compact(...)``), switch windows, or queue a reminder with
    ``STRATEGY.on(ctx).remind(step, text)``. It never runs in the middle of a tool batch: every
    result of the previous batch is committed when it is called.

    :param ctx: the session; ``ctx.pressure()`` is current.
    :param step: the step about to start (``turn``, ``step``, ``first_of_turn``, ``attempt``).
    """


@hookspec
def decorate_request(ctx: Context, request: Request) -> None:
    """Decorate the composed request for presentation only (e.g. position anchors).

    Change messages only through ``request.decorate(index, message)``: the durable log is
    never touched, and the meter counts each decorated message exactly as sent.

    :param ctx: the session.
    :param request: the request about to be returned to the harness.
    """


@hookspec(firstresult=True)
def summarize(ctx: Context, region: Region) -> Summary | None:
    """Write the summary that will replace ``region``.

    Stops at the first non-None result. The built-in ``basic`` strategy's implementation is
    ``trylast``: with a summarizer model configured it asks the model (the eight-section
    directive after the replayed prefix), otherwise it builds a deterministic extractive
    summary from the log.

    :param ctx: the session.
    :param region: the nodes to summarise, their seqs and token count.
    :return: a :class:`ctxkernel.Summary`, or None to let the next implementation answer.
    """


@hookspec
def sanitize_reply(ctx: Context, reply: ReplyDraft) -> None:
    """Clean a model reply before it is committed to the log.

    Set ``reply.message`` to a cleaned copy (e.g. strip anchors the model copied). Tool call ids
    and order must not change. Implementations run in profile order, each seeing the previous
    one's result.
    """


@hookspec(firstresult=True)
def request_error(ctx: Context, error: ModelError) -> bool | None:
    """React to a provider error for the last prepared request.

    Stops at the first non-None result. Typical use: on
    :class:`ctxkernel.ContextOverflowError`, compact and return True so the harness retries
    after the surface actually shrank. Return False to say "handled, do not retry", None to
    pass. When no result asks for a retry on a context overflow, the kernel's fallback
    (:func:`ctxkernel.guard.shrink_to_fit`) excerpts the largest messages and asks for it itself
    when that saved something.

    :return: True to ask for a retry, False to give up, None to let others decide.
    """


@hookspec
def commit(ctx: Context, result: CommitResult) -> None:
    """A compaction, window switch or archive has durably committed.

    Called once per committed transaction, after its last event is written. Failed
    transactions are not reported here.

    :param result: what committed: ``kind``, ``strategy``, replaced seqs, tokens before and
        after, the replacement's seq.
    """


@hookspec(firstresult=True)
def compact_now(ctx: Context, request: ManualCompaction) -> ManualOutcome | None:
    """A person asked to compact this session now (``ctxkernel compact``, the inspector's button,
    :meth:`Session.compact_now`).

    Stops at the first non-None result, in profile order; the built-in ``basic`` strategy's
    implementation (summarise the head) is ``trylast``. Each strategy acts in its own terms: a
    window switch, a continuation, a checkpoint. Called between steps only (the kernel refuses the
    request with :class:`ctxkernel.SessionBusyError` mid-step) and only for strategies enabled in
    this session.

    :param request: ``action`` (one of :data:`ctxkernel.MANUAL_ACTIONS`: ``compact``, or
        ``archive``) and ``by`` (who asked: ``api``, ``cli``, ``ui``).
    :return: a :class:`ctxkernel.ManualOutcome` (``committed`` False with the reason when there
        was nothing to do), or None when the strategy does not handle ``request.action``.
    """


@hookspec
def project(ctx: Context) -> dict[str, Any] | None:
    """Contribute status for ``ctxkernel inspect`` and reports.

    :return: a JSON-serialisable dict shown under the strategy's name, or None.
    """


@hookspec
def export_files(ctx: Context) -> dict[str, bytes] | None:
    """The strategy's persisted files for ``ctxkernel export``, laid out as the seeds lay them out.

    Strategies keep their files in the store (the handle's ``blobs``); export writes them out for
    people. Return ``{relative path: bytes}`` (paths such as ``chapters/<root>/chapters/001-x.md``
    or ``decay/audit.jsonl``: '/'-separated parts of letters, digits, '.', '_' and '-'), or None.
    The export refuses any other path, a path two strategies both claim, and a file whose bytes
    do not read back with the same sha256.
    """


@hookspec
def steward_actions(ctx: Context, request: Request) -> list[dict[str, Any]] | None:
    """In open-loop simulation, the context-management tool calls a model would make now.

    ``ctxkernel simulate`` replays recorded assistant turns, which never call a strategy's
    tools. Before each replayed request it asks every strategy for the calls a deterministic
    steward would make (write a note, ``compress`` when reminded, ``new_context``,
    ``chapters_continue``...). Each call is ``{"name": tool, "arguments": {...}}``; the
    simulator runs them as a separate model step with the strategy's own tools. The default
    policy is the strategy's; ``--steward`` replaces it.

    :param request: the request just prepared (reminders and pressure are visible in it).
    :return: tool calls to run before the recorded reply, or None.
    """


@hookspec
def register_commands(subparsers: Any) -> None:
    """Add subcommands to the ``ctxkernel`` command line.

    Called once when ``ctxkernel`` builds its parser, on every installed strategy (not only a
    profile's), after the kernel's own commands. Add a parser with
    ``subparsers.add_parser(name, help=...)`` and set ``func`` (``set_defaults(func=...)``) to a
    callable taking the parsed arguments and returning the exit status. A strategy that fails to
    load is named on stderr and the other commands still work.

    :param subparsers: the ``argparse`` subparsers action of the ``ctxkernel`` parser.
    """


@hookspec
def validate_profile(profile: Profile, report: ValidationReport) -> None:
    """Strategy-specific preflight checks of a profile that names this strategy.

    Add results with ``report.ok(...)``, ``report.warn(...)`` and ``report.fail(...)``
    (each takes a check name, the strategy and a message naming the fix).
    """
