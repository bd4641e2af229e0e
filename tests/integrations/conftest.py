"""Shared set-up for the framework adapter tests: a small-window handoff profile, large tool
results, and a probe that measures every model call in the profile's own tokens."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from ctxkernel import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.profile import load_profile
from ctxkernel.testing.conformance import pairing_problems

# the Agents SDK would export traces of the test runs to OpenAI; these tests stay on loopback
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("resume_child.py")

#: small enough that 60 steps of large tool results overflow it several times over
CONTEXT_WINDOW = 16000
RESERVED = 2048
STEPS = 60
NOTE = "PLAN-MARKER-7731: refactor the parser, then the lexer"


def big_result(i: int) -> str:
    """A tool result of about 1,400 tokens, different for every ``i``."""
    lines = [f"line {j}: value_{i}_{j} = compute({j}, {i}) + offset_{(i * 31 + j) % 97}" for j in range(90)]
    return f"# src/module_{i}.py\n" + "\n".join(lines)


@dataclass
class Probe:
    """Records what each model call received, measured with the profile's tokenizer."""

    meter: Meter
    window: int
    sizes: list[int] = field(default_factory=list)
    #: tool calls without results (or results without calls) in what a model was sent
    unpaired: list[Any] = field(default_factory=list)

    def measure(self, system: str, messages: list[Message], tools: list[dict[str, Any]]) -> int:
        self.unpaired += pairing_problems(messages)
        tokens = self.meter.count_header(system, tools) + sum(self.meter.count_message(m) for m in messages)
        self.sizes.append(tokens)
        return tokens


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CTXKERNEL_HOME", str(home))
    monkeypatch.delenv("CTXKERNEL_PROFILE", raising=False)
    monkeypatch.chdir(REPO)
    return home


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    """profiles/handoff.toml with a 16k window: the shipped strategy, settings and store."""
    text = (REPO / "profiles" / "handoff.toml").read_text()
    text, n = re.subn(r"(?m)^context_window = \d+", f"context_window = {CONTEXT_WINDOW}", text)
    assert n == 1
    text, n = re.subn(r"(?m)^reserved_output_tokens = \d+", f"reserved_output_tokens = {RESERVED}", text)
    assert n == 1
    path = tmp_path / "small-handoff.toml"
    path.write_text(text)
    return path


@pytest.fixture
def probe(profile_path: Path) -> Probe:
    profile = load_profile(profile_path)
    return Probe(Meter(get_tokenizer(profile.model.tokenizer)), profile.model.effective_window)


def run_child(framework: str, home: Path, profile: Path, session_id: str) -> dict[str, Any]:
    """Continue ``session_id`` in a new Python process; returns what the child reports."""
    env = {**os.environ, "CTXKERNEL_HOME": str(home), "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    done = subprocess.run(
        [sys.executable, str(CHILD), framework, str(profile), session_id],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def event_types(home: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's log as (type, data) dicts, read from the store as another process would."""
    from ctxkernel.store.jsonl import JsonlStore

    return [{"type": e.type, "data": e.data} for e in JsonlStore(home).read(session_id, 0)]


# -- hypothesis: kernel conversations as a framework would hold them ---------------------------------------
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
names = st.from_regex(r"[a-z][a-z_]{0,15}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(names, json_values, max_size=4)
#: text a provider sent as arguments that is not JSON (kept as {"_raw": text})
raw_arguments = texts.map(lambda t: "{" + t).filter(lambda text: not _is_json(text))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@st.composite
def conversations(
    draw: Any, *, tool_names: bool = True, errors: bool = True, raw: bool = True, signatures: bool = True
) -> list[Message]:
    """User turns, each with assistant steps whose tool calls all get results, ending in a reply."""
    out: list[Message] = []
    counter = 0
    for _ in range(draw(st.integers(1, 3))):
        out.append(Message.user(draw(texts)))
        for last in [False] * draw(st.integers(0, 2)) + [True]:
            blocks: list[Any] = []
            for _ in range(draw(st.integers(0, 2))):
                signature = draw(st.none() | texts) if signatures else None
                blocks.append(ReasoningBlock(draw(texts), signature))
            blocks += [TextBlock(draw(texts)) for _ in range(draw(st.integers(0, 2)))]
            calls = []
            if not last:
                for _ in range(draw(st.integers(1, 2))):
                    counter += 1
                    args = {"_raw": draw(raw_arguments)} if raw and draw(st.booleans()) else draw(arguments)
                    calls.append(ToolCallBlock(f"call_{counter}", draw(names), args))
                # providers put malformed calls after well-formed ones (LangChain keeps them apart)
                calls.sort(key=lambda c: set(c.arguments) == {"_raw"})
            out.append(Message("assistant", tuple(blocks + calls), Source(kind="model")))
            for call in calls:
                is_error = draw(st.booleans()) if errors else False
                out.append(
                    Message.tool(call.id, draw(texts), is_error=is_error, name=call.name if tool_names else None)
                )
    return out
