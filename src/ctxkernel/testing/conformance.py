"""The strategy conformance suite: the kernel's invariants, checked against any strategy.

One call runs a long scripted session with large tool outputs through a profile and checks:

- replay determinism and restart equivalence (surface, pressure and every strategy's panel are
  the same when the session is reopened by a new kernel, at several points of the session, both
  from its snapshot and by a full replay of its log);
- no orphan tool call or result in any request the harness would send;
- durable events are never mutated (what was appended is what the store returns at the end);
- every tool refusal leaves the log byte-identical;
- the effective window is never exceeded when a strategy claims the ``pressure`` capability;
- every strategy's settings reject unknown keys.

Strategy authors call :func:`check_conformance` from one test (see docs/testing-a-strategy.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from ..context import Context
from ..exits import one_line
from ..kernel import Kernel
from ..messages import Message, ToolCallBlock
from ..pairing import pairing_problems
from ..profile import ModelSettings, Profile, StoreSettings, builtin_profile
from ..session import Request, Session
from ..settings_check import format_validation_error
from ..snapshot import LazyEvents, strategy_parts
from ..store.base import EventStore
from ..store.jsonl import JsonlStore
from .kit import check_strategy_names


class ConformanceError(AssertionError):
    """A strategy broke a kernel invariant; the message names the check and the evidence."""


@dataclass(frozen=True)
class ConformanceStep:
    """Where the scripted session is when ``check_conformance`` asks for the model's tool calls:
    the session (the suite plays the harness), the request about to be answered, the turn (from 0)
    and how many replies the model has already given in this turn. ``ctx`` is what the
    strategies' hooks receive, for a callback that reads the strategy's own state."""

    session: Session
    request: Request
    turn: int
    step: int

    @property
    def ctx(self) -> Context:
        """The session's context, as the strategies' hooks and tool handlers receive it."""
        return self.session.context


@dataclass
class ConformanceReport:
    strategies: list[str]
    requests: int = 0
    events: int = 0
    compactions: int = 0
    peak_prompt_tokens: int = 0
    effective_window: int = 0
    restarts_checked: int = 0
    #: restarts that opened from a snapshot (the rest of ``restarts_checked`` replayed the log)
    snapshot_restarts: int = 0
    refusals_checked: int = 0
    #: the scripted strategy tool calls (``tool_calls=``) that ran and succeeded
    tool_calls_checked: int = 0
    checks: list[str] = field(default_factory=list)


#: a turn of the scripted workload takes at most 5 replies; far more means a loop
_MAX_REPLIES_PER_TURN = 64


def request_orphans(request: Request) -> list[str]:
    """Tool calls without their results, or results without their call, in one request."""
    problems = []
    for problem in pairing_problems(request.messages):
        if problem.kind == "orphan_calls":
            where = "end of request" if problem.index == len(request.messages) else f"message {problem.index}"
            before = "" if problem.index == len(request.messages) else " before it"
            problems.append(f"{where}: calls {sorted(problem.call_ids)} have no results{before}")  # type: ignore[type-var]
        else:
            problems.append(f"message {problem.index}: tool result {problem.call_ids[0]} has no preceding call")
    return problems


def _workload_reply(rng: random.Random, step: int, turn_steps: int) -> Message:
    if step >= turn_steps:
        return Message.assistant(f"Done with this part. Step {step} finished; the tests pass now.")
    if rng.random() < 0.25:
        calls = [
            ToolCallBlock(f"t{rng.getrandbits(48):x}", "read_file", {"path": f"src/module_{rng.randrange(40)}.py"}),
            ToolCallBlock(f"t{rng.getrandbits(48):x}", "run_tests", {"command": "pytest -q"}),
        ]
    else:
        name = rng.choice(["read_file", "run_tests", "grep"])
        args = {
            "read_file": {"path": f"src/module_{rng.randrange(40)}.py"},
            "run_tests": {"command": "pytest -x"},
            "grep": {"pattern": "def "},
        }[name]
        calls = [ToolCallBlock(f"t{rng.getrandbits(48):x}", name, args)]
    return Message.assistant(f"Looking at step {step}.", calls)


def _harness_output(rng: random.Random, call: ToolCallBlock) -> str:
    lines = rng.randrange(40, 400)
    if call.name == "run_tests":
        body = "\n".join(f"tests/test_{i}.py::test_case_{j} PASSED" for i in range(lines // 10) for j in range(10))
        return body + ("\nFAILED tests/test_core.py::test_edge - AssertionError: 1 != 2" if rng.random() < 0.3 else "")
    return "\n".join(f"{i:4d}    value_{i} = compute(value_{i - 1}, {rng.randrange(1000)})" for i in range(lines))


def _log_bytes(session: Session) -> bytes:
    store = session.store
    if isinstance(store, JsonlStore):
        return store.path(session.id).read_bytes()
    return orjson.dumps([e.to_dict() for e in store.read(session.id)])


def _snapshot(session: Session) -> dict[str, Any]:
    return {
        "surface": [(n.seq, n.message.to_dict()) for n in session.surface.nodes],
        "pressure": session.pressure().to_dict(),
        "panels": orjson.loads(orjson.dumps(session.kernel.hooks.project(session), default=str)),
        # what each strategy puts into a snapshot: derived from the log alone, so the same however
        # the session was opened
        "strategy_states": strategy_parts(session, set(session.kernel.strategies)),
    }


@dataclass(frozen=True)
class SnapshotCut:
    """One case :func:`check_snapshot_equivalence` checked: a snapshot after ``cut`` events, the
    log run on to ``end``, and how many events before the snapshot the open read from the store
    (0: the open cost the snapshot and the tail only)."""

    cut: int
    end: int
    loaded_before_snapshot: int


def check_snapshot_equivalence(
    new_kernel: Callable[[bool], Kernel], session_id: str, cuts: Iterable[tuple[int, int]]
) -> list[SnapshotCut]:
    """Opening from a snapshot is the same session as a full replay, strategy state included.

    ``new_kernel(snapshots)`` builds a new kernel (a new store object: nothing cached) on the
    store holding session ``session_id``, with ``[store] snapshot_every`` on (True) or 0 (False).
    For each ``(cut, end)`` (``0 < cut <= end <=`` the log's length) a copy of the session's first
    ``cut`` events is opened by a full replay and writes a snapshot; events ``cut..end`` are then
    appended to the copy as they are, and the copy is opened by one new kernel from that snapshot
    and by another replaying the whole log. The two must agree on the surface, pressure, every
    strategy's panel (``project``) and every strategy's ``snapshot_state``, and every strategy that
    put state into the snapshot must have taken it back (``StrategyHandle.restored``).

    Raises :class:`ConformanceError` naming the cut and what differs; returns what was checked.
    """
    source = new_kernel(False).store
    header = source.header(session_id)
    events = list(source.read(session_id))
    checked = []
    for number, (cut, end) in enumerate(cuts):
        if not 0 < cut <= end <= len(events):
            msg = f"cut {cut}..{end}: need 0 < cut <= end <= {len(events)} (the session's length)"
            raise ValueError(msg)
        copy = f"{session_id[:80]}-{number}-cut{cut}-{end}"
        writer = new_kernel(True)
        writer.store.create(replace(header, id=copy))
        writer.store.append(copy, events[:cut], 0)
        writer.open_session(copy, repair=False).write_snapshot()
        if writer.store.snapshot_get(copy) is None:
            msg = f"cut {cut}: the copy wrote no snapshot (is [store] snapshot_every 0 in new_kernel(True)?)"
            raise ConformanceError(msg)
        if end > cut:
            writer.store.append(copy, events[cut:end], cut)
        restored = new_kernel(True).open_session(copy, repair=False)
        if not isinstance(restored.events, LazyEvents):
            msg = f"cut {cut}..{end}: the copy did not open from its snapshot (the snapshot was set aside)"
            raise ConformanceError(msg)
        left = sorted(restored.snapshot_states)
        loaded = restored.events.loaded
        replayed = new_kernel(False).open_session(copy, repair=False)
        if left:
            msg = f"cut {cut}..{end}: strategies {left} put state into the snapshot but did not take it back on open"
            raise ConformanceError(msg)
        got, want = _snapshot(restored), _snapshot(replayed)
        if got != want:
            diff = [k for k in want if got[k] != want[k]]
            detail = ""
            if "strategy_states" in diff:
                names = sorted(set(got["strategy_states"]) | set(want["strategy_states"]))
                bad = [n for n in names if got["strategy_states"].get(n) != want["strategy_states"].get(n)]
                detail = f" (strategy state of {bad})"
            msg = f"cut {cut}..{end}: opening from the snapshot differs from a full replay in {diff}{detail}"
            raise ConformanceError(msg)
        checked.append(SnapshotCut(cut, end, loaded))
    return checked


def _checked_arguments(base: Profile, turns: int, **model_and_store: int) -> tuple[ModelSettings, StoreSettings]:
    """The suite's own arguments, refused (ValueError) when they would check nothing or build a
    kernel no profile could: ``turns`` at least 1, the window and ``snapshot_every`` validated as
    in a profile file."""
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        msg = f"check_conformance(turns={turns!r}): accepted: a whole number of turns, at least 1"
        raise ValueError(msg)
    snapshot_every = model_and_store.pop("snapshot_every")
    where = f"check_conformance({', '.join(f'{k}={v!r}' for k, v in model_and_store.items())}, snapshot_every={snapshot_every!r})"
    try:
        model = ModelSettings.model_validate(base.model.model_dump() | model_and_store)
    except ValidationError as exc:
        raise ValueError(one_line(format_validation_error(exc, where, ModelSettings, "model"))) from None
    try:
        store = StoreSettings.model_validate(base.store.model_dump() | {"snapshot_every": snapshot_every})
    except ValidationError as exc:
        raise ValueError(one_line(format_validation_error(exc, where, StoreSettings, "store"))) from None
    return model, store


# over the complexity cap: the suite's invariants checked in the order a session meets them,
# each with its own clear error
def check_conformance(  # noqa: C901
    home: str | Path,
    strategies: list[str],
    *,
    settings: dict[str, dict[str, Any]] | None = None,
    profile: Profile | None = None,
    plugins: list[tuple[str, Any]] | None = None,
    entry_points: bool = True,
    turns: int = 30,
    context_window: int = 24_000,
    reserved_output_tokens: int = 2_000,
    seed: int = 7,
    tool_calls: Callable[[ConformanceStep], list[dict[str, Any]] | None] | None = None,
    store_factory: Callable[[], EventStore] | None = None,
    snapshot_every: int = 40,
) -> ConformanceReport:
    """Run the suite; raise :class:`ConformanceError` on the first broken invariant.

    ``tool_calls`` scripts the model's calls of strategy tools: called before each request with a
    :class:`ConformanceStep`, it returns ``[{"name": tool, "arguments": {...}}, ...]`` for the
    model to call now (or ``None``). Each scripted call must name a strategy tool and succeed, so
    the tool's success path runs under every invariant (restarts included).

    ``store_factory`` opens a new store object on the same storage for each kernel (default: a
    jsonl store in ``home``); ``snapshot_every`` is the session's ``[store] snapshot_every``
    (small, so that restarts open from a snapshot with a tail to replay)."""
    home = Path(home)
    check_strategy_names(strategies, "check_conformance")
    base = profile if profile is not None else builtin_profile()
    model, store_settings = _checked_arguments(
        base,
        turns,
        context_window=context_window,
        reserved_output_tokens=reserved_output_tokens,
        snapshot_every=snapshot_every,
    )

    def new_kernel(snapshots: int = snapshot_every) -> Kernel:
        prof = base.model_copy(deep=True)
        prof.profile.strategies = list(strategies)
        prof.strategies = dict(settings or {})
        prof.model = model.model_copy()
        prof.store = store_settings.model_copy(update={"snapshot_every": snapshots})  # 0 or the checked value
        store = store_factory() if store_factory is not None else JsonlStore(home)
        return Kernel(prof, store=store, home=home, entry_points=entry_points, plugins=plugins)

    kernel = new_kernel()
    report = ConformanceReport(list(strategies))
    for name in strategies:
        spec = kernel.strategies[name]
        try:
            spec.settings.model_validate({"__conformance_unknown_key__": 1})
        except ValidationError:
            pass
        else:
            msg = f"settings: strategy {name!r} accepted an unknown key; its settings model must forbid extra keys"
            raise ConformanceError(msg)
    report.checks.append("settings reject unknown keys")
    guards_window = any("pressure" in kernel.strategies[n].capabilities for n in strategies)

    rng = random.Random(seed)
    session = kernel.open_session()
    session.set_harness_tools(
        [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": f"harness tool {n}",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
            for n in ("read_file", "run_tests", "grep")
        ]
    )
    appended: list[dict[str, Any]] = []
    restart_points = {turns // 3, (2 * turns) // 3, turns - 1}

    def check_request(request: Request) -> None:
        report.requests += 1
        problems = request_orphans(request)
        if problems:
            msg = f"pairing: request {report.requests} of session {session.id}: " + "; ".join(problems[:5])
            raise ConformanceError(msg)
        report.peak_prompt_tokens = max(report.peak_prompt_tokens, request.pressure.tokens)
        report.effective_window = request.pressure.effective_window
        if guards_window and request.pressure.tokens > request.pressure.effective_window:
            msg = (
                f"window: request {report.requests} needs {request.pressure.tokens} tokens, over the effective "
                f"window of {request.pressure.effective_window}, although {strategies} claim the pressure capability"
            )
            raise ConformanceError(msg)

    def check_refusals() -> None:
        for tool in list(session.tools):
            before = _log_bytes(session)
            outcome = session.run_tool(
                ToolCallBlock("conformance-probe", tool.name, {"__conformance_unknown_argument__": True})
            )
            if not outcome.is_error:
                msg = f"refusal: tool {tool.name!r} accepted an unknown argument"
                raise ConformanceError(msg)
            if _log_bytes(session) != before:
                msg = f"refusal: tool {tool.name!r} changed the log while refusing bad arguments"
                raise ConformanceError(msg)
            report.refusals_checked += 1

    def scripted_calls(request: Request, turn: int, replies: int) -> list[ToolCallBlock]:
        if tool_calls is None:
            return []
        asked = tool_calls(ConformanceStep(session, request, turn, replies)) or []
        calls = []
        for item in asked:
            name = item.get("name") if isinstance(item, dict) else None
            arguments = item.get("arguments", {}) if isinstance(item, dict) else None
            if not isinstance(name, str) or not isinstance(arguments, dict) or not session.owns_tool(name):
                owned = sorted(t.name for t in session.tools)
                msg = (
                    f"tool_calls: turn {turn} step {replies} asks for {item!r:.200}; each scripted call is "
                    f'{{"name": <a strategy tool>, "arguments": {{...}}}} and the strategy tools are {owned}'
                )
                raise ConformanceError(msg)
            calls.append(ToolCallBlock(f"m{rng.getrandbits(48):x}", name, dict(arguments)))
        return calls

    for turn in range(turns):
        session.user(f"Task {turn}: fix the failing case in module_{turn % 40}.py and keep the tests green.")
        turn_steps = rng.randrange(2, 6)
        step = 0
        replies = 0
        while True:
            request = session.prepare_request()
            check_request(request)
            scripted = scripted_calls(request, turn, replies)
            replies += 1
            if replies > _MAX_REPLIES_PER_TURN:
                msg = (
                    f"steps: turn {turn} reached {_MAX_REPLIES_PER_TURN} model replies; the scripted tool calls or "
                    "steward_actions never let it finish (return calls for one step, not for every step)"
                )
                raise ConformanceError(msg)
            steward = None if scripted else session.kernel.hooks.steward_actions(session, request)
            if scripted:
                reply = Message.assistant("Calling a strategy tool.", scripted)
            elif steward:
                calls = [ToolCallBlock(f"s{rng.getrandbits(48):x}", c["name"], c.get("arguments", {})) for c in steward]
                reply = Message.assistant("Managing context.", calls)
            else:
                reply = _workload_reply(rng, step, turn_steps)
                step += 1
            session.commit_reply(reply)
            for call in session.pending_calls:
                if session.owns_tool(call.name):
                    outcome = session.run_tool(call)
                    if call.id in {c.id for c in scripted}:
                        if outcome.is_error:
                            msg = (
                                f"tool_calls: {call.name}({orjson.dumps(call.arguments).decode():.200}) at turn {turn} "
                                f"failed: {outcome.content[:300]}"
                            )
                            raise ConformanceError(msg)
                        report.tool_calls_checked += 1
                    session.tool_result(call.id, outcome)
                else:
                    session.tool_result(call.id, _harness_output(rng, call))
            if not session.wants_another_step:
                break
        session.end_turn()
        appended = [e.to_dict() for e in session.events]
        if turn == 0:
            check_refusals()
        if turn in restart_points:
            live = _snapshot(session)
            # from the newest snapshot plus the tail, then by replaying the whole log
            for snapshots, how in ((snapshot_every, "from its snapshot"), (0, "by a full replay")):
                reopened = new_kernel(snapshots).open_session(session.id)
                again = _snapshot(reopened)
                if live != again:
                    diff = [k for k in live if live[k] != again[k]]
                    msg = f"restart: reopening session {session.id} {how} after turn {turn} differs in {diff}"
                    raise ConformanceError(msg)
                report.restarts_checked += 1
                report.snapshot_restarts += isinstance(reopened.events, LazyEvents)
    check_refusals()
    report.checks += ["pairing in every request", "restart equivalence", "tool refusals leave the log byte-identical"]
    if report.tool_calls_checked:
        report.checks.append("scripted strategy tool calls succeed")
    stored = [e.to_dict() for e in session.store.read(session.id)]
    if stored[: len(appended)] != appended:
        first = next(i for i, (a, b) in enumerate(zip(stored, appended, strict=False)) if a != b)
        msg = f"immutability: event {first} of session {session.id} changed after it was appended"
        raise ConformanceError(msg)
    report.checks.append("durable events never mutated")
    if guards_window:
        report.checks.append("effective window never exceeded")
    report.events = len(session.events)
    report.compactions = sum(1 for e in session.events if e.type == "compaction/summary")
    return report
