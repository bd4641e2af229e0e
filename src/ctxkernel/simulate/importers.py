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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ..convert import _content_text, from_anthropic_message, from_openai_message
from ..errors import EventError
from ..events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, TOOL_RESULT, TURN_END, USER_MESSAGE, Event
from ..messages import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from . import agent_logs
from .reading import SHAPE_ERRORS, Lines, check_usage, json_arguments
from .recording import AssistantItem, Item, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem

FORMATS = ("kernel", "openai-chat", "claude-code", "codex", "swe-agent", "openhands")
#: formats whose files hold several runs, one picked with ``--run``
MULTI_RUN_FORMATS = ("openai-chat", "openhands")
_RUN_KEYS = ("traj", "messages", "trajectory")
_CLAUDE_TYPES = frozenset(
    {"user", "assistant", "system", "progress", "summary", "file-history-snapshot", "queue-operation"}
)
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
            whole = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            return "openai-chat"  # its importer names what is wrong
        head = whole[0] if isinstance(whole, list) and whole else None
        return "openhands" if agent_logs.is_openhands_event(head) else "openai-chat"
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        try:  # a pretty-printed single JSON object ({"messages": [...]})
            obj = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            msg = f"{path}:1: expected a JSON list of chat messages or JSON lines, got {first[:80]!r}"
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
    if kind in _CLAUDE_TYPES or "parentUuid" in obj or "sessionId" in obj:
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


#: the longest first line sniff reads: a Codex session_meta or a pasted first message can be far
#: longer than a buffer, but a line past this is not a recording line
SNIFF_LINE_LIMIT = 64 * 1024 * 1024


def _first_line(path: Path) -> bytes:
    """The first non-blank line, whole (without surrounding whitespace), read up to its newline."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(SNIFF_LINE_LIMIT + 1), b""), 1):
            if len(raw) > SNIFF_LINE_LIMIT:
                msg = (
                    f"{path}:{lineno}: the first line is longer than {SNIFF_LINE_LIMIT // (1024 * 1024)} MiB; "
                    "a recording line must be shorter than that"
                )
                raise RecordingError(msg)
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
    recording = _IMPORTERS[fmt](path, run, lenient)
    recording.items = unique_call_ids(recording.items)
    recording.source = {"kind": "transcript", "format": fmt, "file": path.name, **recording.source}
    return recording


def unique_call_ids(items: list[Item]) -> list[Item]:
    """Rename tool call ids a recording reuses (some providers repeat them across replies).

    The kernel refuses a call id already on the surface; a reused id is renamed ``<id>~<n>`` and
    the results that follow it are pointed at the new name.
    """
    used: set[str] = set()
    current: dict[str, str] = {}
    out: list[Item] = []
    for item in items:
        if isinstance(item, AssistantItem) and item.message.tool_calls:
            blocks = []
            changed = False
            for block in item.message.content:
                if isinstance(block, ToolCallBlock):
                    new_id, n = block.id, 1
                    while new_id in used:
                        n += 1
                        new_id = f"{block.id}~{n}"
                    used.add(new_id)
                    current[block.id] = new_id
                    if new_id != block.id:
                        block = ToolCallBlock(new_id, block.name, block.arguments)
                        changed = True
                blocks.append(block)
            out.append(AssistantItem(item.message.with_content(blocks), item.usage) if changed else item)
        elif isinstance(item, ToolResultItem) and current.get(item.call_id, item.call_id) != item.call_id:
            out.append(ToolResultItem(current[item.call_id], item.content, item.is_error, item.name))
        else:
            out.append(item)
    return out


# -- kernel session log ------------------------------------------------------------------------------
def import_kernel(path: Path, run: int | None, lenient: bool) -> Recording:
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
            item = _kernel_item(Event.from_dict(raw))
        except EventError as exc:
            lines.bad(lineno, "a kernel event", str(exc))
            continue
        if item is not None:
            lines.add(items, lineno, item)
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
def import_openai(path: Path, run: int | None, lenient: bool) -> Recording:
    try:
        data = orjson.loads(path.read_bytes())
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
        checker.add(items, at, item)
    recording = Recording(items, source, skipped=skipped)
    if system_parts:
        recording.system = "\n\n".join(system_parts)
    return recording


# -- Claude Code session JSONL -------------------------------------------------------------------------
def import_claude_code(path: Path, run: int | None, lenient: bool) -> Recording:
    lines = Lines(path, lenient)
    by_uuid: dict[str, tuple[int, dict[str, Any]]] = {}
    leaf: str | None = None
    for lineno, raw in lines:
        uuid = raw.get("uuid")
        kind = raw.get("type")
        if not isinstance(kind, str):
            lines.bad(lineno, "a Claude Code line with a string 'type'", str(sorted(raw))[:120])
            continue
        if uuid is None:
            continue  # snapshots, summaries, queue operations: not part of the conversation chain
        if not isinstance(uuid, str):
            lines.bad(lineno, "a string 'uuid'", repr(uuid)[:120])
            continue
        if kind in ("user", "assistant") and not isinstance(raw.get("message"), dict):
            lines.bad(lineno, f"a {kind} line with a 'message' object", str(sorted(raw))[:120])
            continue
        parents = {key: raw.get(key) for key in ("parentUuid", "logicalParentUuid")}
        if not all(value is None or isinstance(value, str) for value in parents.values()):
            lines.bad(lineno, "'parentUuid' and 'logicalParentUuid' as strings or null", repr(parents)[:120])
            continue
        by_uuid[uuid] = (lineno, raw)
        if kind in ("user", "assistant", "system") and not raw.get("isSidechain"):
            leaf = uuid
    chain: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()
    current = leaf
    while current is not None and current in by_uuid and current not in seen:
        seen.add(current)
        entry = by_uuid[current]
        chain.append(entry)
        raw = entry[1]
        # a compact_boundary starts a fresh chain; its logical parent continues the conversation
        current = raw.get("parentUuid") or raw.get("logicalParentUuid")
    chain.reverse()
    items: list[Item] = []
    group: dict[str, Any] | None = None  # the assistant API message being assembled
    deferred: list[tuple[int, ToolResultItem]] = []

    def flush() -> None:
        nonlocal group
        if group is not None:
            message = Message(
                "assistant", tuple(group["blocks"]), Source(kind="model", provider="anthropic", model=group["model"])
            )
            lines.add(items, group["line"], AssistantItem(message, group["usage"]))
            group = None
        for lineno, result in deferred:
            lines.add(items, lineno, result)
        deferred.clear()

    for lineno, raw in chain:
        try:
            group = _claude_line(path, lineno, raw, items, group, deferred, flush, lines)
        except SHAPE_ERRORS as exc:
            lines.bad(lineno, f"a well-formed Claude Code {raw['type']} line", str(exc))
    flush()
    return Recording(items, {}, skipped=lines.skipped)


def _claude_line(
    path: Path,
    lineno: int,
    raw: dict[str, Any],
    items: list[Item],
    group: dict[str, Any] | None,
    deferred: list[tuple[int, ToolResultItem]],
    flush: Callable[[], None],
    lines: Lines,
) -> dict[str, Any] | None:
    """One line of the main chain; returns the assistant message being assembled afterwards."""
    kind = raw["type"]
    if raw.get("isSidechain") or kind == "progress":
        return group
    if kind == "system":
        if raw.get("subtype") == "compact_boundary":
            meta = raw.get("compactMetadata") or {}
            if not isinstance(meta, dict):
                msg = f"compactMetadata must be an object, got {type(meta).__name__}"
                raise EventError(msg)
            flush()
            items.append(
                MarkerItem("compact_boundary", {"trigger": meta.get("trigger"), "pre_tokens": meta.get("preTokens")})
            )
            return None
        return group
    message = raw["message"]
    if kind == "assistant":
        mid = message.get("id") or raw.get("requestId") or raw["uuid"]
        model = message.get("model")
        if not isinstance(mid, str) or not (model is None or isinstance(model, str)):
            msg = f"message.id (or requestId) and message.model must be strings, got {mid!r:.60} and {model!r:.60}"
            raise EventError(msg)
        converted = from_anthropic_message(
            {"role": "assistant", "content": message.get("content") or []}, where="message"
        )
        usage = check_usage(message.get("usage"), "message.usage")
        if group is not None and group["id"] == mid:
            # one API message is written as one line per content block; results of its earlier
            # tool calls may sit between them, and are committed after the whole message
            group["blocks"].extend(converted[0].content)
            group["usage"] = usage or group["usage"]
            group["line"] = lineno
            return group
        flush()
        return {"id": mid, "blocks": list(converted[0].content), "usage": usage, "model": model, "line": lineno}
    if kind != "user":
        return group
    content = message.get("content")
    if raw.get("isCompactSummary"):
        flush()
        items.append(MarkerItem("compact_summary", {"chars": len(content) if isinstance(content, str) else 0}))
        return None
    if (
        isinstance(content, list)
        and content
        and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    ):
        # every block is converted before any is kept: a bad line is refused (or skipped) whole
        results = [m.content[0] for m in from_anthropic_message({"role": "user", "content": content}, where="message")]
        deferred.extend((lineno, ToolResultItem(r.call_id, r.content, r.is_error)) for r in results)  # type: ignore[union-attr]
        if group is None:
            flush()
        return group
    converted = from_anthropic_message(
        {"role": "user", "content": content if content is not None else ""}, where="message"
    )
    flush()
    for m in converted:
        if m.role == "tool":
            r = m.content[0]
            lines.add(items, lineno, ToolResultItem(r.call_id, r.content, r.is_error))  # type: ignore[union-attr]
        elif m.text.strip():
            lines.add(items, lineno, UserItem(m.text, instruction=not raw.get("isMeta")))
    return None


# -- Codex CLI rollout JSONL ---------------------------------------------------------------------------
def import_codex(path: Path, run: int | None, lenient: bool) -> Recording:
    lines = Lines(path, lenient)
    items: list[Item] = []
    blocks: list[Any] = []
    blocks_line = 0
    usage: dict[str, int] | None = None
    pending_usage: dict[str, int] | None = None
    deferred: list[tuple[int, ToolResultItem]] = []
    system: str | None = None
    model: str | None = None

    def flush() -> None:
        nonlocal blocks, usage
        if blocks:
            message = Message("assistant", tuple(blocks), Source(kind="model", provider="openai", model=model))
            lines.add(items, blocks_line, AssistantItem(message, usage))
        blocks, usage = [], None
        for lineno, result in deferred:
            lines.add(items, lineno, result)
        deferred.clear()

    for lineno, raw in lines:
        kind, payload = raw.get("type"), raw.get("payload")
        if not isinstance(kind, str) or not isinstance(payload, dict):
            lines.bad(lineno, "a rollout line {timestamp, type, payload}", str(sorted(raw))[:120])
            continue
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
            if kind != "response_item":
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
                    blocks.append(TextBlock(text))
                    blocks_line = lineno
                else:
                    flush()
                    instruction = role == "user" and not text.lstrip().startswith(
                        ("<environment_context>", "<user_instructions>")
                    )
                    if text.strip():
                        lines.add(items, lineno, UserItem(text, instruction=instruction))
            elif item_type == "reasoning":
                summary = "\n".join(_codex_texts(payload, "summary"))
                if deferred:
                    flush()
                if not blocks and pending_usage is not None:
                    usage, pending_usage = pending_usage, None
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
                deferred.append((lineno, ToolResultItem(call_id, content)))
        except SHAPE_ERRORS as exc:
            lines.bad(lineno, f"a well-formed Codex {kind} line", str(exc))
    flush()
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
def import_swe_agent(path: Path, run: int | None, lenient: bool) -> Recording:
    data = agent_logs.load_json(path)
    if not isinstance(data, dict):
        msg = f"{path}: expected a SWE-agent trajectory object, got a JSON {type(data).__name__}"
        raise RecordingError(msg)
    return agent_logs.import_swe_agent(path, data, Lines(path, lenient))


def import_openhands(path: Path, run: int | None, lenient: bool) -> Recording:
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
        whole = orjson.loads(path.read_bytes())  # one pretty-printed instance
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
    return agent_logs.import_openhands(events, lines, {"run": index, "runs": total}, raw.get("instruction"))


_IMPORTERS: dict[str, Callable[[Path, int | None, bool], Recording]] = {
    "kernel": import_kernel,
    "openai-chat": import_openai,
    "claude-code": import_claude_code,
    "codex": import_codex,
    "swe-agent": import_swe_agent,
    "openhands": import_openhands,
}
