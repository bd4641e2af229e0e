"""Open-loop replay of a recording through one profile, and the metrics it yields.

The recording drives a kernel session through the public Session API exactly as a harness would:

* a user message → ``session.user`` (the previous turn is ended first when the model had finished);
* before each recorded model request → ``session.prepare_request`` (the profile's strategies run);
  the steward (:mod:`.steward`) may first take a separate model step of context-management tool
  calls, whose results come from ``session.run_tool``;
* if the prepared prompt exceeds the effective window, the simulated provider refuses it:
  ``session.request_failed(ContextOverflowError)``, and a retry when the strategies ask for one;
* the recorded reply → ``session.commit_reply``, with usage as the simulated provider counts it;
* recorded tool results → ``session.tool_result``; a call the recording never answered gets a
  synthetic error result before the next request, as a harness does for a call that never ran.

The assistant turns are replayed, not regenerated: the model's words and tool calls are those of
the recording whatever the strategy showed it. What the comparison measures is what each strategy
would have sent, kept, billed and broken, not how a model would have behaved with it.

A tool outcome with ``continue_in`` (e.g. ``chapters_continue``) moves the replay into that child
session of the same store: later requests are prepared there.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ContextOverflowError, ProfileError, RequestTooLargeError
from ..events import COMPACTION_END, COMPACTION_PRUNE, COMPACTION_SUMMARY
from ..kernel import Kernel
from ..messages import Message, Source, ToolCallBlock
from ..models.base import Reply
from ..profile import Prices, Profile, SummarizerSettings, load_profile, override_window
from ..redact import redact
from ..session import Request, Session
from ..store.jsonl import JsonlStore
from ..text import extractive_summary
from ..tools import ToolOutcome
from . import probes, recall
from .checks import InvariantChecker
from .recording import AssistantItem, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem
from .steward import Steward, default_steward

#: the keys of one profile's metrics, in report order (pinned by tests and docs/simulate.md)
METRIC_KEYS: tuple[str, ...] = (
    "profile",
    "strategies",
    "status",
    "error",
    "requests",
    "recorded_requests",
    "steward_requests",
    "peak_prompt_tokens",
    "mean_prompt_tokens",
    "effective_window",
    "header_tokens",
    "overflows",
    "overflow_retries",
    "compactions",
    "compaction_failures",
    "summary_calls",
    "summary_input_tokens",
    "summary_output_tokens",
    "summarizer",
    "billed_input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost",
    "invariant_violations",
    "invariant_details",
    "instructions_visible",
    "history_recoverable",
    "history_recoverable_declared",
    "recall_calls",
    "recall_tokens",
    "recall_method",
    "recall_probed",
    "probes",
    "synthetic_results",
    "sessions",
    "session_ids",
    "steward_errors",
    "prompt_tokens",
    "wall_seconds",
)

#: the smallest context window a simulation runs with
MIN_WINDOW = 256
#: the built-in pseudo-profile with no strategy (a baseline row; not part of ``all``)
UNMANAGED = "none"
#: a strategy claiming one of these capabilities gives the model tools that read hidden history back
RECALL_CAPABILITIES = frozenset({"recall", "history"})
_STEWARD_SOURCE = Source(kind="model", provider="simulate", model="steward")
_MAX_STEWARD_ROUNDS = 3
_MAX_OVERFLOW_RETRIES = 3


@dataclass
class Options:
    """How to run a comparison (the ``ctxkernel simulate`` flags)."""

    window: int | None = None
    #: ``--window 0.5x``: each recording's window is this share of its own unmanaged peak
    window_share: float | None = None
    summarizer: str = "extractive"
    steward: Steward = default_steward
    prices: Prices | None = None
    workdir: Path | None = None
    #: keep the replayed sessions in a jsonl store (the kernel home) at this folder
    keep_sessions: Path | None = None
    progress: Callable[[str, int, int], None] | None = None


# -- summarizers ---------------------------------------------------------------------------------------
class ExtractiveModel:
    """An offline stand-in for a summarizer model (``--summarizer scripted``): it answers with the
    deterministic extractive summary and reports usage as a provider would, so that the model
    path (summary calls, their tokens and cost) is exercised with no network."""

    provider = "simulate"
    model = "extractive-model"

    def __init__(self, meter: Any) -> None:
        self._meter = meter

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        text = extractive_summary(messages[:-1], max_chars=6000)
        prompt = self._meter.count_header(system, tools or []) + sum(self._meter.count_message(m) for m in messages)
        reply = Message.assistant(text, source=Source(kind="model", provider=self.provider, model=self.model))
        usage = {"input_tokens": prompt, "output_tokens": self._meter.count_message(reply), "cached_input_tokens": 0}
        return Reply(reply, usage, self.provider, self.model)


class CountingModel:
    """Wraps the profile's summarizer so every call and its tokens are counted."""

    def __init__(self, inner: Any, meter: Any) -> None:
        self.inner = inner
        self.provider = getattr(inner, "provider", "")
        self.model = getattr(inner, "model", "")
        self._meter = meter
        self.calls = 0
        self.input_tokens = 0
        self.output_tokens = 0

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        reply = self.inner.complete(messages, system=system, tools=tools)
        usage = reply.usage or {}
        self.calls += 1
        self.input_tokens += usage.get("input_tokens") or (
            self._meter.count_header(system, tools or []) + sum(self._meter.count_message(m) for m in messages)
        )
        self.output_tokens += usage.get("output_tokens") or self._meter.count_message(reply.message)
        return reply


def summarizer_settings(spec: str) -> SummarizerSettings | None:
    """``extractive`` (None), ``scripted``, or ``openai:<model>[@<base_url>]``."""
    if spec in ("", "extractive", "scripted"):
        return None
    kind, _, rest = spec.partition(":")
    if kind != "openai" or not rest:
        msg = f"--summarizer {spec!r}: expected 'extractive', 'scripted' or 'openai:<model>[@<base_url>]'"
        raise RecordingError(msg)
    model, _, base_url = rest.partition("@")
    return SummarizerSettings(kind="openai", model=model, base_url=base_url or None)


# -- profiles ------------------------------------------------------------------------------------------
def prepare_profile(name: str, recording: Recording, options: Options, home: Path) -> Profile:
    """The profile as the simulation runs it: window override, the recording's system prompt,
    a private store, and the chosen summarizer (extractive unless asked: offline by default)."""
    if name == UNMANAGED:
        # basic's model settings and no strategy: what the session needs when nothing manages it
        profile = load_profile("basic")
        profile.profile.strategies = []
        profile.strategies = {}
        for policy in profile.model_policies:
            policy.strategies = {}
    else:
        profile = load_profile(name)
    if options.window is not None:
        override_window(profile, options.window)
    if recording.system:
        profile.profile.system_prompt = recording.system
    profile.store = profile.store.model_copy(update={"backend": "jsonl", "path": str(home), "dsn": None})
    settings = summarizer_settings(options.summarizer)
    profile.summarizer = settings or SummarizerSettings()
    return profile


# -- the replay ------------------------------------------------------------------------------------------
@dataclass
class _Counters:
    prompt_tokens: list[int] = field(default_factory=list)
    cached: int = 0
    output: int = 0
    overflows: int = 0
    overflow_retries: int = 0
    steward_requests: int = 0
    recorded_requests: int = 0
    steward_errors: int = 0
    synthetic_results: int = 0
    header_tokens: int = 0


class Replay:
    """One recording through one kernel (one profile)."""

    def __init__(self, kernel: Kernel, recording: Recording, options: Options, label: str = "") -> None:
        self.kernel = kernel
        self.recording = recording
        self.options = options
        self.label = label
        self.session: Session = kernel.open_session(origin="simulate")
        self.sessions: list[Session] = [self.session]
        self.checkers: dict[str, InvariantChecker] = {self.session.id: InvariantChecker(self.session.id)}
        self.counters = _Counters()
        self.instructions: list[str] = []
        self.originals: list[tuple[str, int]] = []  # (session id, seq) of every replayed message
        self.item_seqs: dict[int, tuple[str, int]] = {}  # recording item index -> where it was replayed
        self._last_was_final_reply = False
        self._previous: tuple[str, Any, list[Message], list[int]] | None = None
        self._header_tokens: dict[tuple[str, int], int] = {}
        self._last_system = ""
        self._call_no = 0

    # -- driving -------------------------------------------------------------------------------------
    def run(self) -> None:
        items = self.recording.items
        total = self.recording.requests
        done = 0
        for index, item in enumerate(items):
            replayed = len(self.originals)
            self._item(item)
            if isinstance(item, AssistantItem):
                done += 1
                if self.options.progress:
                    self.options.progress(self.label, done, total)
            if len(self.originals) > replayed:
                self.item_seqs[index] = self.originals[-1]
        self._close_pending()
        self.session.end_turn()

    def _item(self, item: Any) -> None:
        if isinstance(item, UserItem):
            self._user(item)
        elif isinstance(item, AssistantItem):
            self._assistant(item)
        elif isinstance(item, ToolResultItem):
            self._tool_result(item)
        elif isinstance(item, MarkerItem) and item.kind == "turn_end":
            self._close_pending()
            self.session.end_turn()

    def _user(self, item: UserItem) -> None:
        self._close_pending()
        session = self.session
        if session.turn_open and self._last_was_final_reply:
            session.end_turn()
        seq = session.user(item.text)
        self.originals.append((session.id, seq))
        if item.instruction:
            self.instructions.append(item.text)
        self._last_was_final_reply = False

    def _tool_result(self, item: ToolResultItem) -> None:
        session = self.session
        if item.call_id not in session.surface.pending_calls:
            return  # a result whose call the replay never committed (or already answered)
        seq = session.tool_result(item.call_id, ToolOutcome(item.content, is_error=item.is_error))
        self.originals.append((session.id, seq))

    def _close_pending(self) -> None:
        """Calls the recording never answered get an error result, as a harness does."""
        for call in list(self.session.pending_calls):
            self.session.tool_result(call.id, ToolOutcome("no result was recorded for this call", is_error=True))
            self.counters.synthetic_results += 1

    def _assistant(self, item: AssistantItem) -> None:
        self._close_pending()
        session = self.session
        if not session.turn_open:
            # a recording that starts with (or resumes on) the model still needs an open turn
            session.user(Message.user("(the recording continues)", Source.plugin_form("simulate", "notice")))
        request = self._prepare_with_steward()
        message = item.message
        if message.source.kind != "model":
            message = Message("assistant", message.content, Source(kind="model"))
        self.counters.recorded_requests += 1
        self._commit(self.session, message, request)
        self.originals.append((self.session.id, self.session.next_seq - (1 if message.tool_calls else 2)))
        self._last_was_final_reply = not message.tool_calls

    def _prepare_with_steward(self) -> Request:
        """Prepare the next request; first let the steward take its context-management steps."""
        for _ in range(_MAX_STEWARD_ROUNDS):
            request = self._prepare()
            calls = [
                c for c in (self.options.steward(self.session, request) or []) if isinstance(c, dict) and c.get("name")
            ]
            if not calls:
                return request
            session = self.session
            blocks = []
            for call in calls:
                self._call_no += 1
                blocks.append(
                    ToolCallBlock(f"steward_{self._call_no:05d}", str(call["name"]), dict(call.get("arguments") or {}))
                )
            self.counters.steward_requests += 1
            self._commit(session, Message("assistant", tuple(blocks), _STEWARD_SOURCE), request)
            child = None
            for block in blocks:
                if session.owns_tool(block.name):
                    outcome = session.run_tool(block)
                else:
                    outcome = ToolOutcome(
                        f"unknown tool {block.name!r}; kernel tools: {session.tools.names()}", is_error=True
                    )
                if outcome.is_error:
                    self.counters.steward_errors += 1
                session.tool_result(block.id, outcome)
                child = getattr(outcome, "continue_in", None) or child
            if child:
                self._follow(child)
        return self._prepare()

    def _follow(self, child_id: str) -> None:
        """Continue the replay in the child session a tool started (protocol: ToolOutcome.continue_in)."""
        parent = self.session
        parent.end_turn()
        child = self.kernel.open_session(child_id)
        self.session = child
        self.sessions.append(child)
        self.checkers[child.id] = InvariantChecker(child.id)
        if not child.turn_open:
            child.user(Message.user("(continuing in a new session)", Source.plugin_form("simulate", "notice")))

    def _prepare(self) -> Request:
        """Prepare a request; when it would not fit, report the overflow and retry as a harness does."""
        session = self.session
        try:
            request = session.prepare_request()
        except RequestTooLargeError:
            # the kernel's guard refused it (it could not be compacted to fit): a real harness
            # gets this error instead of the provider's; the recording goes on (open loop)
            self.counters.overflows += 1
            return session.prepare_request(allow_overflow=True)
        for attempt in range(1, _MAX_OVERFLOW_RETRIES + 1):
            tokens = self._prompt_tokens(session, request)
            window = request.pressure.effective_window
            if tokens <= window:
                return request
            self.checkers[session.id].check_request(session, request)  # refused, but still checked
            error = ContextOverflowError(
                f"simulated provider: prompt of {tokens} tokens exceeds the effective window of {window}",
                prompt_tokens=tokens,
                limit=window,
            )
            retry = session.request_failed(error)
            if not retry:
                break
            self.counters.overflow_retries += 1
            try:
                request = session.prepare_request(attempt=attempt)
            except RequestTooLargeError:
                break
        else:
            tokens = self._prompt_tokens(session, request)
            if tokens <= request.pressure.effective_window:
                return request
        # open loop: the recording goes on even though a real provider would have refused this
        # request, so it is counted as an overflow and served anyway
        self.counters.overflows += 1
        if not session.step_open:
            request = session.prepare_request(attempt=_MAX_OVERFLOW_RETRIES + 1, allow_overflow=True)
        return request

    def _commit(self, session: Session, message: Message, request: Request) -> None:
        tokens, cached = self._account(session, request)
        output = session.meter.count_message(message)
        self.counters.output += output
        session.commit_reply(
            message, usage={"input_tokens": tokens, "output_tokens": output, "cached_input_tokens": cached}
        )

    # -- measuring -------------------------------------------------------------------------------------
    def _message_tokens(self, session: Session, request: Request, index: int) -> int:
        seq = request.seqs[index]
        if index in request.decorated:
            return session.meter.decorated_tokens(seq, request.messages[index])
        node = session.surface.node(seq)
        return (
            session.meter.node_tokens(node)
            if node is not None
            else session.meter.count_message(request.messages[index])
        )

    def _header(self, session: Session, request: Request) -> int:
        key = (request.system, id(request.tools))
        tokens = self._header_tokens.get(key)
        if tokens is None:
            tokens = session.meter.count_header(request.system, request.tools)
            self._header_tokens = {key: tokens}
        return tokens

    def _prompt_tokens(self, session: Session, request: Request) -> int:
        return self._header(session, request) + sum(
            self._message_tokens(session, request, i) for i in range(len(request.messages))
        )

    def _account(self, session: Session, request: Request) -> tuple[int, int]:
        """Record one sent request: its tokens, the prefix it shares with the previous one, checks."""
        self.checkers[session.id].check_request(session, request)
        header = self._header(session, request)
        self.counters.header_tokens = max(self.counters.header_tokens, header)
        per_message = [self._message_tokens(session, request, i) for i in range(len(request.messages))]
        tokens = header + sum(per_message)
        cached = 0
        previous = self._previous
        if previous is not None and previous[0] == session.id and previous[1] == (request.system, request.tools):
            cached = header
            old_messages, old_seqs = previous[2], previous[3]
            for i, message in enumerate(request.messages):
                if i >= len(old_messages) or old_seqs[i] != request.seqs[i]:
                    break
                old = old_messages[i]
                if old is not message and old != message:
                    break
                cached += per_message[i]
        self._previous = (session.id, (request.system, request.tools), list(request.messages), list(request.seqs))
        self._last_system = request.system
        self.counters.prompt_tokens.append(tokens)
        self.counters.cached += cached
        return tokens, cached

    # -- results ---------------------------------------------------------------------------------------
    def _lineage(self) -> set[str]:
        # the sessions this replay went through (continuations it followed); a strategy's own
        # registry, not the header, is the authority on ancestry (chapters' children carry no parent)
        return {s.id for s in self.sessions}

    def _recall_tools(self) -> list[str]:
        session = self.session
        session.owns_tool("")  # brings the registry up to date
        specs = self.kernel.strategies
        return sorted(
            t.name
            for t in session.tools
            if RECALL_CAPABILITIES & getattr(specs.get(t.strategy), "capabilities", frozenset())
        )

    def _measure_recall(self, visible_seqs: set[int]) -> dict[str, Any]:
        """``history_recoverable`` measured by fetching hidden messages back (see :mod:`.recall`),
        and the retention probes (see :mod:`.probes`)."""
        final = self.session
        by_id = {s.id: s for s in self.sessions}

        def target(where: tuple[str, int]) -> tuple[str, int, Message]:
            sid, seq = where
            return sid, seq, Message.from_dict(by_id[sid].events[seq].data["message"])

        def hidden(where: tuple[str, int]) -> bool:
            return not (where[0] == final.id and where[1] in visible_seqs)

        targets = [target(w) for w in self.originals if hidden(w)]
        found_probes = probes.extract(self.recording)
        sources = {self.item_seqs[i] for p in found_probes for i in p.items if i in self.item_seqs}
        found = recall.measure(final, targets, [target(w) for w in sorted(sources) if hidden(w)])
        fetched = len(found.recovered & found.sampled)
        scale = len(targets) / found.probed if found.probed else 0.0
        cost_scale = len(targets) / found.fetched if found.fetched else 0.0  # the calls fetched all of these
        recovered = len(self.originals) - len(targets) + fetched * scale
        reachable = {i for i, where in self.item_seqs.items() if not hidden(where) or where in found.recovered}
        surface = [self._last_system]
        for node in final.surface.nodes:
            surface += probes.message_texts(node.message)
        return {
            "history_recoverable": round(recovered / len(self.originals), 4) if self.originals else 1.0,
            "recall_calls": round(found.calls * cost_scale),
            "recall_tokens": round(found.tokens * cost_scale),
            "recall_method": found.method,
            "recall_probed": found.probed,
            "probes": probes.score(found_probes, probes.visible_text(surface), reachable),
        }

    def metrics(self) -> dict[str, Any]:
        c = self.counters
        final = self.session
        visible_text = "\n".join([self._last_system, *(n.message.text for n in final.surface.nodes)])
        normalized = " ".join(visible_text.split())
        instructions = [" ".join(t.split()) for t in self.instructions if t.strip()]
        shown = sum(1 for t in instructions if t in normalized)
        visible_seqs = {n.seq for n in final.surface.nodes}
        lineage = self._lineage()
        has_recall = bool(self._recall_tools())
        declared = sum(
            1
            for sid, seq in self.originals
            if (sid == final.id and seq in visible_seqs) or (has_recall and sid in lineage)
        )
        measured = self._measure_recall(visible_seqs)
        compactions: dict[str, int] = {}
        failures = 0
        summary_calls = summary_in = summary_out = 0
        for session in self.sessions:
            for event in session.events:
                if event.type == COMPACTION_SUMMARY:
                    kind = str(event.data.get("kind") or "summary")
                    compactions[kind] = compactions.get(kind, 0) + 1
                    for span in event.data.get("spans") or []:
                        usage = span.get("usage") if isinstance(span, dict) else None
                        if usage and not isinstance(self.kernel.summarizer, CountingModel):
                            summary_calls += 1
                            summary_in += usage.get("input_tokens", 0)
                            summary_out += usage.get("output_tokens", 0)
                elif event.type == COMPACTION_PRUNE:
                    compactions["prune"] = compactions.get("prune", 0) + 1
                elif event.type == COMPACTION_END and event.data.get("error"):
                    failures += 1
        if len(self.sessions) > 1:  # each move into a child session is a context reset too
            compactions["continue"] = len(self.sessions) - 1
        summarizer = self.kernel.summarizer
        if isinstance(summarizer, CountingModel):
            summary_calls, summary_in, summary_out = summarizer.calls, summarizer.input_tokens, summarizer.output_tokens
        if summary_calls:
            used: str | None = self.options.summarizer  # scripted or openai:<model>: priced model calls
        elif compactions.get("summary"):
            used = "extractive"  # the kernel's summaries, written without a model: not priced
        else:
            used = None  # no kernel summary: the strategy (or the steward's tool calls) wrote its own
        violations = [v for checker in self.checkers.values() for v in checker.violations]
        tokens = c.prompt_tokens
        billed = sum(tokens) + summary_in
        return {
            "requests": len(tokens),
            "recorded_requests": c.recorded_requests,
            "steward_requests": c.steward_requests,
            "peak_prompt_tokens": max(tokens) if tokens else 0,
            "mean_prompt_tokens": round(sum(tokens) / len(tokens)) if tokens else 0,
            "header_tokens": c.header_tokens,
            "overflows": c.overflows,
            "overflow_retries": c.overflow_retries,
            "compactions": dict(sorted(compactions.items())),
            "compaction_failures": failures,
            "summary_calls": summary_calls,
            "summary_input_tokens": summary_in,
            "summary_output_tokens": summary_out,
            "summarizer": used,
            "billed_input_tokens": billed,
            "cached_input_tokens": c.cached,
            "output_tokens": c.output + summary_out,
            "invariant_violations": len(violations),
            "invariant_details": violations[:20],
            "instructions_visible": round(shown / len(instructions), 4) if instructions else 1.0,
            **measured,
            "history_recoverable_declared": round(declared / len(self.originals), 4) if self.originals else 1.0,
            "synthetic_results": c.synthetic_results,
            "sessions": len(self.sessions),
            "steward_errors": c.steward_errors,
            "prompt_tokens": tokens,
        }


def cost(metrics: dict[str, Any], prices: Prices | None) -> float | None:
    """Money for the billed tokens at ``prices`` (per million tokens); None without prices."""
    if prices is None or metrics.get("status") != "ok":
        return None
    uncached = metrics["billed_input_tokens"] - metrics["cached_input_tokens"]
    total = (
        uncached * prices.input
        + metrics["cached_input_tokens"] * prices.cached_input
        + metrics["output_tokens"] * prices.output
    )
    return round(total / 1_000_000, 6)


def empty_metrics(name: str, status: str, error: str, strategies: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    # the report is shared and kept: a summarizer's error (or a base_url) must not carry a key into it
    out.update(
        profile=name,
        status=status,
        error=redact(error),
        strategies=strategies or [],
        compactions={},
        invariant_details=[],
        prompt_tokens=[],
    )
    return out


def run_profile(name: str, recording: Recording, options: Options) -> dict[str, Any]:
    """Replay ``recording`` through profile ``name``; a profile that cannot load is reported, not raised."""
    started = time.perf_counter()
    kept = options.keep_sessions
    home_of = (
        contextlib.nullcontext(str(kept))
        if kept is not None
        else tempfile.TemporaryDirectory(prefix="ctxkernel-simulate-", dir=options.workdir)
    )
    with home_of as tmp:
        home = Path(tmp)
        try:
            profile = prepare_profile(name, recording, options, home)
            kernel = Kernel(profile, store=JsonlStore(home, fsync=False), home=home)
            if options.summarizer == "scripted":
                kernel.summarizer = ExtractiveModel(_meter_of(kernel))
            if kernel.summarizer is not None:  # builds a configured model: may refuse (no key)
                kernel.summarizer = CountingModel(kernel.summarizer, _meter_of(kernel))
        except (ConfigError, ProfileError) as exc:
            return empty_metrics(name, "unavailable", str(exc))
        strategies = list(profile.profile.strategies)
        replay = Replay(kernel, recording, options, label=name)
        try:
            replay.run()
        except Exception as exc:  # noqa: BLE001 - one broken strategy must not hide the others' results
            where = _origin(exc)
            out = empty_metrics(name, "failed", f"{type(exc).__name__}: {exc}{where}", strategies)
            out["session_ids"] = [s.id for s in replay.sessions] if kept is not None else None  # to inspect the failure
            out["wall_seconds"] = round(time.perf_counter() - started, 3)
            return out
        result = replay.metrics()
        result["session_ids"] = [s.id for s in replay.sessions] if kept is not None else None
        store_close = getattr(kernel.store, "close", None)
        if store_close:
            store_close()
    out = {
        "profile": name,
        "strategies": strategies,
        "status": "ok",
        "error": None,
        "effective_window": profile.model.effective_window,
        **result,
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    out["cost"] = cost(out, options.prices or profile.prices)
    return {key: out.get(key) for key in METRIC_KEYS}


def _origin(exc: BaseException) -> str:
    """`` (at file:line)`` of the innermost frame, so a failed profile's report points at the bug."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" (at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})" if tb is not None else ""


def _meter_of(kernel: Kernel) -> Any:
    from ..meter import Meter

    return Meter(kernel.tokenizer)
