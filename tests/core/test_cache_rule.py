"""The prompt cache's break-even rule (cache_rule.py): both sides of the break-even, the TTL, the
overflow that always wins, and a property against the cache simulation that bills ``simulate``."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctxkernel.cache_rule import Edit, cache_cost, choose, decide, saving
from ctxkernel.pricing import PRICES, Bill, PromptCache, price_for

SONNET = price_for("claude-sonnet-4-5")  # input 3.00, write 3.75, read 0.30 per million
GPT = price_for("gpt-5")  # input 1.25 (a miss), read 0.125, automatic


def test_both_sides_of_the_break_even():
    # S * (w + (n-1) r) > R * (w - r): with n = 10, S * 6.45 > R * 3.45, so R = 10,000 breaks even
    # at S = 5,348.8 tokens
    r = 10_000
    below = decide(SONNET, Edit("clear", r, 5_348), remaining_steps=10)
    above = decide(SONNET, Edit("clear", r, 5_349), remaining_steps=10)
    assert below.action == "wait" and above.action == "clear"
    assert below.saving < below.cost and above.saving > above.cost
    assert "5348 fewer tokens" in below.reason and "10000 cached tokens" in below.reason


def test_the_horizon_moves_the_break_even():
    # one more request: a smaller edit pays; one request only: it must save more than it rewrites
    assert decide(SONNET, Edit("clear", 10_000, 5_000), remaining_steps=12).action == "clear"
    assert decide(SONNET, Edit("clear", 10_000, 9_000), remaining_steps=1).action == "wait"
    assert decide(SONNET, Edit("clear", 10_000, 9_300), remaining_steps=1).action == "clear"


def test_automatic_caching_has_no_write_premium_but_still_a_lost_read():
    # OpenAI bills a miss as input: rewriting R costs R * (input - cached)
    threshold = 10_000 * (1.25 - 0.125) / (1.25 + 9 * 0.125)  # 4,736.8 tokens
    assert decide(GPT, Edit("clear", 10_000, math.floor(threshold)), remaining_steps=10).action == "wait"
    assert decide(GPT, Edit("clear", 10_000, math.ceil(threshold)), remaining_steps=10).action == "clear"


def test_an_expired_cache_costs_nothing_to_rewrite():
    edit = Edit("clear", 50_000, 100)
    assert decide(SONNET, edit, remaining_steps=10).action == "wait"
    expired = decide(SONNET, edit, remaining_steps=10, idle_seconds=SONNET.cache_ttl_seconds + 1)
    assert expired.action == "clear" and expired.cost == 0


def test_an_overflow_always_wins_over_waiting():
    edit = Edit("compact", 100_000, 10, call_cost=5.0)
    assert decide(SONNET, edit, remaining_steps=10).action == "wait"
    forced = decide(SONNET, edit, remaining_steps=10, overflow=True)
    assert forced.action == "compact" and "overflow" in forced.reason


def test_an_edit_that_saves_nothing_waits():
    assert decide(SONNET, Edit("clear", 0, 0), remaining_steps=10).action == "wait"
    # nothing cached behind the edit: any saving pays
    assert decide(SONNET, Edit("clear", 0, 1), remaining_steps=10).action == "clear"


def test_a_summary_call_counts_against_the_edit():
    free = decide(SONNET, Edit("compact", 10_000, 8_000), remaining_steps=10)
    assert free.action == "compact"
    costly = decide(SONNET, Edit("compact", 10_000, 8_000, call_cost=free.saving), remaining_steps=10)
    assert costly.action == "wait"


def test_choose_picks_clear_compact_or_wait():
    clear = Edit("clear", 20_000, 15_000)
    compact = Edit("compact", 20_000, 19_000, call_cost=0.05)
    decision, edit = choose(SONNET, [clear, compact], remaining_steps=10)
    assert decision.action == "clear" and edit is clear  # the summary call eats its larger saving
    decision, edit = choose(SONNET, [clear, Edit("compact", 20_000, 19_000, call_cost=0.0)], remaining_steps=10)
    assert decision.action == "compact"
    decision, edit = choose(SONNET, [Edit("clear", 20_000, 100)], remaining_steps=10)
    assert decision.action == "wait" and edit is None
    decision, edit = choose(
        SONNET, [Edit("clear", 20_000, 100), Edit("clear", 20_000, 50)], remaining_steps=1, overflow=True
    )
    assert decision.action == "clear" and edit is not None and edit.saved_tokens == 100


def _bills(price, head: int, region: int, replacement: int, tails: list[int], idle: float) -> tuple[float, float]:
    """US dollars of the requests after an edit, waited with and made, through the simulated cache:
    a first request caches ``head`` + ``region``; then one request per tail, the first ``idle``
    seconds later, the next ones a second apart, each appending its tail."""

    def run(edited: bool) -> float:
        cache = PromptCache(price)
        blocks = [("head", head), ("region", region)]
        cache.request(0.0, blocks)
        if edited:
            blocks = [("head", head)] + ([("replacement", replacement)] if replacement else [])
        total = Bill()
        at = idle
        for i, tail in enumerate(tails):
            blocks = [*blocks, (f"tail {i}", tail)]
            total.add(cache.request(at, blocks))
            at += 1.0
        return price.cost(total)

    return run(False), run(True)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(sorted(PRICES)),
    head_steps=st.integers(32, 80),
    region_steps=st.integers(1, 400),
    kept=st.floats(0, 1),
    tails=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    idle=st.sampled_from([0.0, 60.0, 299.0, 301.0, 3_600.0]),
)
# a tie: editing saves exactly what it costs, and the bills differ in the last bit
@example(model="gpt-4.1-mini", head_steps=74, region_steps=171, kept=0.671875, tails=[1, 1, 1, 2, 1, 1], idle=0.0)
def test_the_rule_never_rewrites_the_prefix_for_less_than_its_cache_cost(
    model, head_steps, region_steps, kept, tails, idle
):
    """Whatever the model, sizes, horizon and pause: when the rule edits, the simulated provider
    bills less for the edited requests than for waiting; when it waits, editing would not have
    billed less. Sizes are multiples of 128 tokens (OpenAI's cache step) and the head is over
    every model's cache minimum, so the simulation and the rule count the same tokens."""
    price = PRICES[model]
    step = 128
    head, region = head_steps * step, region_steps * step
    replacement = int(region_steps * kept) * step
    tail_tokens = [t * step for t in tails]
    edit = Edit("clear", region, region - replacement)
    decision = decide(price, edit, remaining_steps=len(tails), idle_seconds=idle)
    waited, edited = _bills(price, head, region, replacement, tail_tokens, idle)
    assert math.isclose(waited - edited, decision.saving - decision.cost, rel_tol=1e-9, abs_tol=1e-12)
    if decision.edits:
        assert edited < waited
        assert saving(price, edit, remaining_steps=len(tails)) > cache_cost(price, edit, idle_seconds=idle)
    else:  # a tie waits; the two bills then differ by float rounding at most
        assert edited >= waited or math.isclose(edited, waited, rel_tol=1e-9)
