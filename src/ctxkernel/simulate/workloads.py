"""Synthetic workloads: recordings generated from a seed, so a comparison runs with no input file.

``coding-long``  a long coding session: hundreds of model requests that read files, grep, edit and
                 run a test suite whose output is large, across several user turns, some of them
                 corrections the agent must keep obeying (what ``instructions_visible`` measures).
                 Unmanaged, its prompt grows past 500k tokens, over four 128k windows.
``chat-short``   a short conversation with no tools, far below any window.

The same name and seed always give the same recording (``random.Random(seed)`` is the only source
of variation), so reports are comparable across runs and machines.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..messages import Message, Source, ToolCallBlock
from .recording import AssistantItem, Item, Recording, RecordingError, ToolResultItem, UserItem

_MODEL = Source(kind="model", provider="synthetic", model="synthetic-agent")

_NOUNS = (
    "parser",
    "token",
    "buffer",
    "record",
    "schema",
    "cursor",
    "header",
    "frame",
    "index",
    "cache",
    "window",
    "segment",
    "packet",
    "ledger",
    "route",
    "policy",
    "batch",
    "stream",
    "node",
    "table",
)
_VERBS = (
    "parse",
    "load",
    "emit",
    "merge",
    "split",
    "render",
    "check",
    "flush",
    "resolve",
    "encode",
    "decode",
    "scan",
    "apply",
    "build",
    "clamp",
    "align",
)
_MODULES = ("parser", "lexer", "schema", "cache", "router", "ledger", "stream", "render", "config", "cli")

_TASK = (
    "We need streaming support in the record parser: `parse_records(stream)` must yield records as "
    "they arrive instead of reading the whole input. Keep the public API of `ledger.py` unchanged. "
    "Run the test suite with `pytest -q tests/` after every change and fix what breaks."
)
#: corrections the user makes along the way; each must stay visible to be obeyed
_CORRECTIONS = (
    "Stop: do not touch `ledger.py` at all, not even formatting. Revert anything you changed there.",
    "Use `pathlib.Path` everywhere you open files in the new code, never `os.path`.",
    "The tests in `tests/test_stream.py` are the spec: never edit them to make them pass.",
    "Keep every new function under 40 lines; split helpers out instead of nesting.",
    "Log with `structlog.get_logger(__name__)`, not print(), in everything under `src/`.",
)


def _ident(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"


def _source_file(rng: random.Random, module: str, functions: int) -> str:
    lines = [f'"""The {module} module."""', "", "from __future__ import annotations", "", "import re", ""]
    for _ in range(functions):
        name = _ident(rng)
        arg = rng.choice(_NOUNS)
        lines.append(f"def {name}({arg}: bytes, *, limit: int = {rng.randint(8, 4096)}) -> list[int]:")
        lines.append(f'    """{name.replace("_", " ").capitalize()} of a {arg}, at most ``limit`` items."""')
        for _ in range(rng.randint(4, 14)):
            var = rng.choice(_NOUNS)
            op = rng.choice(("+", "-", "*", "//", "%", "^"))
            lines.append(
                f"    {var}_{rng.randint(0, 9)} = len({arg}) {op} {rng.randint(1, 997)}  # {rng.choice(_VERBS)} step"
            )
        lines.append(f"    return [b for b in {arg}[:limit] if b {rng.choice(('<', '>', '!='))} {rng.randint(0, 255)}]")
        lines.append("")
    return "\n".join(lines)


def _test_output(rng: random.Random, failing: int, total: int) -> str:
    lines = [
        "============================= test session starts ==============================",
        f"collected {total} items",
        "",
    ]
    failures = set(rng.sample(range(total), failing)) if failing else set()
    for i in range(total):
        module = rng.choice(_MODULES)
        lines.append(f"tests/test_{module}.py::test_{_ident(rng)}_{i} {'FAILED' if i in failures else 'PASSED'}")
    for i in sorted(failures):
        lines += ["", f"___________________________ test_case_{i} ___________________________", ""]
        for _ in range(rng.randint(6, 16)):
            module = rng.choice(_MODULES)
            lines.append(f"src/app/{module}.py:{rng.randint(10, 900)}: in {_ident(rng)}")
            lines.append(f"    {rng.choice(_NOUNS)} = {_ident(rng)}({rng.choice(_NOUNS)}, limit={rng.randint(1, 64)})")
        lines.append(f"E   AssertionError: expected {rng.randint(0, 99)} records, got {rng.randint(0, 99)}")
    lines += ["", f"=========== {failing} failed, {total - failing} passed in {rng.uniform(0.5, 9):.2f}s ==========="]
    return "\n".join(lines)


def coding_long(seed: int = 7, *, turns: int = 6, steps_per_turn: int = 55) -> Recording:
    """A long coding session (see the module docstring)."""
    rng = random.Random(seed)
    items: list[Item] = []
    call_no = 0
    failing = rng.randint(6, 9)

    def call(name: str, arguments: dict[str, object], text: str = "") -> ToolCallBlock:
        nonlocal call_no
        call_no += 1
        block = ToolCallBlock(f"call_{call_no:04d}", name, arguments)
        items.append(AssistantItem(Message.assistant(text, [block], source=_MODEL)))
        return block

    for turn in range(turns):
        user_text = _TASK if turn == 0 else _CORRECTIONS[(turn - 1) % len(_CORRECTIONS)]
        items.append(UserItem(user_text))
        for step in range(steps_per_turn):
            roll = rng.random()
            module = rng.choice(_MODULES)
            if roll < 0.34:
                block = call(
                    "read_file",
                    {"path": f"src/app/{module}.py"},
                    "Let me look at the current code." if step % 9 == 0 else "",
                )
                items.append(ToolResultItem(block.id, _source_file(rng, module, rng.randint(4, 14)), name="read_file"))
            elif roll < 0.52:
                failing = max(0, failing + rng.choice((-1, -1, 0, 1)))
                block = call("run", {"command": "pytest -q tests/"}, "Running the suite." if step % 7 == 0 else "")
                items.append(ToolResultItem(block.id, _test_output(rng, failing, rng.randint(60, 160)), name="run"))
            elif roll < 0.72:
                old = f"    return [b for b in {rng.choice(_NOUNS)}[:limit]"
                new = f"    yield from ({rng.choice(_NOUNS)}[i] for i in range(min(limit, {rng.randint(2, 99)})))"
                block = call("edit_file", {"path": f"src/app/{module}.py", "old": old, "new": new})
                items.append(ToolResultItem(block.id, f"Edited src/app/{module}.py: 1 replacement.", name="edit_file"))
            elif roll < 0.88:
                pattern = _ident(rng)
                block = call("grep", {"pattern": pattern, "path": "src/"})
                hits = "\n".join(
                    f"src/app/{rng.choice(_MODULES)}.py:{rng.randint(1, 800)}:    {pattern}({rng.choice(_NOUNS)})"
                    for _ in range(rng.randint(2, 30))
                )
                items.append(ToolResultItem(block.id, hits, name="grep"))
            else:
                # a batch of two reads in one reply: results are committed in the model's order
                a = ToolCallBlock(f"call_{call_no + 1:04d}", "read_file", {"path": f"tests/test_{module}.py"})
                b = ToolCallBlock(
                    f"call_{call_no + 2:04d}", "read_file", {"path": f"src/app/{rng.choice(_MODULES)}.py"}
                )
                call_no += 2
                items.append(
                    AssistantItem(Message.assistant("Comparing the test with the code.", [a, b], source=_MODEL))
                )
                items.append(ToolResultItem(a.id, _source_file(rng, module, rng.randint(3, 10)), name="read_file"))
                items.append(ToolResultItem(b.id, _source_file(rng, module, rng.randint(3, 10)), name="read_file"))
        items.append(
            AssistantItem(
                Message.assistant(
                    f"Turn {turn + 1} done: {failing} tests still failing; next I will continue with the stream reader.",
                    source=_MODEL,
                )
            )
        )
    return Recording(items, {"kind": "workload", "workload": "coding-long", "seed": seed})


_QUESTIONS = (
    "What is the difference between a list and a tuple in Python?",
    "When should I prefer a dataclass over a NamedTuple?",
    "Please answer in at most three sentences from now on.",
    "How do I read a file line by line without loading it all?",
    "What does `functools.lru_cache` do with keyword arguments?",
    "Is `dict` ordering guaranteed?",
    "Summarise what we discussed so far.",
    "Thanks, that's all.",
)


def chat_short(seed: int = 7) -> Recording:
    """A short tool-free conversation."""
    rng = random.Random(seed)
    items: list[Item] = []
    for question in _QUESTIONS:
        items.append(UserItem(question))
        words = [rng.choice(_NOUNS + _VERBS) for _ in range(rng.randint(30, 120))]
        items.append(AssistantItem(Message.assistant(" ".join(words).capitalize() + ".", source=_MODEL)))
    return Recording(items, {"kind": "workload", "workload": "chat-short", "seed": seed})


WORKLOADS: dict[str, Callable[..., Recording]] = {"coding-long": coding_long, "chat-short": chat_short}


def build_workload(name: str, seed: int = 7) -> Recording:
    builder = WORKLOADS.get(name)
    if builder is None:
        msg = f"unknown workload {name!r}; built in: {sorted(WORKLOADS)}"
        raise RecordingError(msg)
    return builder(seed)
