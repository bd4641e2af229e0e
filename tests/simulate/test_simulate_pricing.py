"""Money with the prompt cache: the shipped price table and the cache simulation, and how the
replay bills every request (summaries included) on the recording's own clock."""

from __future__ import annotations

import pytest
from simulate_support import replayed

from ctxkernel import Message
from ctxkernel.pricing import PRICES, Bill, PromptCache, UnknownModelError, price_for
from ctxkernel.simulate import AssistantItem, Options, Recording, RecordingError, UserItem, run_profile
from ctxkernel.simulate.replay import model_for


def blocks(*sizes: int, prefix: str = "m") -> list[tuple[str, int]]:
    return [(f"{prefix}{i}", n) for i, n in enumerate(sizes)]


def test_the_table_holds_the_providers_cache_rules():
    sonnet, gpt = price_for("claude-sonnet-4-5"), price_for("gpt-4o")
    assert (sonnet.cache_write, sonnet.cache_read) == (3.0 * 1.25, pytest.approx(0.3))
    assert sonnet.cache_ttl_seconds == 300 and sonnet.cache_mode == "explicit"
    assert (gpt.cache_read, gpt.cache_write, gpt.cache_increment, gpt.cache_mode) == (1.25, 2.5, 128, "automatic")
    assert all(p.cache_min_tokens >= 1_024 for p in PRICES.values())
    # a dated release finds its model; an unknown name is refused naming the known ones
    assert price_for("gpt-4o-2024-08-06").input == 2.5
    assert price_for("claude-3-5-sonnet-20241022").output == 15.0
    with pytest.raises(UnknownModelError, match="known: .*claude-sonnet-4-5"):
        price_for("gpt-99")
    # what a strategy weighing the cache needs: a write repays itself after this many reads
    assert sonnet.break_even_reads() == pytest.approx(0.25 / 0.9)
    assert gpt.break_even_reads() == 0.0
    # --prices keeps the cache rules: a write keeps its ratio to the input price
    other = sonnet.with_prices(2.0, 0.2, 8.0)
    assert (other.cache_write, other.cache_ttl_seconds, other.cache_min_tokens) == (2.5, 300, 1_024)


def test_explicit_caching_reads_the_shared_prefix_and_writes_the_rest():
    cache = PromptCache(price_for("claude-sonnet-4-5"))
    first = cache.request(0.0, blocks(1_200, 500))
    assert first == Bill(uncached=0, cache_read=0, cache_write=1_700)
    second = cache.request(10.0, blocks(1_200, 500, 300))
    assert second == Bill(cache_read=1_700, cache_write=300)
    # a changed message breaks the prefix there: what follows is written again
    third = cache.request(20.0, [("m0", 1_200), ("summary", 200), ("m2", 300)])
    assert third == Bill(cache_read=1_200, cache_write=500)
    # a shared prefix under the minimum is no cached prefix
    assert cache.request(30.0, [("m0", 1_000), ("new", 500)]) == Bill(cache_write=1_500)
    # below the model's minimum nothing is cached
    assert PromptCache(price_for("claude-sonnet-4-5")).request(0.0, blocks(900)) == Bill(uncached=900)


def test_the_cache_lives_its_ttl_from_the_last_use():
    cache = PromptCache(price_for("claude-sonnet-4-5"))
    cache.request(0.0, blocks(2_000))
    assert cache.request(290.0, blocks(2_000, 10)).cache_read == 2_000  # read at 290 s: refreshed
    assert cache.request(580.0, blocks(2_000, 10, 10)).cache_read == 2_010  # alive from that read
    assert cache.request(1_000.0, blocks(2_000, 10, 10, 10)).cache_read == 0  # 420 s idle: gone


def test_automatic_caching_reads_in_steps_and_writes_nothing():
    cache = PromptCache(price_for("gpt-4o"))
    assert cache.request(0.0, blocks(1_100, 40)) == Bill(uncached=1_140)
    bill = cache.request(5.0, blocks(1_100, 40, 60))
    assert bill == Bill(uncached=1_200 - 1_024, cache_read=1_024)  # 1,140 shared: 8 steps of 128


def _chat(gap_seconds: float) -> Recording:
    big = "word " * 1_500
    items = []
    for i in range(4):
        at = 1_700_000_000.0 + i * gap_seconds
        items.append(UserItem(f"Question {i}: {big}", time=at))
        items.append(AssistantItem(Message.assistant(f"Answer {i}."), time=at + 5))
    return Recording(items, {"kind": "transcript", "format": "claude-code"})


def test_the_recordings_own_times_decide_what_is_cached():
    busy = run_profile("none", _chat(30), Options(model="claude-sonnet-4-5"))
    idle = run_profile("none", _chat(900), Options(model="claude-sonnet-4-5"))  # 15 minutes apart
    assert busy["billed_input_tokens"] == idle["billed_input_tokens"]
    assert busy["cache_read_tokens"] > 0 and idle["cache_read_tokens"] == 0
    assert idle["cost_usd"] > busy["cost_usd"]


def test_cost_is_the_bill_at_the_models_prices():
    m = replayed("basic", "coding-long", window=60_000, model="claude-sonnet-4-5")
    price = price_for("claude-sonnet-4-5")
    uncached = m["billed_input_tokens"] - m["cache_read_tokens"] - m["cache_write_tokens"]
    expected = price.cost(Bill(uncached, m["cache_read_tokens"], m["cache_write_tokens"]), m["output_tokens"])
    assert m["cost_usd"] == pytest.approx(expected, abs=1e-6)
    # the cache changes the ranking: basic's summaries rewrite the head, so it writes more than it
    # would with a prefix that only grows
    assert m["cache_write_tokens"] > 0 and m["cache_read_tokens"] > m["cache_write_tokens"]


def test_an_overflowed_request_is_not_billed_and_the_cost_is_not_known():
    m = replayed("none", "coding-long", window=40_000, model="claude-sonnet-4-5")
    assert m["overflows"] > 0
    assert m["cost_usd"] is None
    # only the requests a provider served are billed: the refused ones are over the window
    served = [t for t in m["prompt_tokens"] if t <= m["effective_window"]]
    assert m["billed_input_tokens"] == sum(served)


def test_run_profile_prices_a_recording_as_its_formats_model():
    # without --model a recording is priced as its format's default (docs/simulate.md, --model),
    # through run_profile as through compare: a Codex rollout as gpt-5-codex, not as a workload
    from ctxkernel.simulate import compare

    recording = _chat(30)
    recording.source["format"] = "codex"
    alone = run_profile("none", recording, Options())
    assert alone["cost_usd"] == run_profile("none", recording, Options(model="gpt-5-codex"))["cost_usd"]
    assert alone["cost_usd"] == compare(["none"], recording)["profiles"][0]["cost_usd"]


def test_only_a_dated_release_finds_the_model_it_extends():
    # --model refuses a name the table does not hold: `gpt-5-nano` is no release of `gpt-5`
    # (25x cheaper), `gpt-4.1-nano` none of `gpt-4.1`; a dated release or `-latest` finds its model
    for name in ("gpt-5-nano", "gpt-4.1-nano", "o4-mini-deep-research", "claude-opus-4-7"):
        with pytest.raises(UnknownModelError, match=f"no price for model '{name}'"):
            price_for(name, releases_only=True)
    assert price_for("gpt-4.1-mini-2025-04-14", releases_only=True).input == 0.4
    assert price_for("claude-sonnet-4-5-20250929", releases_only=True).input == 3.0
    assert price_for("claude-3-7-sonnet-latest", releases_only=True).output == 15.0
    assert price_for("gpt-5-2025-08-07", releases_only=True).input == 1.25
    with pytest.raises(RecordingError, match="--model: no price for model 'gpt-5-nano'"):
        model_for(Recording([], {"kind": "workload"}), Options(model="gpt-5-nano"))
