"""Model-callable tools: definitions, argument validation and the per-session registry.

A strategy contributes tools through the ``register_tools`` hook. Arguments are validated with
the tool's pydantic model before the handler runs: a bad argument becomes an error tool result
that says what was wrong and what is accepted. It never raises into the harness, and since the
handler never ran, nothing was written.

Arguments come from the model, so they are hostile: every numeric argument of a shipped tool has
pydantic bounds (:data:`MAX_INT_ARG` at most) and every string a maximum length, and the bounds
appear in the JSON schema the model sees. Whatever a handler raises despite that becomes an error
outcome too (logged with its traceback); :meth:`ToolRegistry.run` never raises.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import CtxKernelError, PluginConflictError, ToolError
from .logging import get_logger
from .messages import ToolCallBlock
from .text import clip

if TYPE_CHECKING:
    from .context import Context
    from .ports import SessionPort


log = get_logger("ctxkernel.tools")

#: The largest integer argument a shipped tool accepts: nine digits, more than any session's seqs,
#: any note's or item's characters or any anchor id, and short (the bound is sent with every
#: request). Seqs, offsets and ids are bounded by it, so no arithmetic, ``int()`` or ``repr`` of
#: a model-sent number can blow up (Python refuses to print ints past 4,300 digits).
MAX_INT_ARG = 999_999_999


class ToolArgs(BaseModel):
    """Base for tool argument models: unknown arguments are refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass(slots=True)
class ToolOutcome:
    """What a tool returns to the kernel.

    ``conclude_turn`` ends the turn after the current batch of tool calls; ``defer_message`` is
    shown to the model as a plugin notice at the next step (docs/design/host-model.md §5). ``continue_in`` is
    the id of a child session (same store) in which the conversation continues after this batch
    (e.g. ``chapters_continue``): a harness, and ``ctxkernel simulate``, opens it with
    ``kernel.open_session(id)`` and sends the next request from there.
    """

    content: str
    is_error: bool = False
    conclude_turn: bool = False
    defer_message: str | None = None
    continue_in: str | None = None


#: a tool handler: ``handler(ctx, args)`` with the session's :class:`ctxkernel.Context` and the
#: validated arguments
Handler = Callable[["Context", Any], "ToolOutcome | str"]


@dataclass(slots=True)
class Tool:
    name: str
    description: str
    parameters: type[BaseModel]
    handler: Handler
    strategy: str = ""
    distribution: str = ""
    _schema: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum() or len(self.name) > 64:
            msg = f"tool name {self.name!r} must be 1-64 letters, digits or underscores"
            raise ToolError(msg)

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema (``{"type": "function", "function": {...}}``)."""
        if self._schema is None:
            params = copy.deepcopy(_json_schema(self.parameters))
            params.pop("title", None)
            self._schema = {
                "type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": params},
            }
        return self._schema


@functools.cache
def _json_schema(parameters: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments model, derived once per process: pydantic takes
    about half a millisecond per model, and every new kernel registers its strategies' tools
    again. Callers copy it before changing it."""
    return parameters.model_json_schema()


def compact_schema(node: Any) -> Any:
    """A JSON schema without what a model does not need: titles, ``additionalProperties``, null
    branches of optional arguments and null defaults; a union of plain types becomes a type list.
    Tool schemas go with every request and count against the window, so this is worth their tokens."""
    if isinstance(node, list):
        return [compact_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "additionalProperties") or (key == "default" and value is None):
            continue
        if key == "anyOf" and isinstance(value, list):
            branches = [b for b in value if b != {"type": "null"}]
            if len(branches) == 1:
                out.update(compact_schema(branches[0]))
                continue
            if _mergeable(branches):
                # bounds are type-specific keywords (minimum applies to numbers, maxLength to
                # strings): one type list with all of them says the same in fewer tokens
                out["type"] = [b["type"] for b in branches]
                for branch in branches:
                    out.update({k: compact_schema(v) for k, v in branch.items() if k not in ("type", "title")})
                continue
            value = branches
        out[key] = compact_schema(value)
    return out


_STRING_KEYS = frozenset({"minLength", "maxLength", "pattern", "format"})
_NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})


def _mergeable(branches: list[Any]) -> bool:
    """Plain-typed branches whose other keywords each apply to one JSON type only."""
    if not all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in branches):
        return False
    types = [b["type"] for b in branches]
    if len(set(types)) != len(types):
        return False
    allowed = {"string": _STRING_KEYS, "integer": _NUMBER_KEYS, "number": _NUMBER_KEYS, "boolean": frozenset()}
    return all(b["type"] in allowed and set(b) - {"type", "title"} <= allowed[b["type"]] for b in branches) and not (
        "integer" in types and "number" in types
    )


class CompactTool(Tool):
    """A tool whose schema is :func:`compact_schema` of the pydantic one (validation is unchanged:
    arguments are still checked against the full pydantic model)."""

    def schema(self) -> dict[str, Any]:
        if self._schema is None:
            # compact_schema builds new dicts and lists (it drops the titles too), so the process's
            # schema of the model is not shared and needs no deep copy first (most of a new
            # kernel's first request header)
            self._schema = {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": compact_schema(_json_schema(self.parameters)),
                },
            }
        return self._schema


def preview(value: Any, limit: int = 60) -> str:
    """A short, always printable ``repr`` of a model-sent value (a huge int has no repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails is described by its type
        return f"<a {type(value).__name__}>"
    return clip(text, limit)


def _accepts(spec: Any, defs: dict[str, Any], depth: int = 0) -> str:
    """One schema property as a model reads it: ``integer (0..20000)``, ``string (1-256 chars)``,
    ``array (at most 64 items) of {from: ..., to: ...}``."""
    if not isinstance(spec, dict):
        return "any"
    if "$ref" in spec:
        spec = defs.get(str(spec["$ref"]).rsplit("/", 1)[-1], {})
    if "anyOf" in spec:
        return " or ".join(_accepts(b, defs, depth) for b in spec["anyOf"] if b != {"type": "null"}) or "null"
    if "enum" in spec:
        return "|".join(repr(v) for v in spec["enum"])
    if "const" in spec:
        return repr(spec["const"])
    kind = spec.get("type", "object" if "properties" in spec else "any")
    if isinstance(kind, list):
        kind = " or ".join(str(k) for k in kind if k != "null")
    bounds = []
    lo, hi = spec.get("minimum"), spec.get("maximum")
    if lo is not None or hi is not None:
        bounds.append(f"{'' if lo is None else lo}..{'' if hi is None else hi}")
    if spec.get("maxLength") is not None:
        bounds.append(f"{spec.get('minLength', 0)}-{spec['maxLength']} chars")
    if spec.get("maxItems") is not None:
        bounds.append(f"at most {spec['maxItems']} items")
    text = f"{kind} ({', '.join(bounds)})" if bounds else str(kind)
    if "properties" in spec and depth < 2:
        text = "{" + ", ".join(f"{k}: {_accepts(v, defs, depth + 1)}" for k, v in spec["properties"].items()) + "}"
    if spec.get("items") and depth < 2:
        text += " of " + _accepts(spec["items"], defs, depth + 1)
    return text


#: problems listed in one refusal (a 1,000-item list can have 1,000; the first ones say enough)
MAX_PROBLEMS = 8


def describe_validation_error(tool: Tool, exc: ValidationError) -> str:
    """Say which arguments were wrong and what the tool accepts."""
    problems = []
    errors = exc.errors()
    for err in errors[:MAX_PROBLEMS]:
        # a location may hold a model-chosen key of any length: previewed like a value
        where = preview(".".join(str(p) for p in err["loc"]) or "(arguments)")
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown argument {where}")
        elif err["type"] == "missing":
            problems.append(f"missing required argument {where}")
        else:
            problems.append(f"argument {where}: {err['msg']} (got {preview(err.get('input'))})")
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more problems")
    return f"{tool.name} refused: " + "; ".join(problems) + f". {accepted_arguments(tool)}. Nothing was changed."


def accepted_arguments(tool: Tool) -> str:
    """``Accepted arguments: {name: what, ...}`` from the tool's JSON schema (bounds included)."""
    schema = _json_schema(tool.parameters)  # kept: a refused call must not rebuild it
    defs = schema.get("$defs", {})
    props = schema.get("properties", {})
    return "Accepted arguments: {" + ", ".join(f"{name}: {_accepts(spec, defs)}" for name, spec in props.items()) + "}"


class ToolRegistry:
    """The tools the session's strategies contribute; a duplicate name is a hard error."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def add(self, tool: Tool) -> None:
        existing = self._tools.get(tool.name)
        if existing is not None:
            msg = (
                f"tool name {tool.name!r} is registered by strategy {existing.strategy!r} "
                f"({existing.distribution or 'unknown distribution'}) and again by {tool.strategy!r} "
                f"({tool.distribution or 'unknown distribution'}); rename one or drop one strategy from the profile"
            )
            raise PluginConflictError(msg)
        self._tools[tool.name] = tool

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def run(self, session: SessionPort, call: ToolCallBlock) -> ToolOutcome:
        """Validate the arguments and run the tool. Never raises: a refusal or a failure of the
        tool becomes an error outcome (a failure is logged with its traceback)."""
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolOutcome(f"unknown tool {preview(call.name)}; kernel tools: {self.names()}", is_error=True)
        before = session.next_seq
        try:
            return self._run(session, tool, call)
        except Exception as exc:
            # a tool promises an outcome; whatever escaped it is a bug to log, not the harness's crash
            log.error("tool raised", tool=tool.name, strategy=tool.strategy, session=session.id, exc_info=True)
            written = session.next_seq - before
            what = "Nothing was written" if written == 0 else f"{written} event(s) were written before it failed"
            return ToolOutcome(
                f"{tool.name} failed: {type(exc).__name__}: {_safe_str(exc)[:300]}. {what}. "
                f"{accepted_arguments(tool)}.",
                is_error=True,
            )

    def _run(self, session: SessionPort, tool: Tool, call: ToolCallBlock) -> ToolOutcome:
        arguments = call.arguments
        if isinstance(arguments, str):  # some providers send a JSON string
            try:
                arguments = orjson.loads(arguments)
            except orjson.JSONDecodeError as exc:
                return ToolOutcome(
                    f"{tool.name} refused: arguments are not valid JSON ({exc}); send one JSON object of named "
                    f"arguments. {accepted_arguments(tool)}. Nothing was changed.",
                    is_error=True,
                )
        if isinstance(arguments, dict) and set(arguments) == {"_raw"} and isinstance(arguments["_raw"], str):
            # convert.py keeps arguments that did not parse as {"_raw": text}
            return ToolOutcome(
                f"{tool.name} refused: arguments are not valid JSON ({arguments['_raw'][:80]!r}); "
                f"send one JSON object of named arguments. {accepted_arguments(tool)}. Nothing was changed.",
                is_error=True,
            )
        try:
            args = tool.parameters.model_validate(arguments)
        except ValidationError as exc:
            return ToolOutcome(describe_validation_error(tool, exc), is_error=True)
        try:
            result = tool.handler(session.context, args)
        except CtxKernelError as exc:
            # a refusal by the kernel (stale anchor, busy compaction...) is the model's to read
            return ToolOutcome(f"{tool.name} refused: {exc}", is_error=True)
        return result if isinstance(result, ToolOutcome) else ToolOutcome(str(result))


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # an exception whose message cannot be built is named by its type
        return "(no message)"
