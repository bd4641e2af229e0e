"""Importers: recorded sessions in six formats, read into a :class:`Recording`.

The format is sniffed from the file's content, never from its name:

``kernel``       this kernel's own session log (a jsonl store file: header line, then events)
``openai-chat``  OpenAI chat-completions messages: a JSON list of messages, or a list of runs each
                 holding one (``traj``, ``messages`` or ``trajectory``), picked with ``run``
``claude-code``  Claude Code session JSONL: the main ``parentUuid`` chain from the last line back,
                 progress and sidechain lines skipped, one assistant message per API message id,
                 ``compact_boundary`` kept as a marker
``codex``        Codex CLI rollout JSONL: ``response_item`` messages, reasoning, function calls and
                 outputs; ``token_count`` events give the usage of the reply they belong to
``swe-agent``    a SWE-agent ``.traj`` trajectory (:mod:`.agent_logs`)
``openhands``    an OpenHands event stream JSON, or a benchmark run's JSONL of instances picked with
                 ``run`` (:mod:`.agent_logs`)

A malformed line raises :class:`RecordingError` naming the file, the line, the field, what was
found and what is accepted; with ``lenient=True`` it is skipped and listed in
``Recording.skipped``. Every item an importer produces is checked (:func:`check_item`) before it
joins the recording, so a clean import always holds well-typed items: bad input is an import
error, never an assertion or a replay that fails later.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ..convert import _content_text, from_openai_message
from ..errors import EventError
from ..events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, TOOL_RESULT, TURN_END, USER_MESSAGE, Event
from ..jsonbytes import loads
from ..messages import MAX_CALL_ID_CHARS, Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from . import agent_logs, claude_code
from .accounting import Accounting, saw_items, settle
from .reading import SHAPE_ERRORS, Lines, check_usage, json_arguments, parse_time, read_document, read_lines
from .recording import AssistantItem, Item, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem

FORMATS = ("kernel", "openai-chat", "claude-code", "codex", "swe-agent", "openhands")
#: formats whose files hold several runs, one picked with ``--run``
MULTI_RUN_FORMATS = ("openai-chat", "openhands")
_RUN_KEYS = ("traj", "messages", "trajectory")
_CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def sniff(path: str | os.PathLike[str]) -> str:
    """The format of a recording, read from its first bytes (see :data:`FORMATS`)."""
    path = Path(path)
    if not path.is_file():
        msg = (
            f"{path}: no such file; pass a recorded session (kernel log, OpenAI chat JSON, Claude Code or Codex JSONL)"
        )
        raise RecordingError(msg)
    first = _first_line(path)
    if first.startswith(b"["):
        try:
            whole = loads(read_document(path))
        except orjson.JSONDecodeError:
            return "openai-chat"  # its importer names what is wrong
        head = whole[0] if isinstance(whole, list) and whole else None
        return "openhands" if agent_logs.is_openhands_event(head) else "openai-chat"
    try:
        obj = loads(first)
    except orjson.JSONDecodeError as exc:
        try:  # a pretty-printed single JSON object ({"messages": [...]})
            obj = loads(read_document(path))
        except orjson.JSONDecodeError:
            msg = (
                f"{path}:1: expected a JSON list of chat messages or JSON lines, got {first[:80]!r} "
                f"(invalid JSON: {exc})"
            )
            raise RecordingError(msg) from None
        if agent_logs.is_swe_agent(obj):
            return "swe-agent"
        if agent_logs.is_openhands_instance(obj):
            return "openhands"
        if isinstance(obj, dict) and any(k in obj for k in _RUN_KEYS):
            return "openai-chat"
        msg = f"{path}: a JSON object without a messages list is not a recording format this kernel reads"
        raise RecordingError(msg) from None
    if not isinstance(obj, dict):
        msg = f"{path}:1: expected a JSON object, got {type(obj).__name__}"
        raise RecordingError(msg)
    kind = obj.get("type") if isinstance(obj.get("type"), str) else None  # a list or object is no type
    if "format_version" in obj and "id" in obj and "created" in obj:
        return "kernel"
    if agent_logs.is_swe_agent(obj):
        return "swe-agent"
    if agent_logs.is_openhands_instance(obj):
        return "openhands"
    if {"type", "payload"} <= set(obj) and kind in _CODEX_TYPES:
        return "codex"
    if kind in claude_code.TYPES or "parentUuid" in obj or "sessionId" in obj:
        return "claude-code"
    if "role" in obj:
        return "openai-chat"
    if any(k in obj for k in _RUN_KEYS):
        return "openai-chat"
    msg = (
        f"{path}:1: cannot tell the format: expected a kernel session header, a Codex rollout line "
        f"({{type, payload}}), a Claude Code line (type, uuid, parentUuid), chat messages, a SWE-agent trajectory "
        f"(history, trajectory) or an OpenHands instance (instance_id, history); got keys {sorted(obj)[:12]}"
    )
    raise RecordingError(msg)


def _first_line(path: Path) -> bytes:
    """The first non-blank line, whole (without surrounding whitespace), read up to its newline
    (within :data:`~.reading.LINE_LIMIT`)."""
    for _, raw in read_lines(path):
        if raw.strip():
            return raw.strip()
    msg = (
        f"{path}: the file is empty; pass a recorded session (kernel log, OpenAI chat JSON, Claude Code or Codex JSONL)"
    )
    raise RecordingError(msg)


def load_recording(
    path: str | os.PathLike[str], *, run: int | None = None, lenient: bool = False, format: str | None = None
) -> Recording:
    """Read a recorded session in any supported format (sniffed unless ``format`` is given)."""
    path = Path(path)
    fmt = format or sniff(path)
    if fmt not in _IMPORTERS:
        msg = f"unknown recording format {fmt!r}; accepted: {list(FORMATS)}"
        raise RecordingError(msg)
    if run is not None and fmt not in MULTI_RUN_FORMATS:
        msg = (
            f"{path}: --run selects one run of a file holding several (OpenAI chat runs, an OpenHands "
            f"benchmark run's JSONL); this file is {fmt}"
        )
        raise RecordingError(msg)
    accounting = Accounting()
    recording = _IMPORTERS[fmt](path, run, lenient, accounting)
    recording.items = settle(unique_call_ids(recording.items), accounting)
    recording.accounting = accounting.report(recording.items, len(recording.skipped))
    recording.source = {"kind": "transcript", "format": fmt, "file": path.name, **recording.source}
    return recording


def unique_call_ids(items: list[Item]) -> list[Item]:
    """Rename tool call ids a recording reuses (some providers repeat them across replies).

    The kernel refuses a call id already on the surface; a reused id is renamed ``<id>~<n>`` and
    the results that follow it are pointed at the new name (in order, when one reply repeats it).
    An empty id, or one longer than the kernel takes, is renamed the same way from its stem.
    """
    used: set[str] = set()
    tried: dict[str, int] = {}  # id -> n of its last name: every name below is taken
    current: dict[str, deque[str]] = {}  # id -> the names its latest reply gave it, not yet answered
    out: list[Item] = []
    for item in items:
        if isinstance(item, AssistantItem) and item.message.tool_calls:
            blocks = []
            changed = False
            names: dict[str, deque[str]] = {}
            for block in item.message.content:
                if isinstance(block, ToolCallBlock):
                    # an empty or overlong id is renamed from its stem, as the kernel's CallIds does
                    fits = 0 < len(block.id) <= MAX_CALL_ID_CHARS
                    stem = block.id if fits else block.id[:64] or "call"
                    n = tried.get(block.id, 1)  # not from 1 again: an id reused n times would cost n squared
                    new_id = block.id if n == 1 and fits else f"{stem}~{n}"
                    while new_id in used:
                        n += 1
                        new_id = f"{stem}~{n}"
                    tried[block.id] = n
                    used.add(new_id)
                    names.setdefault(block.id, deque()).append(new_id)
                    if new_id != block.id:
                        block = ToolCallBlock(new_id, block.name, block.arguments)
                        changed = True
                blocks.append(block)
            current.update(names)
            out.append(AssistantItem(item.message.with_content(blocks), item.usage, item.time) if changed else item)
        elif isinstance(item, ToolResultItem) and item.call_id in current:
            pending = current[item.call_id]
            new_id = pending.popleft() if len(pending) > 1 else pending[0]
            out.append(
                item if new_id == item.call_id else ToolResultItem(new_id, item.content, item.is_error, item.name)
            )
        else:
            out.append(item)
    return out


# -- kernel session log ------------------------------------------------------------------------------
def import_kernel(path: Path, run: int | None, lenient: bool, accounting: Accounting) -> Recording:
    lines = Lines(path, lenient)
    items: list[Item] = []
    header_seen = False
    for lineno, raw in lines:
        if not header_seen:
            header_seen = True
            if "format_version" not in raw:
                lines.bad(lineno, "the session header {format_version, id, created}", str(sorted(raw)))
            continue
        raw.pop("more", None)
        try:
            event = Event.from_dict(raw)
            item = _kernel_item(event)
        except EventError as exc:
            lines.bad(lineno, "a kernel event", str(exc))
            continue
        if item is None:
            # what a strategy wrote is produced afresh by the profile under test
            artifact = event.type in _KERNEL_ROLES or event.type == COMPACTION_SUMMARY
            accounting.skip("strategy_artifact" if artifact else "harness_bookkeeping", "lines")
            continue
        if isinstance(item, ToolResultItem):
            accounting.results_in_file.add(item.call_id)
        lines.add(items, lineno, item)
    saw_items(accounting, items)
    return Recording(items, {}, skipped=lines.skipped)


#: the message role each replayed event type carries
_KERNEL_ROLES = {USER_MESSAGE: "user", ASSISTANT_MESSAGE: "assistant", TOOL_RESULT: "tool"}


def _kernel_item(event: Event) -> Item | None:
    # only what the harness and the model wrote is replayed; strategy artifacts (checkpoints,
    # notices, replacements) are produced afresh by the profile under test
    def text_or_none(key: str) -> Any:
        value = event.data.get(key)
        if value is not None and not isinstance(value, str):
            msg = f"{event.type} data.{key} must be a string, got {type(value).__name__} {value!r:.60}"
            raise EventError(msg)
        return value

    if event.type == TURN_END:
        return MarkerItem("turn_end", {"reason": text_or_none("reason")})
    if event.type == COMPACTION_SUMMARY:
        return MarkerItem("compaction", {"strategy": text_or_none("strategy"), "kind": text_or_none("kind")})
    if event.type not in _KERNEL_ROLES or (event.surface or {}).get("op") != "append":
        return None
    try:
        message = Message.from_dict(event.data["message"])
    except EventError as exc:
        msg = f"{event.type} data.message: {exc}"
        raise EventError(msg) from None
    if message.role != _KERNEL_ROLES[event.type]:
        msg = (
            f"a {event.type} event holds a {_KERNEL_ROLES[event.type]} message, got data.message.role {message.role!r}"
        )
        raise EventError(msg)
    if event.type == USER_MESSAGE:
        if message.source.kind != "user":
            return None
        return UserItem(message.text)
    if event.type == ASSISTANT_MESSAGE:
        return AssistantItem(message, check_usage(event.data.get("usage"), "data.usage"))
    result = message.content[0]  # Message.from_dict: a tool message holds exactly one tool_result
    return ToolResultItem(result.call_id, result.content, result.is_error, result.name)  # type: ignore[union-attr]


# -- OpenAI chat completions ---------------------------------------------------------------------------
def import_openai(path: Path, run: int | None, lenient: bool, accounting: Accounting) -> Recording:
    try:
        data = loads(read_document(path))
    except orjson.JSONDecodeError:
        data = None
    source: dict[str, Any] = {}
    if data is None:  # one chat message per line
        lines = Lines(path, lenient)
        messages: list[tuple[int | str, Any]] = list(lines)  # (line number, message)
        skipped = lines.skipped
    else:
        skipped = []
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            msg = f"{path}: expected a JSON list of chat messages or of runs, got {type(data).__name__}"
            raise RecordingError(msg)
        runs = [r for r in data if isinstance(r, dict) and any(isinstance(r.get(k), list) for k in _RUN_KEYS)]
        if runs and len(runs) == len(data):
            index = 0 if run is None else run
            if not 0 <= index < len(runs):
                msg = f"{path}: --run {index} is out of range: the file holds {len(runs)} runs (0..{len(runs) - 1})"
                raise RecordingError(msg)
            chosen = runs[index]
            key = next(k for k in _RUN_KEYS if isinstance(chosen.get(k), list))
            source = {"run": index, "runs": len(runs)}
            messages = [(f"run {index} {key}[{i}]", m) for i, m in enumerate(chosen[key])]
        elif run is not None:
            msg = (
                f"{path}: --run needs a list of runs (objects with 'traj' or 'messages'); this file is one message list"
            )
            raise RecordingError(msg)
        else:
            messages = [(f"message {i}", m) for i, m in enumerate(data)]
    items: list[Item] = []
    system_parts: list[str] = []
    checker = Lines(path, lenient)
    checker.skipped = skipped
    for at, raw in messages:
        where = f"line {at}" if isinstance(at, int) else at
        try:
            if isinstance(raw, dict) and raw.get("role") in ("system", "developer"):
                system_parts.append(_content_text(raw.get("content"), where))
                continue
            message = from_openai_message(raw, where=where)
            if message is None:
                continue
            if message.role == "user":
                item: Item = UserItem(message.text)
            elif message.role == "assistant":
                model = raw.get("model")
                if model is not None and not isinstance(model, str):
                    msg = f"{where}.model must be a string, got {type(model).__name__}"
                    raise EventError(msg)
                item = AssistantItem(message, check_usage(raw.get("usage"), f"{where}.usage"))
            else:
                result = message.content[0]  # Message.tool: exactly one tool_result block
                item = ToolResultItem(result.call_id, result.content, result.is_error, result.name)  # type: ignore[union-attr]
        except SHAPE_ERRORS as exc:
            checker.bad(at, "an OpenAI chat message {role, content, tool_calls?}", str(exc))
            continue
        if isinstance(item, ToolResultItem):
            accounting.results_in_file.add(item.call_id)
        checker.add(items, at, item)
    saw_items(accounting, items)
    recording = Recording(items, source, skipped=skipped)
    if system_parts:
        recording.system = "\n\n".join(system_parts)
    return recording


# -- Codex CLI rollout JSONL ---------------------------------------------------------------------------
# over the complexity cap: one branch per record type of the Codex rollout format, read in a
# single pass as the file's order requires
def import_codex(path: Path, run: int | None, lenient: bool, accounting: Accounting) -> Recording:  # noqa: C901
    lines = Lines(path, lenient)
    items: list[Item] = []
    blocks: list[Any] = []
    blocks_line = 0
    blocks_time: float | None = None
    usage: dict[str, int] | None = None
    pending_usage: dict[str, int] | None = None
    deferred: list[tuple[int, ToolResultItem]] = []
    system: str | None = None
    model: str | None = None

    def flush() -> None:
        nonlocal blocks, usage
        if blocks:
            message = Message("assistant", tuple(blocks), Source(kind="model", provider="openai", model=model))
            lines.add(items, blocks_line, AssistantItem(message, usage, blocks_time))
        blocks, usage = [], None
        for lineno, result in deferred:
            lines.add(items, lineno, result)
        deferred.clear()

    for lineno, raw in lines:
        kind, payload = raw.get("type"), raw.get("payload")
        if not isinstance(kind, str) or not isinstance(payload, dict):
            lines.bad(lineno, "a rollout line {timestamp, type, payload}", str(sorted(raw))[:120])
            continue
        when = parse_time(raw.get("timestamp"))
        if kind not in _CODEX_TYPES:
            accounting.skip("unknown_type", "lines")
            continue
        if kind in ("session_meta", "turn_context", "event_msg"):
            accounting.skip("harness_bookkeeping", "lines")
        try:
            if kind == "session_meta":
                instructions = payload.get("instructions")
                if instructions is not None and not isinstance(instructions, str):
                    msg = f"payload.instructions must be a string or null, got {type(instructions).__name__}"
                    raise EventError(msg)
                system = instructions if instructions is not None else system
                continue
            if kind == "turn_context":
                found_model = payload.get("model")
                if found_model is not None and not isinstance(found_model, str):
                    msg = f"payload.model must be a string, got {type(found_model).__name__}"
                    raise EventError(msg)
                model = found_model or model
                continue
            if kind == "compacted":
                accounting.skip("harness_summary", "lines")
                flush()
                items.append(MarkerItem("compact_boundary", {"trigger": "codex"}))
                continue
            if kind == "event_msg":
                info = payload.get("info")
                if payload.get("type") == "token_count" and isinstance(info, dict):
                    last = info.get("last_token_usage")
                    if last is not None:
                        if not isinstance(last, dict):
                            msg = f"payload.info.last_token_usage must be an object, got {type(last).__name__}"
                            raise EventError(msg)
                        counts = {
                            k: v
                            for k, v in last.items()
                            if k in ("input_tokens", "cached_input_tokens", "output_tokens")
                        }
                        found = check_usage(counts, "payload.info.last_token_usage")
                        # the count belongs to the reply being assembled, or (as cli 0.40 writes it
                        # before the reply's items) to the next one
                        if blocks and usage is None:
                            usage = found
                        else:
                            pending_usage = found
                continue
            item_type = payload.get("type")
            if item_type == "message":
                role = payload.get("role")
                if role not in ("user", "assistant", "developer", "system"):
                    msg = f"payload.role must be user, assistant, developer or system, got {role!r:.60}"
                    raise EventError(msg)
                text = "\n".join(_codex_texts(payload, "content"))
                if role == "assistant":
                    if not blocks and pending_usage is not None:
                        usage, pending_usage = pending_usage, None
                    if not blocks:
                        blocks_time = when
                    blocks.append(TextBlock(text))
                    blocks_line = lineno
                else:
                    flush()
                    instruction = role == "user" and not text.lstrip().startswith(
                        ("<environment_context>", "<user_instructions>")
                    )
                    if text.strip():
                        lines.add(items, lineno, UserItem(text, instruction=instruction, time=when))
                    else:
                        accounting.saw("user_messages")
                        accounting.skip("empty_message", "user_messages")
            elif item_type == "reasoning":
                summary = "\n".join(_codex_texts(payload, "summary"))
                if deferred:
                    flush()
                if not blocks and pending_usage is not None:
                    usage, pending_usage = pending_usage, None
                if not blocks:
                    blocks_time = when
                blocks.append(ReasoningBlock(summary))
                blocks_line = lineno
            elif item_type in ("function_call", "custom_tool_call", "local_shell_call"):
                call_id = payload.get("call_id") or payload.get("id")
                name = payload.get("name") or ("shell" if item_type == "local_shell_call" else None)
                if not isinstance(call_id, str) or not isinstance(name, str):
                    msg = f"a {item_type} needs string 'call_id' and 'name', got {call_id!r:.60} and {name!r:.60}"
                    raise EventError(msg)
                if item_type == "function_call":
                    arguments = json_arguments(payload.get("arguments"))
                elif item_type == "custom_tool_call":
                    arguments = {"input": payload.get("input", "")}
                else:
                    arguments = {"action": payload.get("action")}
                if deferred:
                    flush()
                if not blocks and pending_usage is not None:
                    usage, pending_usage = pending_usage, None
                if not blocks:
                    blocks_time = when
                blocks.append(ToolCallBlock(call_id, name, arguments))
                blocks_line = lineno
            elif item_type in ("function_call_output", "custom_tool_call_output"):
                call_id = payload.get("call_id")
                if not isinstance(call_id, str):
                    msg = f"a {item_type} needs a string 'call_id', got {call_id!r:.60}"
                    raise EventError(msg)
                output = payload.get("output")
                if isinstance(output, dict):
                    output = output.get("content", orjson.dumps(output).decode())
                content = output if isinstance(output, str) else orjson.dumps(output).decode()
                accounting.results_in_file.add(call_id)
                deferred.append((lineno, ToolResultItem(call_id, content)))
            else:
                accounting.skip("unknown_type", "lines")  # a response item this importer does not read
        except SHAPE_ERRORS as exc:
            lines.bad(lineno, f"a well-formed Codex {kind} line", str(exc))
    flush()
    saw_items(accounting, items)
    recording = Recording(items, {}, skipped=lines.skipped)
    if system:
        recording.system = system
    return recording


def _codex_texts(payload: dict[str, Any], key: str) -> list[str]:
    """The ``text`` of every part of ``payload[key]`` (a list of objects), each a string."""
    parts = payload.get(key) or []
    if not isinstance(parts, list):
        msg = f"payload.{key} must be a list of parts, got {type(parts).__name__}"
        raise EventError(msg)
    texts = []
    for i, part in enumerate(parts):
        if isinstance(part, dict) and "text" in part:
            if not isinstance(part["text"], str):
                msg = (
                    f"payload.{key}[{i}].text must be a string, got {type(part['text']).__name__} {part['text']!r:.60}"
                )
                raise EventError(msg)
            texts.append(part["text"])
    return texts


# -- SWE-agent and OpenHands (see :mod:`.agent_logs`) ---------------------------------------------------
def import_swe_agent(path: Path, run: int | None, lenient: bool, accounting: Accounting) -> Recording:
    data = agent_logs.load_json(path)
    if not isinstance(data, dict):
        msg = f"{path}: expected a SWE-agent trajectory object, got a JSON {type(data).__name__}"
        raise RecordingError(msg)
    recording = agent_logs.import_swe_agent(path, data, Lines(path, lenient))
    _saw_recording(recording, accounting)
    return recording


def _saw_recording(recording: Recording, accounting: Accounting) -> None:
    """Formats whose every message becomes one item: what was read is what the file holds."""
    saw_items(accounting, recording.items)
    accounting.results_in_file.update(i.call_id for i in recording.items if isinstance(i, ToolResultItem))
    for reason, n in recording.not_replayed.items():
        accounting.skip(reason, "lines", n)


def import_openhands(path: Path, run: int | None, lenient: bool, accounting: Accounting) -> Recording:
    recording = _import_openhands(path, run, lenient)
    _saw_recording(recording, accounting)
    return recording


def _import_openhands(path: Path, run: int | None, lenient: bool) -> Recording:
    lines = Lines(path, lenient)
    if _first_line(path).startswith(b"["):  # one event stream
        if run is not None:
            msg = (
                f"{path}: --run picks an instance of an OpenHands benchmark run (JSONL); this file is one event stream"
            )
            raise RecordingError(msg)
        events = agent_logs.load_json(path)
        return agent_logs.import_openhands(agent_logs.openhands_events(events, "event"), lines, {})
    index = 0 if run is None else run
    try:
        whole = loads(read_document(path))  # one pretty-printed instance
    except orjson.JSONDecodeError:
        whole = None
    instances = [(1, whole)] if isinstance(whole, dict) else lines
    chosen: tuple[int, dict[str, Any]] | None = None
    total = 0
    for lineno, raw in instances:
        if not agent_logs.is_openhands_instance(raw):
            lines.bad(lineno, "an OpenHands instance {instance_id, history: [events]}", str(sorted(raw))[:120])
            continue
        if total == index:
            chosen = (lineno, raw)
        total += 1
    if chosen is None:
        msg = f"{path}: --run {index} is out of range: the file holds {total} instances (0..{total - 1})"
        raise RecordingError(msg)
    lineno, raw = chosen
    events = agent_logs.openhands_events(raw["history"], f"line {lineno} history")
    instruction = agent_logs.check_instruction(raw, lineno, lines)
    return agent_logs.import_openhands(events, lines, {"run": index, "runs": total}, instruction)


_IMPORTERS: dict[str, Callable[[Path, int | None, bool, Accounting], Recording]] = {
    "kernel": import_kernel,
    "openai-chat": import_openai,
    "claude-code": claude_code.import_claude_code,
    "codex": import_codex,
    "swe-agent": import_swe_agent,
    "openhands": import_openhands,
}
