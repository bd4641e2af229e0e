"""CompactTool: a smaller schema, the same validation."""

from __future__ import annotations

from pydantic import Field

from ctxkernel import CompactTool, Tool, ToolArgs, compact_schema


class Args(ToolArgs):
    window: int | str | None = Field(default=None, description="number or id")
    note: str | None = None
    limit: int = 20


def test_compact_schema_drops_titles_null_branches_and_null_defaults():
    full = Tool("t", "d", Args, lambda s, a: "").schema()["function"]["parameters"]
    small = compact_schema(full)
    assert "title" not in small and "additionalProperties" not in small
    assert small["properties"]["window"] == {"type": ["integer", "string"], "description": "number or id"}
    assert small["properties"]["note"] == {"type": "string"}
    assert small["properties"]["limit"] == {"type": "integer", "default": 20}


def test_compact_tool_sends_the_compact_schema_and_keeps_name_and_description():
    tool = CompactTool("t", "d", Args, lambda s, a: "")
    function = tool.schema()["function"]
    assert function["name"] == "t" and function["description"] == "d"
    assert function["parameters"] == compact_schema(
        Tool("t", "d", Args, lambda s, a: "").schema()["function"]["parameters"]
    )


def test_a_models_schema_is_derived_once_per_process_and_each_tool_owns_its_copy(monkeypatch):
    class Once(ToolArgs):
        path: str = Field(description="where")

    calls = []
    derive = Once.model_json_schema

    def counted(*args, **kwargs):
        calls.append(1)
        return derive(*args, **kwargs)

    monkeypatch.setattr(Once, "model_json_schema", counted)
    first = Tool("a", "d", Once, lambda s, a: "").schema()
    first["function"]["parameters"]["properties"]["path"]["description"] = "changed by its owner"
    second = Tool("b", "d", Once, lambda s, a: "").schema()  # as a second kernel registers it again
    assert len(calls) == 1
    parameters = second["function"]["parameters"]
    assert parameters["properties"]["path"]["description"] == "where" and "title" not in parameters
