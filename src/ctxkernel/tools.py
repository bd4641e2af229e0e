"""Model-callable tools: definitions, argument validation and the per-session registry.

A strategy contributes tools through the ``register_tools`` hook. Arguments are validated with
the tool's pydantic model before the handler runs: a bad argument becomes an error tool result
that says what was wrong and what is accepted. It never raises into the harness, and since the
handler never ran, nothing was written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import CtxKernelError, PluginConflictError, ToolError
from .messages import ToolCallBlock

if TYPE_CHECKING:
    from .session import Session


class ToolArgs(BaseModel):
    """Base for tool argument models: unknown arguments are refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass(slots=True)
class ToolOutcome:
    """What a tool returns to the kernel.

    ``conclude_turn`` ends the turn after the current batch of tool calls; ``defer_message`` is
    shown to the model as a plugin notice at the next step (HOST-MODEL §5). ``continue_in`` is
    the id of a child session (same store) in which the conversation continues after this batch
    (e.g. ``chapters_continue``): a harness, and ``ctxkernel simulate``, opens it with
    ``kernel.open_session(id)`` and sends the next request from there.
    """

    content: str
    is_error: bool = False
    conclude_turn: bool = False
    defer_message: str | None = None
    continue_in: str | None = None


Handler = Callable[["Session", Any], "ToolOutcome | str"]


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
            params = self.parameters.model_json_schema()
            params.pop("title", None)
            self._schema = {
                "type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": params},
            }
        return self._schema


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
            if all(set(b) == {"type"} and isinstance(b["type"], str) for b in branches):
                out["type"] = [b["type"] for b in branches]
                continue
            value = branches
        out[key] = compact_schema(value)
    return out


class CompactTool(Tool):
    """A tool whose schema is :func:`compact_schema` of the pydantic one (validation is unchanged:
    arguments are still checked against the full pydantic model)."""

    def schema(self) -> dict[str, Any]:
        function = Tool.schema(self)["function"]
        return {"type": "function", "function": {**function, "parameters": compact_schema(function["parameters"])}}


def describe_validation_error(tool: Tool, exc: ValidationError) -> str:
    """Say which arguments were wrong and what the tool accepts."""
    props = tool.parameters.model_json_schema().get("properties", {})
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown argument {where!r}")
        elif err["type"] == "missing":
            problems.append(f"missing required argument {where!r}")
        else:
            problems.append(f"argument {where!r}: {err['msg']} (got {err.get('input')!r:.60})")
    accepted = ", ".join(
        f"{name}: {spec.get('type', spec.get('anyOf', 'any')) if isinstance(spec, dict) else spec}"
        for name, spec in props.items()
    )
    return f"{tool.name} refused: " + "; ".join(problems) + f". Accepted arguments: {{{accepted}}}. Nothing was changed."


class ToolRegistry:
    """The tools the session's strategies contribute; a duplicate name is a hard error."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self):  # noqa: ANN204
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

    def run(self, session: Session, call: ToolCallBlock) -> ToolOutcome:
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolOutcome(f"unknown tool {call.name!r}; kernel tools: {self.names()}", is_error=True)
        arguments = call.arguments
        if isinstance(arguments, str):  # some providers send a JSON string
            try:
                arguments = orjson.loads(arguments)
            except orjson.JSONDecodeError as exc:
                return ToolOutcome(f"{tool.name} refused: arguments are not valid JSON ({exc})", is_error=True)
        if isinstance(arguments, dict) and set(arguments) == {"_raw"} and isinstance(arguments["_raw"], str):
            # convert.py keeps arguments that did not parse as {"_raw": text}
            return ToolOutcome(
                f"{tool.name} refused: arguments are not valid JSON ({arguments['_raw'][:80]!r}); "
                "send one JSON object of named arguments. Nothing was changed.",
                is_error=True,
            )
        try:
            args = tool.parameters.model_validate(arguments)
        except ValidationError as exc:
            return ToolOutcome(describe_validation_error(tool, exc), is_error=True)
        try:
            result = tool.handler(session, args)
        except CtxKernelError as exc:
            # a refusal by the kernel (stale anchor, busy compaction...) is the model's to read
            return ToolOutcome(f"{tool.name} refused: {exc}", is_error=True)
        return result if isinstance(result, ToolOutcome) else ToolOutcome(str(result))
