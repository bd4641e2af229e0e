"""Importers: recorded sessions in four formats, read into a :class:`Recording`.

The format is sniffed from the file's content, never from its name:

``kernel``       this kernel's own session log (a jsonl store file: header line, then events)
``openai-chat``  OpenAI chat-completions messages: a JSON list of messages, or a list of runs each
                 holding one (``traj``, ``messages`` or ``trajectory``), picked with ``run``
``claude-code``  Claude Code session JSONL: the main ``parentUuid`` chain from the last line back,
                 progress and sidechain lines skipped, one assistant message per API message id,
                 ``compact_boundary`` kept as a marker
``codex``        Codex CLI rollout JSONL: ``response_item`` messages, reasoning, function calls and
                 outputs; ``token_count`` events give the usage of the reply they belong to

A malformed line raises :class:`RecordingError` naming the file, the line and what was expected;
with ``lenient=True`` it is skipped and listed in ``Recording.skipped``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ..convert import _content_text, arguments_from_json, from_anthropic_message, from_openai_message
from ..errors import EventError
from ..events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, TOOL_RESULT, TURN_END, USER_MESSAGE, Event
from ..messages import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ..session import normalize_usage
from .recording import AssistantItem, Item, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem

FORMATS = ("kernel", "openai-chat", "claude-code", "codex")
_RUN_KEYS = ("traj", "messages", "trajectory")
_CLAUDE_TYPES = frozenset({"user", "assistant", "system", "progress", "summary", "file-history-snapshot", "queue-operation"})
_CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


class _Lines:
    """JSON lines of a file with their numbers; malformed ones raise or are skipped (lenient)."""

    def __init__(self, path: Path, lenient: bool) -> None:
        self.path = path
        self.lenient = lenient
        self.skipped: list[dict[str, Any]] = []

    def bad(self, lineno: int, expected: str, got: str) -> None:
        if self.lenient:
            self.skipped.append({"line": lineno, "expected": expected, "got": got[:200]})
            return
        msg = f"{self.path}:{lineno}: expected {expected}, got {got[:200]}; fix the line or pass --lenient to skip it"
        raise RecordingError(msg)

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    value = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    self.bad(lineno, "one JSON object per line", f"invalid JSON ({exc})")
                    continue
                if not isinstance(value, dict):
                    self.bad(lineno, "a JSON object", type(value).__name__)
                    continue
                yield lineno, value


def sniff(path: str | os.PathLike[str]) -> str:
    """The format of a recording, read from its first bytes (see :data:`FORMATS`)."""
    path = Path(path)
    if not path.is_file():
        msg = f"{path}: no such file; pass a recorded session (kernel log, OpenAI chat JSON, Claude Code or Codex JSONL)"
        raise RecordingError(msg)
    with open(path, "rb") as f:
        head = f.read(65536)
    stripped = head.lstrip()
    if stripped.startswith(b"["):
        return "openai-chat"
    first = stripped.split(b"\n", 1)[0]
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        try:  # a pretty-printed single JSON object ({"messages": [...]})
            obj = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            msg = f"{path}:1: expected a JSON list of chat messages or JSON lines, got {first[:80]!r}"
            raise RecordingError(msg) from None
        if isinstance(obj, dict) and any(k in obj for k in _RUN_KEYS):
            return "openai-chat"
        msg = f"{path}: a JSON object without a messages list is not a recording format this kernel reads"
        raise RecordingError(msg) from None
    if not isinstance(obj, dict):
        msg = f"{path}:1: expected a JSON object, got {type(obj).__name__}"
        raise RecordingError(msg)
    if "format_version" in obj and "id" in obj and "created" in obj:
        return "kernel"
    if {"type", "payload"} <= set(obj) and obj.get("type") in _CODEX_TYPES:
        return "codex"
    if obj.get("type") in _CLAUDE_TYPES or "parentUuid" in obj or "sessionId" in obj:
        return "claude-code"
    if "role" in obj:
        return "openai-chat"
    if any(k in obj for k in _RUN_KEYS):
        return "openai-chat"
    msg = (
        f"{path}:1: cannot tell the format: expected a kernel session header, a Codex rollout line "
        f"({{type, payload}}), a Claude Code line (type, uuid, parentUuid) or chat messages; got keys {sorted(obj)[:12]}"
    )
    raise RecordingError(msg)


def load_recording(path: str | os.PathLike[str], *, run: int | None = None, lenient: bool = False, format: str | None = None) -> Recording:
    """Read a recorded session in any supported format (sniffed unless ``format`` is given)."""
    path = Path(path)
    fmt = format or sniff(path)
    if fmt not in _IMPORTERS:
        msg = f"unknown recording format {fmt!r}; accepted: {list(FORMATS)}"
        raise RecordingError(msg)
    if run is not None and fmt != "openai-chat":
        msg = f"{path}: --run selects one run of an OpenAI chat file holding several; this file is {fmt}"
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
    lines = _Lines(path, lenient)
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
        except EventError as exc:
            lines.bad(lineno, "a kernel event", str(exc))
            continue
        item = _kernel_item(event)
        if item is not None:
            items.append(item)
    return Recording(items, {}, skipped=lines.skipped)


def _kernel_item(event: Event) -> Item | None:
    # only what the harness and the model wrote is replayed; strategy artifacts (checkpoints,
    # notices, replacements) are produced afresh by the profile under test
    if event.type == TURN_END:
        return MarkerItem("turn_end", {"reason": event.data.get("reason")})
    if event.type == COMPACTION_SUMMARY:
        return MarkerItem("compaction", {"strategy": event.data.get("strategy"), "kind": event.data.get("kind")})
    if event.type not in (USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT) or (event.surface or {}).get("op") != "append":
        return None
    message = Message.from_dict(event.data["message"])
    if event.type == USER_MESSAGE:
        if message.source.kind != "user":
            return None
        return UserItem(message.text)
    if event.type == ASSISTANT_MESSAGE:
        return AssistantItem(message, event.data.get("usage"))
    result = message.tool_result
    assert result is not None
    return ToolResultItem(result.call_id, result.content, result.is_error, result.name)


# -- OpenAI chat completions ---------------------------------------------------------------------------
def import_openai(path: Path, run: int | None, lenient: bool) -> Recording:
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        data = None
    source: dict[str, Any] = {}
    if data is None:  # one chat message per line
        lines = _Lines(path, lenient)
        messages = [(f"line {n}", raw) for n, raw in lines]
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
            msg = f"{path}: --run needs a list of runs (objects with 'traj' or 'messages'); this file is one message list"
            raise RecordingError(msg)
        else:
            messages = [(f"message {i}", m) for i, m in enumerate(data)]
    items: list[Item] = []
    system_parts: list[str] = []
    for where, raw in messages:
        try:
            if isinstance(raw, dict) and raw.get("role") in ("system", "developer"):
                system_parts.append(_content_text(raw.get("content"), where))
                continue
            message = from_openai_message(raw, where=f"{path}: {where}")
        except (EventError, AttributeError, TypeError) as exc:
            if lenient:
                skipped.append({"line": where, "expected": "an OpenAI chat message", "got": str(exc)[:200]})
                continue
            msg = f"{path}: {where}: expected an OpenAI chat message {{role, content, tool_calls?}}: {exc}"
            raise RecordingError(msg) from None
        if message is None:
            continue
        if message.role == "user":
            items.append(UserItem(message.text))
        elif message.role == "assistant":
            items.append(AssistantItem(message, normalize_usage(raw.get("usage")) if isinstance(raw.get("usage"), dict) else None))
        else:
            result = message.tool_result
            assert result is not None
            items.append(ToolResultItem(result.call_id, result.content, result.is_error, result.name))
    recording = Recording(items, source, skipped=skipped)
    if system_parts:
        recording.system = "\n\n".join(system_parts)
    return recording


# -- Claude Code session JSONL -------------------------------------------------------------------------
def import_claude_code(path: Path, run: int | None, lenient: bool) -> Recording:
    lines = _Lines(path, lenient)
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
            lines.bad(lineno, "a string 'uuid'", repr(uuid))
            continue
        if kind in ("user", "assistant") and not isinstance(raw.get("message"), dict):
            lines.bad(lineno, f"a {kind} line with a 'message' object", str(sorted(raw))[:120])
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
    deferred: list[ToolResultItem] = []

    def flush() -> None:
        nonlocal group
        if group is not None:
            message = Message("assistant", tuple(group["blocks"]), Source(kind="model", provider="anthropic", model=group["model"]))
            items.append(AssistantItem(message, group["usage"]))
            group = None
        items.extend(deferred)
        deferred.clear()

    for lineno, raw in chain:
        kind = raw["type"]
        if raw.get("isSidechain") or kind == "progress":
            continue
        if kind == "system":
            if raw.get("subtype") == "compact_boundary":
                flush()
                meta = raw.get("compactMetadata") or {}
                items.append(MarkerItem("compact_boundary", {"trigger": meta.get("trigger"), "pre_tokens": meta.get("preTokens")}))
            continue
        message = raw["message"]
        if kind == "assistant":
            mid = message.get("id") or raw.get("requestId") or raw["uuid"]
            try:
                converted = from_anthropic_message({"role": "assistant", "content": message.get("content") or []}, where=f"{path}:{lineno}")
            except (EventError, KeyError, AttributeError, TypeError) as exc:
                lines.bad(lineno, "an assistant message with text, thinking and tool_use blocks", str(exc))
                continue
            usage = normalize_usage(message.get("usage")) if isinstance(message.get("usage"), dict) else None
            if group is None or group["id"] != mid:
                flush()
                group = {"id": mid, "blocks": [], "usage": usage, "model": message.get("model")}
            # one API message is written as one line per content block; results of its earlier
            # tool calls may sit between them, and are committed after the whole message
            group["blocks"].extend(converted[0].content)
            group["usage"] = usage or group["usage"]
            continue
        if kind != "user":
            continue
        content = message.get("content")
        if raw.get("isCompactSummary"):
            flush()
            items.append(MarkerItem("compact_summary", {"chars": len(content) if isinstance(content, str) else 0}))
            continue
        if isinstance(content, list) and content and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            for block in content:
                try:
                    tool = from_anthropic_message({"role": "user", "content": [block]}, where=f"{path}:{lineno}")[0]
                except (EventError, KeyError, TypeError) as exc:
                    lines.bad(lineno, "a tool_result block with tool_use_id and content", str(exc))
                    continue
                result = tool.tool_result
                assert result is not None
                deferred.append(ToolResultItem(result.call_id, result.content, result.is_error))
            if group is None:
                flush()
            continue
        flush()
        try:
            converted = from_anthropic_message({"role": "user", "content": content if content is not None else ""}, where=f"{path}:{lineno}")
        except (EventError, KeyError, TypeError) as exc:
            lines.bad(lineno, "a user message with string or block content", str(exc))
            continue
        for m in converted:
            if m.role == "tool":
                r = m.tool_result
                assert r is not None
                items.append(ToolResultItem(r.call_id, r.content, r.is_error))
            elif m.text.strip():
                items.append(UserItem(m.text, instruction=not raw.get("isMeta")))
    flush()
    return Recording(items, {}, skipped=lines.skipped)


# -- Codex CLI rollout JSONL ---------------------------------------------------------------------------
def import_codex(path: Path, run: int | None, lenient: bool) -> Recording:
    lines = _Lines(path, lenient)
    items: list[Item] = []
    blocks: list[Any] = []
    usage: dict[str, int] | None = None
    pending_usage: dict[str, int] | None = None
    deferred: list[ToolResultItem] = []
    system: str | None = None
    model: str | None = None

    def flush() -> None:
        nonlocal blocks, usage
        if blocks:
            items.append(AssistantItem(Message("assistant", tuple(blocks), Source(kind="model", provider="openai", model=model)), usage))
        blocks, usage = [], None
        items.extend(deferred)
        deferred.clear()

    for lineno, raw in lines:
        kind, payload = raw.get("type"), raw.get("payload")
        if not isinstance(kind, str) or not isinstance(payload, dict):
            lines.bad(lineno, "a rollout line {timestamp, type, payload}", str(sorted(raw))[:120])
            continue
        if kind == "session_meta":
            if isinstance(payload.get("instructions"), str):
                system = payload["instructions"]
            continue
        if kind == "turn_context":
            model = payload.get("model") if isinstance(payload.get("model"), str) else model
            continue
        if kind == "compacted":
            flush()
            items.append(MarkerItem("compact_boundary", {"trigger": "codex"}))
            continue
        if kind == "event_msg":
            if payload.get("type") == "token_count" and isinstance(payload.get("info"), dict):
                last = payload["info"].get("last_token_usage")
                if isinstance(last, dict):
                    found = normalize_usage({k: v for k, v in last.items() if k in ("input_tokens", "cached_input_tokens", "output_tokens")})
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
        try:
            if item_type == "message":
                role = payload.get("role")
                text = "\n".join(
                    str(p.get("text", "")) for p in payload.get("content") or [] if isinstance(p, dict) and "text" in p
                )
                if role == "assistant":
                    if not blocks and pending_usage is not None:
                        usage, pending_usage = pending_usage, None
                    blocks.append(TextBlock(text))
                elif role in ("user", "developer", "system"):
                    flush()
                    instruction = role == "user" and not text.lstrip().startswith(("<environment_context>", "<user_instructions>"))
                    if text.strip():
                        items.append(UserItem(text, instruction=instruction))
                else:
                    lines.bad(lineno, "a message with role user, assistant, developer or system", repr(role))
            elif item_type == "reasoning":
                if deferred:
                    flush()
                if not blocks and pending_usage is not None:
                    usage, pending_usage = pending_usage, None
                summary = "\n".join(
                    str(p.get("text", "")) for p in payload.get("summary") or [] if isinstance(p, dict)
                )
                blocks.append(ReasoningBlock(summary))
            elif item_type in ("function_call", "custom_tool_call", "local_shell_call"):
                if deferred:
                    flush()
                if not blocks and pending_usage is not None:
                    usage, pending_usage = pending_usage, None
                call_id = payload.get("call_id") or payload.get("id")
                name = payload.get("name") or ("shell" if item_type == "local_shell_call" else None)
                if not isinstance(call_id, str) or not isinstance(name, str):
                    lines.bad(lineno, f"a {item_type} with string 'call_id' and 'name'", str(sorted(payload))[:120])
                    continue
                if item_type == "function_call":
                    arguments = _json_arguments(payload.get("arguments"))
                elif item_type == "custom_tool_call":
                    arguments = {"input": payload.get("input", "")}
                else:
                    arguments = {"action": payload.get("action")}
                blocks.append(ToolCallBlock(call_id, name, arguments))
            elif item_type in ("function_call_output", "custom_tool_call_output"):
                call_id = payload.get("call_id")
                if not isinstance(call_id, str):
                    lines.bad(lineno, f"a {item_type} with a string 'call_id'", str(sorted(payload))[:120])
                    continue
                output = payload.get("output")
                if isinstance(output, dict):
                    output = output.get("content", orjson.dumps(output).decode())
                deferred.append(ToolResultItem(call_id, output if isinstance(output, str) else orjson.dumps(output).decode()))
        except (TypeError, AttributeError) as exc:
            lines.bad(lineno, f"a well-formed {item_type} response item", str(exc))
    flush()
    recording = Recording(items, {}, skipped=lines.skipped)
    if system:
        recording.system = system
    return recording


def _json_arguments(raw: Any) -> dict[str, Any]:
    # lenient, unlike convert's: a recording with odd arguments still replays
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        return arguments_from_json(raw)
    return {}


_IMPORTERS: dict[str, Callable[[Path, int | None, bool], Recording]] = {
    "kernel": import_kernel,
    "openai-chat": import_openai,
    "claude-code": import_claude_code,
    "codex": import_codex,
}
