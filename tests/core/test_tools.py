"""CompactTool: a smaller schema, the same validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field, ValidationError, create_model

from ctxkernel import CompactTool, Tool, ToolArgs, compact_schema
from ctxkernel.tools import describe_validation_error


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


def counted_schemas(monkeypatch, model: type[ToolArgs]) -> list[int]:
    """A list that grows by one each time ``model``'s JSON schema is derived."""
    calls: list[int] = []
    derive = model.model_json_schema

    def counted(*args, **kwargs):
        calls.append(1)
        return derive(*args, **kwargs)

    monkeypatch.setattr(model, "model_json_schema", counted)
    return calls


def test_a_models_schema_is_derived_once_per_process_and_each_tool_owns_its_copy(monkeypatch):
    class Once(ToolArgs):
        path: str = Field(description="where")

    calls = counted_schemas(monkeypatch, Once)
    first = Tool("a", "d", Once, lambda s, a: "").schema()
    first["function"]["parameters"]["properties"]["path"]["description"] = "changed by its owner"
    second = Tool("b", "d", Once, lambda s, a: "").schema()  # as a second kernel registers it again
    assert len(calls) == 1
    parameters = second["function"]["parameters"]
    assert parameters["properties"]["path"]["description"] == "where" and "title" not in parameters


def test_a_refusal_names_the_accepted_arguments_from_the_kept_schema(monkeypatch):
    class Bounded(ToolArgs):
        count: int = Field(ge=0, le=20)

    calls = counted_schemas(monkeypatch, Bounded)
    tool = Tool("t", "d", Bounded, lambda s, a: "")
    refusals = []
    for bad in ({"count": -1}, {"count": "many"}, {}):
        with pytest.raises(ValidationError) as info:
            Bounded.model_validate(bad)
        refusals.append(describe_validation_error(tool, info.value))
    # a hostile model can send bad arguments at every step: the schema is derived once, not per refusal
    assert len(calls) == 1
    assert all("Accepted arguments: {count: integer (0..20)}" in text for text in refusals)


_FIELD_TYPES = {
    "int": (int, 0),
    "bounded int": (int, Field(default=1, ge=0, le=50)),
    "optional str": (str | None, None),
    "short str": (str, Field(default="x", max_length=8, description="short")),
    "int or str": (int | str | None, Field(default=None, description="number or id")),
    "list of ints": (list[int], Field(default_factory=list, max_length=4)),
    "nested": (Args | None, None),
}


@settings(max_examples=40, deadline=None)
@given(fields=st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.sampled_from(sorted(_FIELD_TYPES))))
def test_a_compact_tools_kept_schema_is_the_compacted_full_schema_and_its_own(fields):
    """CompactTool keeps its schema (compact_schema copies, so no deep copy first): it is what
    compacting the full tool's schema gives, and changing one tool's does not reach another's."""
    model = create_model("Generated", __base__=ToolArgs, **{name: _FIELD_TYPES[kind] for name, kind in fields.items()})
    fresh = compact_schema(Tool("t", "d", model, lambda s, a: "").schema()["function"]["parameters"])
    tool = CompactTool("t", "d", model, lambda s, a: "")
    assert tool.schema() == {"type": "function", "function": {"name": "t", "description": "d", "parameters": fresh}}
    assert tool.schema() is tool.schema()
    for node in tool.schema()["function"]["parameters"].get("properties", {}).values():
        node["description"] = "changed by its owner"
    other = CompactTool("u", "d", model, lambda s, a: "").schema()["function"]["parameters"]
    assert other == fresh
