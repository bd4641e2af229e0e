"""Importers for benchmark agents' logs: SWE-agent trajectories and OpenHands event logs.

``swe-agent``  a SWE-agent ``.traj`` file (one JSON object). Its ``history`` (the chat the model
               saw) is replayed: ``system`` messages become the system prompt; an assistant
               message's ``tool_calls`` (function calling) are its calls, answered by the ``tool``
               messages naming them in ``tool_call_ids``; an assistant message with an ``action``
               and no ``tool_calls`` (the thought/action parsers) becomes one ``bash`` call with
               that command, answered by the observation that follows it; other user messages are
               instructions (the first is the task) and ``is_demo`` messages (demonstrations) are
               replayed as context, not instructions. Older trajectories mark no ``message_type``:
               the user message right after an action is its observation, and an action the
               history leaves unanswered (``submit``) takes its ``trajectory`` step's observation. A file without a ``history`` replays its
               ``trajectory``: the messages before the first reply in step 0's ``query``, then
               per step the ``thought`` with one ``bash`` call of its ``action`` and its
               ``observation``. SWE-agent records no per-request usage.
``openhands``  an OpenHands event log: the event-stream JSON (a list of serialized events, as
               ``event_to_dict`` writes them) or the JSONL of a benchmark run (one instance a line,
               its events under ``history``; ``--run N`` picks line N, default 0). A user
               ``message`` action is a user message, an agent ``message`` action a reply, the
               ``system`` action the system prompt; every other agent action is a tool call: with
               ``tool_call_metadata`` its ``tool_call_id`` and ``function_name``, the arguments the
               model wrote (``model_response``), actions of one model response in one reply with its
               ``usage``; without it a call named after the action with its ``args``. An
               observation answers the action its ``cause`` names (``error`` observations as
               errors; a command's ``exit_code`` appended as the model saw it); observations of
               nothing the replay called (``recall``, ``agent_state_changed``, ...) are skipped;
               a ``condensation`` action is kept as a ``compact_boundary`` marker. The V1 SDK's
               events (``kind``: ``ActionEvent``, ``ObservationEvent``, ``MessageEvent``, ...) are
               read as well, the calls of one ``llm_response_id`` forming one reply; an instance
               whose history opens with the agent's work is told its ``instruction`` first.

Both are hostile input like every recording: each message or event is checked, a bad one is an
import error naming the file, the position and what is accepted (or skipped with ``--lenient``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import EventError
from ..jsonbytes import loads
from ..messages import Message, Source, TextBlock, ToolCallBlock
from .reading import SHAPE_ERRORS, Lines, check_usage, json_arguments, parse_time, read_document
from .recording import AssistantItem, Item, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem

#: OpenHands actions that are conversation, not tool calls
_OH_TEXT_ACTIONS = frozenset({"message", "system"})
#: OpenHands actions that are bookkeeping of the harness (neither a message nor a tool call)
_OH_SKIPPED_ACTIONS = frozenset({"change_agent_state", "null", "recall", "start"})
#: argument keys of an OpenHands action that describe it rather than carry the model's arguments
_OH_META_ARGS = frozenset({"thought", "impl_source", "security_risk", "confirmation_state", "hidden", "is_static"})
_SWE_SHELL = "bash"
#: V1 (software-agent SDK) event kinds the model sees, by role (the SDK's LLM-convertible events)
_OH1_RESULTS = frozenset({"ObservationEvent", "AgentErrorEvent", "UserRejectObservation"})
#: how every V1 event class is named; anything else in ``kind`` is not an SDK event
_OH1_KIND_SUFFIXES = ("Event", "Observation", "Condensation", "Request")


def _text(value: Any, where: str) -> str:
    """A message content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if isinstance(part, dict) and part.get("type", "text") == "text":
                text = part.get("text", "")
                if not isinstance(text, str):
                    msg = f"{where}.content[{i}].text must be a string, got {type(text).__name__} {text!r:.60}"
                    raise EventError(msg)
                parts.append(text)
            elif not isinstance(part, dict):
                msg = f"{where}.content[{i}] must be an object, got {type(part).__name__}"
                raise EventError(msg)
        return "\n".join(parts)
    msg = f"{where}.content must be a string or a list of text parts, got {type(value).__name__}"
    raise EventError(msg)


def _string(raw: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        msg = f"{where}.{key} must be a string, got {type(value).__name__} {value!r:.60}"
        raise EventError(msg)
    return value


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if raw is not None and not isinstance(raw, str | dict):
        msg = f"{where}.arguments must be a JSON string or an object, got {type(raw).__name__}"
        raise EventError(msg)
    return json_arguments(raw)


def _openai_calls(raw: Any, where: str) -> list[ToolCallBlock]:
    """OpenAI-style ``tool_calls`` ({id, function: {name, arguments}}) as call blocks."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        msg = f"{where}.tool_calls must be a list, got {type(raw).__name__}"
        raise EventError(msg)
    calls = []
    for i, call in enumerate(raw):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            msg = f"{at} must be an object with a 'function' object"
            raise EventError(msg)
        call_id = _string(call, "id", at, required=True)
        name = _string(call["function"], "name", f"{at}.function", required=True)
        calls.append(ToolCallBlock(str(call_id), str(name), _arguments(call["function"].get("arguments"), at)))
    return calls


def _assistant(text: str, calls: list[ToolCallBlock], model: str | None = None) -> Message:
    blocks: list[Any] = [TextBlock(text)] if text.strip() else []
    return Message("assistant", (*blocks, *calls), Source(kind="model", model=model))


# -- SWE-agent ------------------------------------------------------------------------------------------
def is_swe_agent(obj: Any) -> bool:
    """A SWE-agent trajectory: an object whose ``history`` holds ``message_type`` messages, or whose
    ``trajectory`` holds steps with an ``action`` and an ``observation``."""
    if not isinstance(obj, dict):
        return False
    history, steps = obj.get("history"), obj.get("trajectory")
    if isinstance(history, list) and any(isinstance(m, dict) and "message_type" in m for m in history[:5]):
        return True
    return isinstance(steps, list) and any(
        isinstance(s, dict) and "action" in s and "observation" in s for s in steps[:5]
    )


def import_swe_agent(path: Path, data: dict[str, Any], lines: Lines) -> Recording:
    history = data.get("history")
    if isinstance(history, list) and history:
        steps = data.get("trajectory")
        return _swe_history(history, lines, "history", steps if isinstance(steps, list) else None)
    steps = data.get("trajectory")
    if not isinstance(steps, list):
        msg = f"{path}: expected a SWE-agent trajectory with a 'history' or 'trajectory' list, got keys {sorted(data)[:12]}"
        raise RecordingError(msg)
    return _swe_trajectory(steps, lines)


def _swe_history(history: list[Any], lines: Lines, key: str, steps: list[Any] | None = None) -> Recording:
    items: list[Item] = []
    system: list[str] = []
    pending: list[str] = []  # call ids of the last assistant message still unanswered
    synthetic = 0
    # the older generation marks no message_type: an action's observation is the user message that
    # follows it; the newer one marks observations, and a plain user message is an instruction
    typed = any(isinstance(m, dict) and "message_type" in m for m in history)
    observations = _StepObservations(steps)
    for i, raw in enumerate(history):
        where = f"{key}[{i}]"
        try:
            if not isinstance(raw, dict):
                msg = f"{where} must be an object, got {type(raw).__name__}"
                raise EventError(msg)
            role = raw.get("role")
            text = _text(raw.get("content"), where)
            is_observation = raw.get("message_type") == "observation" if typed else not _flag(raw.get("is_demo"))
            if role == "system":
                system.append(text)
            elif role == "assistant":
                _swe_answer_from_steps(items, lines, where, pending, observations)
                calls = _openai_calls(raw.get("tool_calls"), where)
                action = _string(raw, "action", where)
                if not calls and action and action.strip():
                    synthetic += 1
                    calls = [ToolCallBlock(f"swe_{synthetic:05d}", _SWE_SHELL, {"command": action})]
                    thought = _string(raw, "thought", where)
                    text = thought if thought is not None else text
                lines.add(items, where, AssistantItem(_assistant(text, calls)))
                pending = [c.id for c in calls]
                if calls and not raw.get("tool_calls"):
                    observations.pop_action(action)
            elif role == "tool" or (role == "user" and is_observation and pending):
                ids = raw.get("tool_call_ids")
                if ids is None:
                    ids = pending[:1]
                if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids) or not ids:
                    msg = f"{where}.tool_call_ids must be a non-empty list of call ids, got {ids!r:.60}"
                    raise EventError(msg)
                for call_id in ids:
                    lines.add(items, where, ToolResultItem(call_id, text))
                pending = [p for p in pending if p not in ids]
            elif role == "user":
                lines.add(items, where, UserItem(text, instruction=not _flag(raw.get("is_demo"))))
            else:
                msg = f"{where}.role must be 'system', 'user', 'assistant' or 'tool', got {role!r:.60}"
                raise EventError(msg)
        except SHAPE_ERRORS as exc:
            lines.bad(where, "a SWE-agent history message {role, content, message_type}", str(exc))
    _swe_answer_from_steps(items, lines, f"{key}[end]", pending, observations)
    recording = Recording(items, {}, skipped=lines.skipped)
    if system:
        recording.system = "\n\n".join(system)
    return recording


def _flag(value: Any) -> bool:
    """A SWE-agent boolean: older files write ``is_demo`` as the string ``"True"``."""
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


class _StepObservations:
    """The ``trajectory`` steps' observations in order, for the actions ``history`` leaves unanswered
    (the last action of a run, ``submit`` say, is answered only in its step)."""

    def __init__(self, steps: list[Any] | None) -> None:
        self.steps = [s for s in steps or [] if isinstance(s, dict)]
        self.at = 0
        self.last: str | None = None

    def pop_action(self, action: str | None) -> None:
        """Move past the step of ``action`` (history and trajectory hold the same actions in order)."""
        self.last = None
        if self.at < len(self.steps) and self.steps[self.at].get("action") == action:
            observation = self.steps[self.at].get("observation")
            self.last = observation if isinstance(observation, str) else None
            self.at += 1


def _swe_answer_from_steps(
    items: list[Item], lines: Lines, where: str, pending: list[str], observations: _StepObservations
) -> None:
    """Answer a still-pending action with its trajectory step's observation, when the step has one."""
    if len(pending) == 1 and observations.last is not None:
        lines.add(items, where, ToolResultItem(pending[0], observations.last))
        pending.clear()
    observations.last = None


def _swe_trajectory(steps: list[Any], lines: Lines) -> Recording:
    items: list[Item] = []
    system: list[str] = []
    for i, step in enumerate(steps):
        where = f"trajectory[{i}]"
        try:
            if not isinstance(step, dict):
                msg = f"{where} must be an object, got {type(step).__name__}"
                raise EventError(msg)
            if i == 0:
                query = step.get("query") or []
                if not isinstance(query, list):
                    msg = f"{where}.query must be a list of messages, got {type(query).__name__}"
                    raise EventError(msg)
                for j, message in enumerate(query):
                    if not isinstance(message, dict) or message.get("role") == "assistant":
                        break
                    text = _text(message.get("content"), f"{where}.query[{j}]")
                    if message.get("role") == "system":
                        system.append(text)
                    else:
                        lines.add(items, f"{where}.query[{j}]", UserItem(text))
            thought = _string(step, "thought", where) or ""
            action = _string(step, "action", where) or ""
            observation = _string(step, "observation", where) or ""
            call = ToolCallBlock(f"swe_{i + 1:05d}", _SWE_SHELL, {"command": action})
            lines.add(items, where, AssistantItem(_assistant(thought, [call] if action.strip() else [])))
            if action.strip():
                lines.add(items, where, ToolResultItem(call.id, observation))
        except SHAPE_ERRORS as exc:
            lines.bad(where, "a SWE-agent trajectory step {thought, action, observation}", str(exc))
    recording = Recording(items, {}, skipped=lines.skipped)
    if system:
        recording.system = "\n\n".join(system)
    return recording


# -- OpenHands --------------------------------------------------------------------------------------------
def is_openhands_event(obj: Any) -> bool:
    """An OpenHands event of either generation (V0 ``action``/``observation``, V1 ``kind``)."""
    return is_openhands_v1_event(obj) or (
        isinstance(obj, dict) and ("action" in obj or "observation" in obj) and "source" in obj
    )


def is_openhands_v1_event(obj: Any) -> bool:
    """An event of the V1 software-agent SDK: a ``kind`` naming an event class, with an ``id`` and a ``source``."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("kind"), str)
        and obj["kind"].endswith(_OH1_KIND_SUFFIXES)
        and "id" in obj
        and "source" in obj
    )


def is_openhands_instance(obj: Any) -> bool:
    """A line of an OpenHands benchmark run: an instance with a ``history`` of events."""
    if not isinstance(obj, dict) or "instance_id" not in obj or not isinstance(obj.get("history"), list):
        return False
    first = next(iter(obj["history"]), None)
    if isinstance(first, list):  # older runs: [action, observation] pairs
        first = next(iter(first), None)
    return first is None or is_openhands_event(first)


def openhands_events(history: list[Any], where: str) -> list[tuple[str, Any]]:
    """``(position, event)`` of a history, flattening the older ``[action, observation]`` pairs."""
    out: list[tuple[str, Any]] = []
    for i, entry in enumerate(history):
        if isinstance(entry, list):
            out += [(f"{where}[{i}][{j}]", e) for j, e in enumerate(entry[:2])]
        else:
            out.append((f"{where}[{i}]", entry))
    return out


def import_openhands(
    events: list[tuple[str, Any]], lines: Lines, source: dict[str, Any], instruction: Any = None
) -> Recording:
    """An OpenHands history; ``instruction`` is a benchmark instance's task, replayed first when the
    history itself opens with the agent's work (V1 evaluation output records the task beside it)."""
    recording = _import_openhands_events(events, lines, source)
    first_reply = next((i for i, item in enumerate(recording.items) if isinstance(item, AssistantItem)), None)
    told = any(isinstance(item, UserItem) and item.instruction for item in recording.items[:first_reply])
    if not told and isinstance(instruction, str) and instruction.strip():
        recording.items.insert(0, UserItem(instruction))
    return recording


def check_instruction(raw: dict[str, Any], lineno: int, lines: Lines) -> Any:
    """A benchmark instance's ``instruction``: a string, or absent; anything else is refused (or
    skipped and counted with ``lenient``), never ignored without a word."""
    instruction = raw.get("instruction")
    if instruction is None or isinstance(instruction, str):
        return instruction
    lines.bad(lineno, "an instance whose instruction is a string", f"instruction {instruction!r:.60}")
    return None


def _import_openhands_events(events: list[tuple[str, Any]], lines: Lines, source: dict[str, Any]) -> Recording:
    items: list[Item] = []
    system: list[str] = []
    calls_of: dict[int, str] = {}  # action event id -> the call id the replay gave it
    group: dict[str, Any] | None = None  # one model response's actions, being assembled
    bookkeeping = 0

    if any(is_openhands_v1_event(event) for _, event in events[:20]):
        return _import_openhands_v1(events, lines, source)

    def flush() -> None:
        nonlocal group
        if group is not None:
            message = _assistant(group["text"], group["calls"], group["model"])
            lines.add(items, group["where"], AssistantItem(message, group["usage"], group["time"]))
            for where, result in group["results"]:
                lines.add(items, where, result)
            group = None

    for where, event in events:
        try:
            if not isinstance(event, dict):
                msg = f"{where} must be an event object, got {type(event).__name__}"
                raise EventError(msg)
            if "action" in event:
                if event.get("action") in _OH_SKIPPED_ACTIONS:
                    bookkeeping += 1
                group = _oh_action(event, where, items, system, calls_of, group, flush, lines, check_usage)
            elif "observation" in event:
                result = _oh_observation(event, where, calls_of)
                if result is None:
                    bookkeeping += 1  # recall, state changes, ...: nothing the replay called
                    continue
                if group is not None and result.call_id in group["ids"]:
                    group["results"].append((where, result))  # answers come after the whole reply
                else:
                    flush()
                    lines.add(items, where, result)
            else:
                msg = f"{where} must have an 'action' or an 'observation', got keys {sorted(event)[:12]}"
                raise EventError(msg)
        except SHAPE_ERRORS as exc:
            lines.bad(where, "an OpenHands event {id, source, action|observation, ...}", str(exc))
    flush()
    recording = Recording(items, source, skipped=lines.skipped)
    if bookkeeping:
        recording.not_replayed["harness_bookkeeping"] = bookkeeping
    if system:
        recording.system = "\n\n".join(system)
    return recording


def _oh_action(
    event: dict[str, Any],
    where: str,
    items: list[Item],
    system: list[str],
    calls_of: dict[int, str],
    group: dict[str, Any] | None,
    flush: Any,
    lines: Lines,
    check_usage: Any,
) -> dict[str, Any] | None:
    kind = str(_string(event, "action", where, required=True))
    args = event.get("args") or {}
    if not isinstance(args, dict):
        msg = f"{where}.args must be an object, got {type(args).__name__}"
        raise EventError(msg)
    source = event.get("source")
    if kind in _OH_SKIPPED_ACTIONS:
        return group
    if kind == "system":
        system.append(_text(args.get("content"), f"{where}.args"))
        return group
    if kind == "condensation":
        flush()
        lines.add(items, where, MarkerItem("compact_boundary", {"harness": "openhands"}))
        return None
    when = parse_time(event.get("timestamp"))
    if kind in _OH_TEXT_ACTIONS:
        text = _text(args.get("content", event.get("message")), f"{where}.args")
        flush()
        if source == "user":
            lines.add(items, where, UserItem(text, time=when))
        else:
            lines.add(items, where, AssistantItem(_assistant(text, []), time=when))
        return None
    event_id = event.get("id")
    if not isinstance(event_id, int) or isinstance(event_id, bool):
        msg = f"{where}.id must be an integer event id, got {event_id!r:.60}"
        raise EventError(msg)
    meta = event.get("tool_call_metadata")
    thought: str = args["thought"] if isinstance(args.get("thought"), str) else ""
    if meta is None:
        call_id, name = f"oh_{event_id}", kind
        arguments = {k: v for k, v in args.items() if k not in _OH_META_ARGS}
        response_id, text, usage, model = None, thought, None, None
    else:
        if not isinstance(meta, dict):
            msg = f"{where}.tool_call_metadata must be an object, got {type(meta).__name__}"
            raise EventError(msg)
        call_id = str(_string(meta, "tool_call_id", f"{where}.tool_call_metadata", required=True))
        name = str(_string(meta, "function_name", f"{where}.tool_call_metadata", required=True))
        response = meta.get("model_response") or {}
        if not isinstance(response, dict):
            msg = f"{where}.tool_call_metadata.model_response must be an object, got {type(response).__name__}"
            raise EventError(msg)
        response_id = response.get("id") if isinstance(response.get("id"), str) else None
        model = response.get("model") if isinstance(response.get("model"), str) else None
        usage = check_usage(response.get("usage"), f"{where}.tool_call_metadata.model_response.usage")
        text, arguments = thought, {k: v for k, v in args.items() if k not in _OH_META_ARGS}
        choices = response.get("choices") or []
        message = (
            choices[0].get("message")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict)
            else None
        )
        if isinstance(message, dict):
            text = _text(message.get("content"), f"{where}.tool_call_metadata.model_response.choices[0].message")
            for call in _openai_calls(message.get("tool_calls"), f"{where}.tool_call_metadata.model_response"):
                if call.id == call_id:
                    arguments = call.arguments
    calls_of[event_id] = call_id
    block = ToolCallBlock(call_id, name, arguments)
    if group is not None and response_id is not None and group["response"] == response_id:
        group["calls"].append(block)
        group["ids"].add(block.id)
        return group
    flush()
    return {
        "response": response_id,
        "where": where,
        "text": text,
        "calls": [block],
        "ids": {block.id},
        "usage": usage,
        "model": model,
        "results": [],
        "time": when,
    }


def _oh_observation(event: dict[str, Any], where: str, calls_of: dict[int, str]) -> ToolResultItem | None:
    kind = _string(event, "observation", where, required=True)
    cause = event.get("cause")
    if cause is not None and (not isinstance(cause, int) or isinstance(cause, bool)):
        # an event id is an integer (as each action's own id): 2.0 or "2" names no action
        msg = f"{where}.cause must be the integer id of the action it answers, got {cause!r:.60}"
        raise EventError(msg)
    call_id = calls_of.get(cause) if cause is not None else None
    if call_id is None:
        return None  # recall, state changes, ...: nothing the replay called
    content = _text(event.get("content"), where)
    extras = event.get("extras") or {}
    metadata = extras.get("metadata") if isinstance(extras, dict) else None
    exit_code = metadata.get("exit_code") if isinstance(metadata, dict) else None
    if isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != -1:
        content += f"\n[Command finished with exit code {exit_code}]"
    return ToolResultItem(call_id, content, is_error=kind == "error")


def _import_openhands_v1(events: list[tuple[str, Any]], lines: Lines, source: dict[str, Any]) -> Recording:
    """V1 SDK events: one ``ActionEvent`` per tool call, the calls of one model response sharing
    its ``llm_response_id``; observations name their ``tool_call_id``; events the SDK never shows the
    model (state updates, pauses, condensation requests, ...) are not replayed."""
    items: list[Item] = []
    system: list[str] = []
    group: dict[str, Any] | None = None  # one model response's calls, being assembled
    not_replayed: dict[str, int] = {}

    def flush() -> None:
        nonlocal group
        if group is not None:
            message = _assistant(group["text"], group["calls"])
            lines.add(items, group["where"], AssistantItem(message, time=group["time"]))
            for where, result in group["results"]:
                lines.add(items, where, result)
            group = None

    for where, event in events:
        try:
            if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
                msg = f"{where} must be an event object with a 'kind', got {type(event).__name__}"
                raise EventError(msg)
            kind = event["kind"]
            if kind == "ActionEvent":
                response = _string(event, "llm_response_id", where)
                block = _oh1_call(event, where)
                if group is not None and response is not None and group["response"] == response:
                    group["calls"].append(block)
                    group["ids"].add(block.id)
                    continue
                flush()
                text = _text(event.get("thought"), f"{where}.thought")
                when = parse_time(event.get("timestamp"))
                group = {
                    "response": response,
                    "where": where,
                    "text": text,
                    "calls": [block],
                    "ids": {block.id},
                    "results": [],
                    "time": when,
                }
            elif kind in _OH1_RESULTS:
                result = _oh1_result(event, where)
                if group is not None and result.call_id in group["ids"]:
                    group["results"].append((where, result))  # answers come after the whole reply
                else:
                    flush()
                    lines.add(items, where, result)
            elif kind == "MessageEvent":
                flush()
                _oh1_message(event, where, items, lines)
            elif kind == "SystemPromptEvent":
                prompt = event.get("system_prompt")
                system.append(_text([prompt] if isinstance(prompt, dict) else prompt, f"{where}.system_prompt"))
            elif kind == "Condensation":
                flush()
                lines.add(items, where, MarkerItem("compact_boundary", {"harness": "openhands"}))
            elif kind == "CondensationSummaryEvent":
                flush()
                summary = event.get("summary")
                chars = len(summary) if isinstance(summary, str) else 0
                lines.add(items, where, MarkerItem("compact_summary", {"chars": chars}))
            else:
                # state updates, pauses, condensation requests: the SDK never shows them to the model
                reason = "harness_bookkeeping" if kind.endswith(_OH1_KIND_SUFFIXES) else "unknown_type"
                not_replayed[reason] = not_replayed.get(reason, 0) + 1
        except SHAPE_ERRORS as exc:
            lines.bad(where, "an OpenHands V1 event {kind, id, source, ...}", str(exc))
    flush()
    recording = Recording(items, source, skipped=lines.skipped)
    recording.not_replayed = not_replayed
    if system:
        recording.system = "\n\n".join(system)
    return recording


def _oh1_call(event: dict[str, Any], where: str) -> ToolCallBlock:
    """An ``ActionEvent`` as the call the model made: its ``tool_call`` (arguments as the model
    wrote them), else the action's own fields."""
    call_id = str(_string(event, "tool_call_id", where, required=True))
    name = str(_string(event, "tool_name", where, required=True))
    call = event.get("tool_call")
    if isinstance(call, dict) and "arguments" in call:
        return ToolCallBlock(call_id, name, _arguments(call["arguments"], f"{where}.tool_call"))
    action = event.get("action")
    if not isinstance(action, dict):
        msg = f"{where} needs a 'tool_call' or an 'action' object, got {type(action).__name__}"
        raise EventError(msg)
    return ToolCallBlock(call_id, name, {k: v for k, v in action.items() if k != "kind"})


#: fields of a V1 observation that hold what the model was shown, in the order they are tried
_OH1_OBSERVATION_TEXT = ("output", "content", "message")


def _oh1_result(event: dict[str, Any], where: str) -> ToolResultItem:
    call_id = str(_string(event, "tool_call_id", where, required=True))
    name = _string(event, "tool_name", where)
    kind = event["kind"]
    if kind == "AgentErrorEvent":
        return ToolResultItem(call_id, str(_string(event, "error", where, required=True)), True, name)
    if kind == "UserRejectObservation":
        reason = _string(event, "rejection_reason", where) or "User rejected the action"
        return ToolResultItem(call_id, f"Action rejected: {reason}", True, name)
    observation = event.get("observation")
    if not isinstance(observation, dict):
        msg = f"{where}.observation must be an object, got {type(observation).__name__}"
        raise EventError(msg)
    at = f"{where}.observation"
    key = next((k for k in _OH1_OBSERVATION_TEXT if observation.get(k) is not None), None)
    text = _text(observation[key], f"{at}.{key}") if key else ""
    error = observation.get("error")
    if isinstance(error, str) and error:
        text = f"{text}\n{error}" if text else error
    metadata = observation.get("metadata")
    exit_code = metadata.get("exit_code") if isinstance(metadata, dict) else observation.get("exit_code")
    if isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != -1:
        text += f"\n[Command finished with exit code {exit_code}]"
    return ToolResultItem(call_id, text, is_error=bool(error), name=name)


def _oh1_message(event: dict[str, Any], where: str, items: list[Item], lines: Lines) -> None:
    message = event.get("llm_message")
    if not isinstance(message, dict):
        msg = f"{where}.llm_message must be an object, got {type(message).__name__}"
        raise EventError(msg)
    at = f"{where}.llm_message"
    text = _text(message.get("content"), at)
    role = message.get("role")
    when = parse_time(event.get("timestamp"))
    if role == "user":
        extended = _text(event.get("extended_content"), f"{where}.extended_content")
        if text.strip():
            lines.add(items, where, UserItem(text, time=when))
        if extended.strip():  # context the harness added to the message (skills, knowledge)
            lines.add(items, where, UserItem(extended, instruction=False, time=when))
    elif role == "assistant":
        lines.add(items, where, AssistantItem(_assistant(text, []), time=when))
    elif role == "system":
        msg = f"{at}.role 'system' belongs in a SystemPromptEvent"
        raise EventError(msg)
    else:
        msg = f"{at}.role must be 'user' or 'assistant', got {role!r:.60}"
        raise EventError(msg)


def load_json(path: Path) -> Any:
    try:
        return loads(read_document(path))
    except orjson.JSONDecodeError as exc:
        msg = f"{path}: expected one JSON document, got invalid JSON ({exc})"
        raise RecordingError(msg) from None
