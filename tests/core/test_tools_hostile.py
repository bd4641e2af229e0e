"""Hostile tool arguments against every tool of every shipped profile (issue #13, item 2).

Invariants: ``Session.run_tool`` never raises; it answers a :class:`ToolOutcome` whose text can
be stored; an error outcome leaves every byte under the kernel home unchanged; and every
numeric argument of every tool schema is bounded, every free string has a maximum length.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxkernel
from ctxkernel import MAX_INT_ARG, Kernel, Message, ScriptedModel, Session, ToolCallBlock, ToolOutcome
from ctxkernel.loop import AgentLoop
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile
from ctxkernel.text import storable_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))
#: the shipped profiles plus the example plugin of docs/writing-a-strategy.md
PROFILES = [*SHIPPED, "observation-mask"]

# values a model (or a hostile server speaking for it) can put in a JSON object
DIGITS = "9" * 5_000
KILLERS: list[Any] = [
    10**5000,
    -(10**5000),
    2**64,
    MAX_INT_ARG + 1,
    -1,
    0,
    1,
    2,
    True,
    None,
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -0.0,
    1.5,
    DIGITS,
    "-" + DIGITS,
    "p" + DIGITS,
    "⟦p" + DIGITS + "⟧",
    "item_" + DIGITS,
    "win_" + DIGITS,
    "win_" + DIGITS + "_summary",
    "todo_" + DIGITS + "_1",
    "todo_1_" + DIGITS,
    "c" + DIGITS + ".deadbeef",
    "²",
    "٣",
    "item_٣",
    "win_²",
    "p²",
    "9999999999999999",
    "item_9999999999999999",
    "x" * 1_000_000,
    "\udcff" * 8,
    "a\ud800b",
    "\ud83d\ude00",
    "\x00",
    "",
    " ",
    '"><note trust="user-injected">',
    'self/notes/a"b',
    "../../etc/passwd",
    "/abs/path",
    "C:\\x",
    "goal",
    "checklist",
    "item_1",
    "win_1",
    "win_1_summary",
    "todo_1_0",
    "p1",
    "⟦p1⟧",
    "n_0000000000000000",
    [],
    [1] * 1_000,
    {},
    {"a": {"b": [None]}},
    [{"from": DIGITS, "to": 10**5000, "summary": "s"}],
]


def _printable(value: Any) -> bool:
    try:
        repr(value)
    except ValueError:
        return False
    return True


values = st.recursive(
    st.one_of(
        # Hypothesis prints its strategies, and a 5,000-digit int has no repr: build those instead
        st.sampled_from([v for v in KILLERS if _printable(v)]),
        st.sampled_from([5_000, -5_000, 400]).map(lambda n: (10 ** abs(n)) * (1 if n > 0 else -1)),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=4),
        st.booleans(),
        st.none(),
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8,
)


def _harness_tool(call: ToolCallBlock) -> str:
    return f"output of {call.name}: " + "line of tool output\n" * 40


def _history_script(tools: set[str]) -> list[Message]:
    """Replies that give the session some history: harness tool calls, and notes where the
    profile has notes tools, so reads and lookups have something to find."""
    replies: list[Message] = []
    for i in range(3):
        calls = [ToolCallBlock(f"h{i}", "shell", {"cmd": f"ls {i}"})]
        if "notes_write_file" in tools:
            calls.append(
                ToolCallBlock(f"n{i}", "notes_write_file", {"path": f"self/notes/plan{i}.md", "content": "plan\nstep"})
            )
        if "note_create" in tools:
            calls.append(ToolCallBlock(f"n{i}", "note_create", {"path": f"plan/{i}", "content": "plan\nstep"}))
        replies.append(Message.assistant(f"step {i}", tool_calls=calls))
        replies.append(Message.assistant(f"done {i}"))
    return replies


#: settings under which a short session hides something (strategies offer recall only then)
def _session(home: Path, profile_name: str) -> Session:
    if profile_name in SHIPPED:
        profile = ctxkernel.load_profile(REPO / "profiles" / f"{profile_name}.toml")
        # the recall tools come once something is hidden: offered from the start here, so their
        # handlers get the hostile arguments too
        profile.tools.offer = "always"
    else:
        profile = make_profile()
        profile.profile.strategies = [profile_name]
    kernel = Kernel(profile, store=JsonlStore(home), home=home)
    session = kernel.open_session()
    session.owns_tool("")  # brings the session's tool registry up to date
    tools = set(session.tools.names())
    model = ScriptedModel(_history_script(tools))
    loop = AgentLoop(
        session,
        model,
        _harness_tool,
        tools=[{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
    )
    for turn in range(3):
        loop.run(f"task {turn}: fix the parser")
    assert session.tools.names() == session.offerable_tools.names()  # every tool is offered now
    # a turn in progress: the model's reply with a call waiting for its result, as when a
    # harness runs a kernel tool
    session.user("next task")
    session.prepare_request()
    session.commit_reply(Message.assistant("", tool_calls=[ToolCallBlock("pending", "shell", {})]))
    return session


def _snapshot(home: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file() and p.suffix != ".lock"
    }


class Home:
    """The kernel home and its bytes as last read. Nothing but the checked calls runs between two
    checks (the jsonl store has no writer thread), so what a refusal left is what the next call
    starts from: read again only after a call that was allowed to write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.known: dict[str, bytes] | None = None


def _check(session: Session, home: Home, name: str, arguments: Any) -> ToolOutcome:
    before = home.known if home.known is not None else _snapshot(home.path)
    home.known = None
    outcome = session.run_tool(ToolCallBlock("hostile", name, arguments))
    assert isinstance(outcome, ToolOutcome)
    assert isinstance(outcome.content, str) and outcome.content
    orjson.dumps(storable_text(outcome.content))
    if outcome.is_error:
        after = _snapshot(home.path)
        assert after == before, f"{name} refused ({outcome.content[:200]!r}) but changed the store"
        assert len(outcome.content) <= 4_000, f"a refusal of {name} floods the context: {outcome.content[:300]!r}"
        home.known = after
    return outcome


def _properties(session: Session, name: str) -> dict[str, Any]:
    return session.tools.get(name).parameters.model_json_schema().get("properties", {})


@pytest.fixture(params=PROFILES)
def hostile_session(request, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return _session(home, request.param), Home(home)


def test_every_killer_value_in_every_argument_of_every_tool_is_answered(hostile_session):
    session, home = hostile_session
    for name in session.tools.names():
        props = list(_properties(session, name)) or ["unexpected"]
        for prop in props:
            for value in KILLERS:
                _check(session, home, name, {prop: value})
        # whole-argument forms: not an object, JSON text with a 5,000-digit number, extra keys
        for arguments in (
            [1, 2],
            10**5000,
            None,
            "[",
            '{"a": ' + DIGITS + "}",
            {"_raw": "{"},
            {"extra_key": 1, **{p: 1 for p in props}},
            {"k" * 100_000: 1},
            {f"extra{i}": i for i in range(1_000)},
        ):
            _check(session, home, name, arguments)
    # a malformed call (no id or name) is answered too
    assert session.run_tool({"arguments": {}}).is_error


def test_hostile_arguments_never_escape_run_tool(hostile_session):
    session, home = hostile_session
    names = session.tools.names()
    if not names:
        pytest.skip("this profile registers no tools")

    @settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        name = data.draw(st.sampled_from(names))
        props = list(_properties(session, name))
        keys = (
            data.draw(st.lists(st.sampled_from([*props, "extra", "from"]), max_size=len(props) + 1, unique=True))
            if props
            else ["extra"]
        )
        arguments = {key: data.draw(values) for key in keys}
        _check(session, home, name, arguments)

    run()


def _walk(schema: dict[str, Any], defs: dict[str, Any], where: str):
    """Every leaf property schema (through $ref, anyOf and array items) with its path."""
    if "$ref" in schema:
        yield from _walk(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, where)
        return
    if "anyOf" in schema:
        for branch in schema["anyOf"]:
            yield from _walk(branch, defs, where)
        return
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "object" in kinds and "properties" in schema:
        for key, sub in schema["properties"].items():
            yield from _walk(sub, defs, f"{where}.{key}")
    if "array" in kinds:
        yield where, schema
        yield from _walk(schema.get("items", {}), defs, f"{where}[]")
    yield where, schema


def test_every_numeric_argument_is_bounded_and_every_string_has_a_maximum_length(tmp_path):
    checked = 0
    for profile_name in PROFILES:
        home = tmp_path / profile_name
        home.mkdir()
        profile = (
            ctxkernel.load_profile(REPO / "profiles" / f"{profile_name}.toml")
            if profile_name in SHIPPED
            else make_profile()
        )
        if profile_name not in SHIPPED:
            profile.profile.strategies = [profile_name]
        session = Kernel(profile, store=JsonlStore(home), home=home).open_session()
        session.owns_tool("")
        for tool in session.tools:
            for schema in (tool.parameters.model_json_schema(), tool.schema()["function"]["parameters"]):
                for where, leaf in _walk(schema, schema.get("$defs", {}), tool.name):
                    kinds = leaf.get("type")
                    kinds = kinds if isinstance(kinds, list) else [kinds]
                    if ("integer" in kinds or "number" in kinds) and "enum" not in leaf:
                        assert leaf.get("minimum") is not None and leaf.get("maximum") is not None, f"{where}: {leaf}"
                        assert -MAX_INT_ARG <= leaf["minimum"] and leaf["maximum"] <= MAX_INT_ARG, f"{where}: {leaf}"
                    if "string" in kinds and "enum" not in leaf and "const" not in leaf:
                        assert leaf.get("maxLength") is not None, f"{where}: {leaf}"
                    if "array" in kinds:
                        assert leaf.get("maxItems") is not None, f"{where}: {leaf}"
                    checked += 1
    assert checked > 50  # every shipped tool's arguments were walked


@pytest.mark.parametrize(
    ("profile_name", "tool", "arguments"),
    [
        ("decay", "compress", {"spans": [{"from": "p" + DIGITS, "to": "p1", "summary": "s"}]}),
        ("decay", "drop", {"left": "⟦p" + DIGITS + "⟧", "right": 1}),
        ("handoff", "history_read_item", {"id": "item_" + DIGITS}),
        ("handoff", "history_list_items", {"window": "win_" + DIGITS}),
        ("handoff", "history_list_items", {"window": "²"}),
        ("rollover", "history_read", {"item": "item_" + DIGITS}),
        ("rollover", "history_lookup", {"cursor": "c" + DIGITS + ".deadbeef"}),
    ],
)
def test_issue_13_reproductions_get_an_error_outcome_in_the_agent_loop(tmp_path, profile_name, tool, arguments):
    """The reported crashes, through AgentLoop: the turn completes and the model reads an error."""
    home = tmp_path / "home"
    home.mkdir()
    profile = ctxkernel.load_profile(REPO / "profiles" / f"{profile_name}.toml")
    profile.tools.offer = "always"  # the recall tools from the first request
    session = Kernel(profile, store=JsonlStore(home), home=home).open_session()
    model = ScriptedModel([Message.assistant("", tool_calls=[ToolCallBlock("c1", tool, arguments)]), "ok"])
    result = AgentLoop(session, model).run("go")
    assert result.reason == "completed"
    answer = next(e for e in session.events if e.type == "tool/result")
    block = answer.data["message"]["content"][0]
    assert block["is_error"] is True
    assert "refused" in block["content"]
