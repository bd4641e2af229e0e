"""The sessions' turn semaphores (``TurnLocks``), some kept alive while free: whatever sequence of
requests takes and gives back turns, over more keys than are kept, each take succeeds exactly
when the key's turn is free in a model where every key has one semaphore forever, and a held
turn's semaphore is the one every later request of that key gets."""

from __future__ import annotations

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.serve.proxy import TurnLocks

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
OPS = st.lists(st.tuples(st.sampled_from(["take", "give"]), KEYS), max_size=60)


def take(turns: TurnLocks, held: dict[str, anyio.Semaphore], key: str) -> None:
    """One request's try for ``key``'s turn; ``held`` is the model (a key is busy while in it)."""
    lock = turns.get(key)
    if key in held:
        assert lock is held[key]
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            return
        raise AssertionError(f"{key}'s turn was taken twice")
    lock.acquire_nowait()  # a free turn is taken at once (WouldBlock fails the test)
    held[key] = lock


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 3), OPS)
def test_turns_behave_as_one_semaphore_per_key(recent: int, ops: list) -> None:
    async def run() -> None:
        turns = TurnLocks(recent)
        held: dict[str, anyio.Semaphore] = {}
        for op, key in ops:
            if op == "take":
                take(turns, held, key)
            elif key in held:  # a free semaphore past the kept ones goes at once (no cycle holds it)
                held.pop(key).release()
        for lock in held.values():
            lock.release()

    anyio.run(run)


def test_free_turns_past_the_bound_are_dropped() -> None:
    async def run() -> None:
        turns = TurnLocks(2)
        for key in "abcde":
            turns.get(key)
        assert sorted(turns._live.keys()) == ["d", "e"]  # freed by reference counting alone

    anyio.run(run)
