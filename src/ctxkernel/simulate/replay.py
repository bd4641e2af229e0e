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
import math
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from ..errors import ConfigError, ContextOverflowError, HeaderTooLargeError, ProfileError, RequestTooLargeError
from ..events import COMPACTION_END, COMPACTION_PRUNE, COMPACTION_SUMMARY, replay_clock
from ..guard import EXCERPT_MIN_TOKENS, MAX_MESSAGE_SHARE, excerpt_budget
from ..kernel import Kernel
from ..messages import Message, Source, ToolCallBlock
from ..meter import Meter, message_text_for_count
from ..models.base import Reply
from ..pricing import Bill, ModelPrice, PromptCache, UnknownModelError, price_for, priced_as
from ..profile import ModelSettings, Prices, Profile, SummarizerSettings, load_profile, override_window
from ..redact import redact
from ..session import Request, Session
from ..store.jsonl import JsonlStore
from ..text import extractive_summary
from ..tools import ToolOutcome
from . import cues, probes, recall
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
    "cache_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "cost_usd",
    "recall_cost_usd",
    "cost_with_recall_usd",
    "invariant_violations",
    "invariant_details",
    "instructions_visible",
    "instructions_visible_min",
    "instructions_visible_mean",
    "recall_needs",
    "recall_found",
    "recall_cued",
    "recall_method",
    "recall_tools",
    "recall_calls",
    "recall_tokens",
    "history_reachable",
    "history_reachable_declared",
    "history_reachable_method",
    "history_reachable_calls",
    "history_reachable_tokens",
    "history_reachable_probed",
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
#: the model a recording's requests are priced as, by its format, when ``--model`` is not given
#: (workloads and kernel logs: a current Anthropic model, whose explicit cache bills writes)
DEFAULT_MODELS: dict[str, str] = {
    "claude-code": "claude-sonnet-4-5",
    "codex": "gpt-5-codex",
    "openai-chat": "gpt-4o",
    "swe-agent": "gpt-4o",
    "openhands": "claude-sonnet-4-5",
    "kernel": "claude-sonnet-4-5",
    "workload": "claude-sonnet-4-5",
}
#: the default summarizer: an offline model that writes summaries as long as a model's, priced
STAND_IN = "stand-in"
#: the longest summary the stand-in writes: a model's eight-section summary is this long (the one
#: Claude Code wrote at its compaction in the shared Claude Code recording: 11.8k characters for
#: its eight sections, 16.2k with its preamble and analysis; basic's summary_max_chars is 12,000)
STAND_IN_SUMMARY_CHARS = 12_000
#: ... and for a shorter region, a tenth of it (a model details a small region less)
STAND_IN_SHARE = 0.1
#: the longest line the stand-in quotes of one message of the region
STAND_IN_LINE_CHARS = 300
#: where the replay clock starts for a recording that holds no time (2025-01-01T00:00:00Z) ...
FIXED_START = 1_735_689_600.0
#: ... and how far it moves for each user message or reply that has no recorded time
STEP_SECONDS = 10.0
#: the built-in pseudo-profile with no strategy (a baseline row; not part of ``all``)
UNMANAGED = "none"
#: a strategy claiming one of these capabilities gives the model tools that read hidden history back
RECALL_CAPABILITIES = frozenset({"recall", "history"})
_STEWARD_SOURCE = Source(kind="model", provider="simulate", model="steward")
_RECALL_SOURCE = Source(kind="model", provider="simulate", model="recall")
_MAX_STEWARD_ROUNDS = 3
_MAX_OVERFLOW_RETRIES = 3


@dataclass
class Options:
    """How to run a comparison (the ``ctxkernel simulate`` flags)."""

    window: int | None = None
    #: ``--window 0.5x``: each recording's window is this share of its own unmanaged peak
    window_share: float | None = None
    summarizer: str = STAND_IN
    steward: Steward = default_steward
    #: ``--model``: the price table's model the requests are priced as (None: the format's default)
    model: str | None = None
    #: ``--prices``: other prices for that model's cache rules
    prices: Prices | None = None
    workdir: Path | None = None
    #: keep the replayed sessions in a jsonl store (the kernel home) at this folder
    keep_sessions: Path | None = None
    progress: Callable[[str, int, int], None] | None = None


# -- summarizers ---------------------------------------------------------------------------------------
class ExtractiveModel:
    """The offline stand-in for a summarizer model (``--summarizer stand-in``, the default): it
    answers with the deterministic eight-section summary, up to :data:`STAND_IN_SUMMARY_CHARS`
    (as long as a model's), and reports usage as a provider would, so every summary is priced as
    the model call a real harness makes, with no network."""

    provider = "simulate"
    model = "stand-in-summarizer"

    def __init__(self, meter: Any) -> None:
        self._meter = meter

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        text = stand_in_summary(messages[:-1])
        prompt = self._meter.count_header(system, tools or []) + sum(self._meter.count_message(m) for m in messages)
        reply = Message.assistant(text, source=Source(kind="model", provider=self.provider, model=self.model))
        usage = {"input_tokens": prompt, "output_tokens": self._meter.count_message(reply), "cached_input_tokens": 0}
        return Reply(reply, usage, self.provider, self.model)


def stand_in_summary(region: list[Message]) -> str:
    """The stand-in's summary of ``region``: the kernel's eight sections, then, while shorter than
    a model would write (a tenth of the region, at most :data:`STAND_IN_SUMMARY_CHARS`), the
    region's own messages, newest first, one clipped line each, as a model's summary details the
    latest work."""
    sections = extractive_summary(region, max_chars=STAND_IN_SUMMARY_CHARS)
    size = sum(len(message_text_for_count(m)) for m in region)
    target = min(STAND_IN_SUMMARY_CHARS, int(size * STAND_IN_SHARE))
    details: list[str] = []
    used = len(sections)
    for message in reversed(region):
        if used >= target:
            break
        body = " ".join(message_text_for_count(message).split())
        if body:
            details.append(f"- {message.role}: {body[:STAND_IN_LINE_CHARS]}")
            used += len(details[-1]) + 1
    if not details:
        return sections
    return (sections + "\n" + "\n".join(reversed(details)))[: max(target, len(sections))]


class CountingModel:
    """Wraps the profile's summarizer so every call and its tokens are counted, and billed as a
    request through the replay's prompt cache (``bill``: the summary call shares the request's
    system prompt, tools and head, which a provider serves from its cache)."""

    def __init__(self, inner: Any, meter: Any) -> None:
        self.inner = inner
        self.provider = getattr(inner, "provider", "")
        self.model = getattr(inner, "model", "")
        self._meter = meter
        self.calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.bill: Callable[[str, list[dict[str, Any]], list[Message], int], None] | None = None

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        reply: Reply = self.inner.complete(messages, system=system, tools=tools)
        usage = reply.usage or {}
        self.calls += 1
        tokens = usage.get("input_tokens") or (
            self._meter.count_header(system, tools or []) + sum(self._meter.count_message(m) for m in messages)
        )
        self.input_tokens += tokens
        self.output_tokens += usage.get("output_tokens") or self._meter.count_message(reply.message)
        if self.bill is not None:
            self.bill(system, tools or [], messages, tokens)
        return reply


def summarizer_settings(spec: str) -> SummarizerSettings | None:
    """``stand-in`` (``scripted``), ``extractive`` (None for both), or ``openai:<model>[@<base_url>]``."""
    if spec in ("", "extractive", STAND_IN, "scripted"):
        return None
    kind, _, rest = spec.partition(":")
    if kind != "openai" or not rest:
        msg = f"--summarizer {spec!r}: expected 'stand-in', 'extractive' or 'openai:<model>[@<base_url>]'"
        raise RecordingError(msg)
    model, _, base_url = rest.partition("@")
    try:
        return SummarizerSettings(kind="openai", model=model, base_url=base_url or None)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'summarizer'}: {e['msg']}" for e in exc.errors())
        msg = f"--summarizer {spec!r}: {problems}; expected 'openai:<model>[@<base_url>]'"
        raise RecordingError(msg) from None


# -- profiles ------------------------------------------------------------------------------------------
def base_profile(name: str) -> Profile:
    """Profile ``name`` as loaded, before the simulation's changes (``none``: ``basic``'s model
    settings and no strategy, what the session needs when nothing manages it)."""
    if name != UNMANAGED:
        return load_profile(name)
    profile = load_profile("basic")
    profile.profile.excerpt_oversized = False  # no kernel bound either: what the session sends
    profile.profile.strategies = []
    profile.strategies = {}
    for policy in profile.model_policies:
        policy.strategies = {}
    return profile


def prepare_profile(
    name: str, recording: Recording, options: Options, home: Path, base: Profile | None = None
) -> Profile:
    """The profile as the simulation runs it: window override, the recording's system prompt,
    a private store, and the chosen summarizer (extractive unless asked: offline by default).
    ``base``: :func:`base_profile` of ``name`` when the caller has it (changed in place)."""
    profile = base_profile(name) if base is None else base
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
    output: int = 0
    overflows: int = 0
    overflow_retries: int = 0
    steward_requests: int = 0
    recorded_requests: int = 0
    steward_errors: int = 0
    synthetic_results: int = 0
    header_tokens: int = 0


class RecordedClock:
    """The replay's time: each user message and reply at its recorded time (seconds since the
    epoch), else :data:`STEP_SECONDS` after the one before; a recording with no time at all
    starts at :data:`FIXED_START`. Never goes back (a recording whose clock did stays put)."""

    def __init__(self, recording: Recording) -> None:
        times = (i.time for i in recording.items if isinstance(i, UserItem | AssistantItem))
        self.now = next((t for t in times if t is not None), FIXED_START)

    def advance(self, recorded: float | None) -> float:
        self.now = max(self.now, recorded) if recorded is not None else self.now + STEP_SECONDS
        return self.now

    def __call__(self) -> float:
        return self.now


class Replay:
    """One recording through one kernel (one profile)."""

    def __init__(
        self,
        kernel: Kernel,
        recording: Recording,
        options: Options,
        label: str = "",
        clock: RecordedClock | None = None,
        price: ModelPrice | None = None,
    ) -> None:
        self.kernel = kernel
        self.recording = recording
        self.options = options
        self.label = label
        self.clock = clock or RecordedClock(recording)
        self.price = price or price_for(DEFAULT_MODELS["workload"])
        self.cache = PromptCache(self.price)
        self.bill = Bill()  # every request the provider served, and every summary call
        # the extra requests the cued prober's recall calls stand for, and their output (the calls):
        # priced apart from ``bill``, which holds only what the recording's requests cost
        self.recall_bill = Bill()
        self.recall_output = 0
        self._sent_blocks: list[tuple[Hashable, int]] | None = None  # the last served request's blocks
        self._refused: Request | None = None  # the request being served although a provider refused it
        self._tools_key: tuple[Any, bytes] = (None, b"")
        self.session: Session = kernel.open_session(origin=origin_label(label, recording))
        self.sessions: list[Session] = [self.session]
        self.checkers: dict[str, InvariantChecker] = {self.session.id: InvariantChecker(self.session.id)}
        self.counters = _Counters()
        self.instructions = probes.InstructionWatch()
        self.cued = recall.CuedRecall()
        self._candidates = cues.candidates(recording)
        self._shown: dict[int, tuple[Any, str]] = {}  # id(message) -> (message, the text it shows)
        self._index = -1
        self.originals: list[tuple[str, int]] = []  # (session id, seq) of every replayed message
        self.item_seqs: dict[int, tuple[str, int]] = {}  # recording item index -> where it was replayed
        self._last_was_final_reply = False
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
            self._index = index
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
        self.clock.advance(item.time)
        session = self.session
        if session.turn_open and self._last_was_final_reply:
            session.end_turn()
        seq = session.user(item.text)
        self.originals.append((session.id, seq))
        if item.instruction:
            self.instructions.give(item.text)
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
        self.clock.advance(item.time)
        session = self.session
        if not session.turn_open:
            # a recording that starts with (or resumes on) the model still needs an open turn
            session.user(Message.user("(the recording continues)", Source.plugin_form("simulate", "notice")))
        request = self._prepare_with_steward()
        message = item.message
        if message.source.kind != "model":
            message = Message("assistant", message.content, Source(kind="model"))
        self.counters.recorded_requests += 1
        self._probe_needs(request)
        self._commit(self.session, message, request)
        self._bill_recall(request)
        self.originals.append((self.session.id, self.session.next_seq - (1 if message.tool_calls else 2)))
        self._last_was_final_reply = not message.tool_calls

    def _probe_needs(self, request: Request) -> None:
        """Cued recall: each cue this recorded step uses that only hidden content held is a need,
        looked up with the tools this request offers, knowing only what it shows (:mod:`.recall`)."""
        found = self._candidates.get(self._index)
        tally = self.cued
        if not found or tally.needs >= recall.MAX_NEEDS:
            return
        shown = cues.request_text(request.system, request.messages, self._shown)
        offered = recall.offered_names(request.tools)
        tally.family = recall.family_of(offered) or tally.family
        budget = int(request.pressure.effective_window * recall.NEED_OUTPUT_SHARE)
        for candidate in found:
            if candidate.cue in shown or tally.needs >= recall.MAX_NEEDS:
                continue
            tally.needs += 1
            if recall.probe_need(self.session, offered, shown, candidate.cue, candidate.evidence, budget, tally):
                tally.found += 1

    def _bill_recall(self, request: Request) -> None:
        """Price the recall calls the prober made at ``request`` (just sent) as the extra
        requests a model would have sent to make them (:func:`recall_requests`)."""
        exchanges, self.cued.exchanges = self.cued.exchanges, []
        if not exchanges or request is self._refused or self._sent_blocks is None:
            return  # a refused request was never served: no model read it or called anything
        bill, output = recall_requests(self.cache, self.clock.now, self._sent_blocks, exchanges, self.session.meter)
        self.recall_bill.add(bill)
        self.recall_output += output

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
        if session.route is None and self.options.window is not None:
            # the window the session runs at, recorded with its route (as prepare_request would
            # record the route, at the same place in the log): a kept session opened with its
            # profile later shows the window it ran at, not the profile's
            model = session.kernel.profile.model
            session.set_route(model.provider, model.name, context_window=model.context_window)
        try:
            request = session.prepare_request()
        except RequestTooLargeError:
            # the kernel's guard refused it (it could not be compacted to fit): a real harness
            # gets this error instead of the provider's; the recording goes on (open loop)
            self.counters.overflows += 1
            self._refused = session.prepare_request(allow_overflow=True)
            return self._refused
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
        # request, so it is counted as an overflow, and goes on unbilled (nothing was served)
        self.counters.overflows += 1
        if not session.step_open:
            request = session.prepare_request(attempt=_MAX_OVERFLOW_RETRIES + 1, allow_overflow=True)
        self._refused = request
        return request

    def _commit(self, session: Session, message: Message, request: Request) -> None:
        tokens, cached = self._account(session, request)
        output = session.meter.count_message(message)
        if request is not self._refused:
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
        """Record one sent request: its tokens, its bill through the prompt cache, checks.
        Returns (prompt tokens, tokens read from the cache)."""
        self.checkers[session.id].check_request(session, request)
        header = self._header(session, request)
        self.counters.header_tokens = max(self.counters.header_tokens, header)
        per_message = [self._message_tokens(session, request, i) for i in range(len(request.messages))]
        tokens = header + sum(per_message)
        self._last_system = request.system
        self.counters.prompt_tokens.append(tokens)
        self.instructions.check(request.system, request.messages)
        if request is self._refused:
            self._sent_blocks = None
            return tokens, 0  # refused by the provider: nothing billed, nothing cached
        blocks: list[tuple[Hashable, int]] = [
            (self._header_key(request.system, request.tools), header),
            *zip(request.messages, per_message),
        ]
        bill = self.cache.request(self.clock.now, blocks)
        self._sent_blocks = blocks
        self.bill.add(bill)
        return tokens, bill.cache_read

    def _header_key(self, system: str, tools: list[dict[str, Any]]) -> tuple[str, str, bytes]:
        """The system prompt and tool schemas as one cache block's key."""
        if self._tools_key[0] is not tools:
            self._tools_key = (tools, orjson.dumps(tools, option=orjson.OPT_SORT_KEYS))
        return ("header", system, self._tools_key[1])

    def bill_summary(self, system: str, tools: list[dict[str, Any]], messages: list[Message], tokens: int) -> None:
        """A summarizer call of ``tokens`` input tokens (as its provider reported them), billed
        through the same cache at the time of the request it serves: the prefix it shares with
        earlier requests is read, the rest billed as the cache bills a request's new part."""
        meter = self.session.meter
        blocks = [
            (self._header_key(system, tools), meter.count_header(system, tools)),
            *((m, meter.count_message(m)) for m in messages),
        ]
        bill = self.cache.request(self.clock.now, blocks)
        rest = max(0, tokens - bill.cache_read)  # the provider's count of what was not read
        bill.cache_read = min(bill.cache_read, tokens)
        if bill.cache_write:
            bill.cache_write, bill.uncached = rest, 0
        else:
            bill.uncached = rest
        self.bill.add(bill)

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
        """Cued recall's tally, ``history_reachable`` measured by fetching every hidden message back (see :mod:`.recall`),
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
        cued = self.cued
        return {
            "recall_needs": cued.needs,
            "recall_found": cued.found,
            "recall_cued": round(cued.found / cued.needs, 4) if cued.needs else None,
            "recall_method": "cued",
            "recall_tools": cued.family,
            "recall_calls": cued.calls,
            "recall_tokens": cued.tokens,
            "history_reachable": round(recovered / len(self.originals), 4) if self.originals else 1.0,
            "history_reachable_method": found.method,
            "history_reachable_calls": round(found.calls * cost_scale),
            "history_reachable_tokens": round(found.tokens * cost_scale),
            "history_reachable_probed": found.probed,
            "probes": probes.score(found_probes, probes.visible_text(surface), reachable),
        }

    def metrics(self) -> dict[str, Any]:
        c = self.counters
        final = self.session
        watch = self.instructions
        at_end = watch.visible(watch.text_of(self._last_system, (n.message for n in final.surface.nodes)))
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
        bill = Bill(self.bill.uncached, self.bill.cache_read, self.bill.cache_write)
        if not isinstance(summarizer, CountingModel):
            bill.uncached += summary_in  # a strategy's own model calls, recorded in its events
        output = c.output + summary_out
        # a provider refuses a request over the window: the session as recorded could not go on,
        # so it has no price
        price = None if c.overflows else round(self.price.cost(bill, output), 6)
        recall_price = None if c.overflows else round(self.price.cost(self.recall_bill, self.recall_output), 6)
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
            "billed_input_tokens": bill.input,
            "cache_read_tokens": bill.cache_read,
            "cache_write_tokens": bill.cache_write,
            "output_tokens": output,
            "cost_usd": price,
            "recall_cost_usd": recall_price,
            "cost_with_recall_usd": None if price is None or recall_price is None else round(price + recall_price, 6),
            "invariant_violations": len(violations),
            "invariant_details": violations[:20],
            "instructions_visible": round(at_end, 4),
            "instructions_visible_min": round(min(watch.shares), 4) if watch.shares else 1.0,
            "instructions_visible_mean": round(sum(watch.shares) / len(watch.shares), 4) if watch.shares else 1.0,
            **measured,
            "history_reachable_declared": round(declared / len(self.originals), 4) if self.originals else 1.0,
            "synthetic_results": c.synthetic_results,
            "sessions": len(self.sessions),
            "steward_errors": c.steward_errors,
            "prompt_tokens": tokens,
        }


def recall_requests(
    cache: PromptCache,
    at: float,
    sent: Sequence[tuple[Hashable, int]],
    exchanges: Sequence[tuple[ToolCallBlock, str, bool]],
    meter: Meter,
) -> tuple[Bill, int]:
    """(bill, output tokens) of the requests a model sends to make ``exchanges``, the recall
    calls it needed at the request whose cache blocks are ``sent`` (just billed through
    ``cache``): each call is written by the model (output) and sent back with its result in one
    more request, the request's prompt plus every call and result so far. Each is billed with the
    replay's cache rules at ``at``, on a fork of ``cache``: the prefix already sent is read from
    the cache, the new call and result billed as the rule bills new input; ``cache`` itself, and
    so every later request's bill, is left as it was (the calls and results are not carried into
    later requests)."""
    what_if = cache.fork()
    blocks = list(sent)
    bill, output = Bill(), 0
    for block, text, is_error in exchanges:
        call = Message("assistant", (block,), _RECALL_SOURCE)
        result = Message.tool(block.id, text, is_error=is_error, name=block.name)
        call_tokens = meter.count_message(call)
        output += call_tokens
        blocks += [(call, call_tokens), (result, meter.count_message(result))]
        bill.add(what_if.request(at, blocks))
    return bill, output


def origin_label(profile: str, recording: Recording) -> str:
    """What a kept session says it is (its header's ``origin``): the simulator, the profile (the
    ``none`` baseline named as such) and what was replayed."""
    source = recording.source
    if source.get("kind") == "workload":
        what = f"workload {source.get('workload')} seed {source.get('seed')}"
    else:
        what = f"{source.get('format')} transcript {source.get('file')}"
        if source.get("run") is not None:
            what += f" run {source['run']} of {source.get('runs')}"
    role = f"{profile} (unmanaged baseline)" if profile == UNMANAGED else profile
    return f"ctxkernel simulate: profile {role}, {what}"[:300]


def model_for(recording: Recording, options: Options) -> str:
    """The model the requests are priced as: ``--model``, else the recording format's default
    (:data:`DEFAULT_MODELS`); refused when the price table does not hold it."""
    name = options.model or DEFAULT_MODELS.get(recording.source.get("format") or "workload", DEFAULT_MODELS["workload"])
    try:
        return price_for(name, releases_only=True).model
    except UnknownModelError as exc:
        msg = f"--model: {exc}"
        raise RecordingError(msg) from None


def price_of(options: Options, profile_prices: Prices | None = None) -> ModelPrice:
    """The model's prices and cache rules; ``--prices`` (else a profile's ``[prices]``) replace
    the prices and keep the cache rules."""
    price = price_for(options.model or DEFAULT_MODELS["workload"])
    given = options.prices or profile_prices
    if given is not None:
        price = price.with_prices(given.input, given.cached_input, given.output)
    return price


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


def largest_message(recording: Recording, meter: Meter, tokenizer: str) -> tuple[int, str]:
    """(tokens, what it is) of the recording's largest single message as the kernel counts it (a
    user message, a reply with its tool-call arguments, or a tool result); computed once per
    tokenizer and shared by every profile's replay."""
    key = f"largest_message:{tokenizer}"
    known = recording.derived.get(key)
    if known is None:
        known = (0, "")
        for item in recording.items:
            if isinstance(item, UserItem):
                message, kind = Message.user(item.text), "a user message"
            elif isinstance(item, AssistantItem):
                message, kind = item.message, "a reply with its tool calls"
            elif isinstance(item, ToolResultItem):
                message = Message.tool(item.call_id, item.content, is_error=item.is_error, name=item.name)
                kind = "a tool result"
            else:
                continue
            tokens = meter.count_message(message)
            if tokens > known[0]:
                known = (tokens, kind)
        recording.derived[key] = known
    return known


def largest_instruction(recording: Recording, meter: Meter, tokenizer: str) -> int:
    """Tokens of the recording's largest instruction (a user message the user wrote), counted as
    the kernel's instruction budget counts it (:mod:`ctxkernel.instructions`); computed once per
    tokenizer."""
    key = f"largest_instruction:{tokenizer}"
    known = recording.derived.get(key)
    if known is None:
        texts = [item.text for item in recording.items if isinstance(item, UserItem) and item.instruction]
        known = recording.derived[key] = max((meter.count_text(text) for text in texts), default=0)
    return int(known)


def instruction_refusal(
    tokens: int, budget_ratio: float, model: ModelSettings, configured: ModelSettings
) -> str | None:
    """Why the window of ``model`` cannot keep a recording's largest instruction (``tokens``)
    whole: the kernel protects only instructions within ``budget_ratio`` of the effective window
    (``[instructions]``), so no compaction could keep that one and ``instructions_visible`` would
    measure the window, not the profile; None when it can (or the protection is off)."""
    effective = model.effective_window
    budget = int(budget_ratio * effective)
    if budget_ratio <= 0 or tokens <= budget:
        return None
    smallest = math.ceil(tokens / budget_ratio)
    while int(budget_ratio * smallest) < tokens:  # the budget is rounded down
        smallest += 1
    return (
        f"the recording's largest instruction (a user message) costs {tokens} tokens, more than the instruction "
        f"budget of {budget} ([instructions] budget_ratio {budget_ratio:g} of the effective window of {effective}): "
        f"no compaction can keep it whole, so instructions_visible would measure the window, not the profile. The "
        f"smallest context_window that works is {configured.smallest_window_for(smallest)} (an effective window of "
        f"{smallest}); fix: a larger --window"
    )


def message_refusal(tokens: int, what: str, model: ModelSettings, configured: ModelSettings) -> str | None:
    """Why the window of ``model`` cannot replay a recording whose largest message costs
    ``tokens``, naming the smallest window that can (for the profile's ``configured`` model
    settings, whose output reservation a small window shrinks); None when it can.

    Refused: a message larger than the whole effective window (the recorded step cannot be sent
    whole there), or one over the kernel's bound (:data:`~ctxkernel.guard.MAX_MESSAGE_SHARE` of the window) in a window too small
    for the kernel's excerpt (:func:`~ctxkernel.guard.excerpt_budget`, at least
    :data:`~ctxkernel.guard.EXCERPT_MIN_TOKENS`) to shrink it under that bound."""
    effective, context_window, reserved = model.effective_window, model.context_window, model.reserved_output_tokens
    cap = MAX_MESSAGE_SHARE * effective
    if tokens <= effective and (tokens <= cap or excerpt_budget(effective) <= cap):
        return None
    smallest = max(
        tokens, min(math.ceil(tokens / MAX_MESSAGE_SHARE), math.ceil(EXCERPT_MIN_TOKENS / MAX_MESSAGE_SHARE))
    )
    window = (
        f"the effective window of {effective} (context_window {context_window} - reserved_output_tokens {reserved})"
    )
    why = (
        f"more than {window}: the step the recorded model answered cannot be sent whole there"
        if tokens > effective
        else f"more than {MAX_MESSAGE_SHARE:.0%} of {window}, which the kernel keeps no message over, and the "
        f"window is too small for its excerpt (at least {EXCERPT_MIN_TOKENS} tokens) to shrink it under that"
    )
    return (
        f"the recording's largest message ({what}) costs {tokens} tokens, {why}; every profile is refused at "
        f"this window alike. The smallest context_window that works is {configured.smallest_window_for(smallest)} "
        f"(an effective window of {smallest}); fix: a larger --window"
    )


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
            base = base_profile(name)
            configured = base.model  # before --window, which may shrink its output reservation
            profile = prepare_profile(name, recording, options, home, base)
            kernel = Kernel(profile, store=JsonlStore(home, fsync=False), home=home)
            if options.summarizer in (STAND_IN, "scripted"):
                kernel.summarizer = ExtractiveModel(_meter_of(kernel))
            if kernel.summarizer is not None:  # builds a configured model: may refuse (no key)
                kernel.summarizer = CountingModel(kernel.summarizer, _meter_of(kernel))
        except (ConfigError, ProfileError) as exc:
            return empty_metrics(name, "unavailable", str(exc))
        strategies = list(profile.profile.strategies)
        model = profile.model
        if options.window is not None:  # the comparison's own window: can it hold the recording?
            meter = _meter_of(kernel)
            tokens, what = largest_message(recording, meter, model.tokenizer)
            reason = message_refusal(tokens, what, model, configured) or instruction_refusal(
                largest_instruction(recording, meter, model.tokenizer),
                profile.instructions.budget_ratio,
                model,
                configured,
            )
            if reason is not None:
                out = empty_metrics(name, "refused", reason, strategies)
                out["effective_window"] = model.effective_window
                out["wall_seconds"] = round(time.perf_counter() - started, 3)
                return out
        clock = RecordedClock(recording)
        replay: Replay | None = None
        try:
            # ids drawn from the profile's name: the same on every run of one command, kept or
            # not; a store that already holds this replay's sessions (a second run into one
            # --keep-sessions folder) gets new ones
            origin = origin_label(name, recording)
            earlier = sum(1 for sid in kernel.store.list_sessions() if kernel.store.header(sid).origin == origin)
            seed = f"ctxkernel-simulate:{name}:{earlier}"
            # --model, else the recording format's model (as compare() prices it), never the
            # workloads' default for a recording of another format
            price = price_of(replace(options, model=model_for(recording, options)), profile.prices)
            # the break-even rule of the replayed sessions weighs edits with the bill's prices
            with replay_clock(clock, seed), priced_as(price):
                replay = Replay(kernel, recording, options, label=name, clock=clock, price=price)
                if isinstance(kernel.summarizer, CountingModel):
                    kernel.summarizer.bill = replay.bill_summary
                replay.run()
                result = replay.metrics()
        except HeaderTooLargeError as exc:
            # the profile cannot run at this window: its header leaves no room to manage (the
            # kernel refused the first request up front, as it would refuse a harness's)
            out = empty_metrics(name, "refused", str(exc), strategies)
            out["header_tokens"] = exc.header_tokens
            out["effective_window"] = profile.model.effective_window
            out["wall_seconds"] = round(time.perf_counter() - started, 3)
            return out
        except Exception as exc:  # one broken strategy must not hide the others' results
            where = _origin(exc)
            out = empty_metrics(name, "failed", f"{type(exc).__name__}: {exc}{where}", strategies)
            if kept is not None and replay is not None:
                out["session_ids"] = [s.id for s in replay.sessions]  # to inspect the failure
            out["wall_seconds"] = round(time.perf_counter() - started, 3)
            return out
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
    return {key: out.get(key) for key in METRIC_KEYS}


def _origin(exc: BaseException) -> str:
    """`` (at file:line)`` of the innermost frame, so a failed profile's report points at the bug
    (for a strategy's error the kernel wraps, naming the strategy: of the error it chained)."""
    for _ in range(20):  # bounded: a plugin may chain its errors in a loop
        if exc.__cause__ is None:
            break
        exc = exc.__cause__
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" (at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})" if tb is not None else ""


def _meter_of(kernel: Kernel) -> Meter:
    return Meter(kernel.tokenizer)
