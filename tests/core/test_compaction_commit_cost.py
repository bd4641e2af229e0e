"""What a compaction transaction costs besides its own work (issue 21, item 2): one synced write
to the log, an instruction ledger folded with the events rather than rebuilt from the log, and
instruction costs taken from the meter's counts of the surface instead of a second tokenising.

Timings live in ``benchmarks/bench_compaction.py``; these tests pin the counts that make them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Span, balanced_cut_at_or_before
from ctxkernel import instructions as instructions_module
from ctxkernel.instructions import ledger_of, normalized, protected
from ctxkernel.store import jsonl as jsonl_module
from ctxkernel.testing import FsyncCounter, build_kernel

WINDOW = {"context_window": 6000, "reserved_output_tokens": 500}


def chat(session: Any, instruction: str, words: int = 60) -> None:
    session.user(instruction)
    session.prepare_request()
    session.commit_reply(Message.assistant(" ".join(f"w{session.next_seq}x{i}" for i in range(words))))
    session.end_turn()


def head_span(session: Any, summary: str | None = "summary of the head") -> Span:
    nodes = session.surface.nodes
    cut = balanced_cut_at_or_before(session.surface, len(nodes) - 1)
    return Span(nodes[0].seq, nodes[cut - 1].seq, summary=summary)


def test_a_compaction_syncs_the_log_once(tmp_path, monkeypatch):
    kernel = build_kernel(tmp_path, model=WINDOW)
    session = kernel.open_session()
    for n in range(6):
        chat(session, f"instruction {n}: keep the parser strict")
    before = len(session.events)
    fsyncs = FsyncCounter(monkeypatch)
    result = session.compact(head_span(session), strategy="basic")
    # the lock (compaction/start) and the commit batch are two appends, but only the commit
    # waits for the disk; its sync carries the lock with it
    assert result.start_seq == before
    assert [e.type for e in session.events[before : before + 1]] == ["compaction/start"]
    assert fsyncs.calls == 1
    reopened = build_kernel(tmp_path, model=WINDOW).open_session(session.id)
    assert [e.to_dict() for e in reopened.events] == [e.to_dict() for e in session.events]


def test_a_compaction_reads_no_log_bytes_it_wrote_itself(tmp_path, monkeypatch):
    """The refreshes of a transaction whose writer is this process answer from the file's size
    (jsonl ``_scan``): the log is opened only by the two appends, never read back."""
    kernel = build_kernel(tmp_path, model=WINDOW, fsync=False)
    session = kernel.open_session()
    for n in range(4):
        chat(session, f"instruction {n}")
    opened: list[tuple[str, str]] = []

    def counting(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened.append((str(file), mode))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(jsonl_module, "open", counting, raising=False)
    session.compact(head_span(session), strategy="basic")
    log = str(session.store.path(session.id))
    assert [mode for file, mode in opened if file == log] == ["r+b", "r+b"]  # the lock, the commit
    # another writer's append is still seen: the size moved past what this process knows
    other = build_kernel(tmp_path, model=WINDOW, fsync=False).open_session(session.id)
    before = len(session.events)
    other.user("from another process")
    assert session.refresh() == len(other.events) - before > 0
    assert [e.to_dict() for e in session.events] == [e.to_dict() for e in other.events]


def test_a_failed_summary_still_ends_its_compaction_durably(tmp_path, monkeypatch):
    kernel = build_kernel(tmp_path, model=WINDOW)
    session = kernel.open_session()
    for n in range(4):
        chat(session, f"instruction {n}")
    fsyncs = FsyncCounter(monkeypatch)
    span = head_span(session, summary=None)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("summarizer down")

    monkeypatch.setattr(kernel.hooks, "summarize", broken)
    try:
        session.compact(span, strategy="basic")
    except RuntimeError:
        pass
    else:  # pragma: no cover - the summarizer raised, so must the transaction
        raise AssertionError("the transaction hid its summarizer's error")
    assert [e.type for e in session.events[-2:]] == ["compaction/start", "compaction/end"]
    assert "error" in session.events[-1].data
    assert fsyncs.calls == 1  # the error end is synced, and carries the lock with it
    assert session.open_compaction is None


def test_a_compaction_does_not_walk_the_log_for_the_ledger(tmp_path, monkeypatch):
    kernel = build_kernel(tmp_path, model=WINDOW)
    session = kernel.open_session()
    for n in range(8):
        chat(session, f"instruction {n}: use tabs")
    calls = {"n": 0}
    real = instructions_module.instruction_of

    def counting(*args: Any) -> Any:
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(instructions_module, "instruction_of", counting)
    before = len(session.events)
    session.compact(head_span(session), strategy="basic")
    # the ledger folded each event as it was appended: the compaction reads it, and looks only
    # at its own commit's events (a walk of the log would look at every user message again)
    assert 0 < before
    assert calls["n"] <= len(session.events) - before
    assert session.instructions == ledger_of(session.id, list(session.events))


texts = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1, max_size=80
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts.filter(lambda t: t.strip()), min_size=1, max_size=6), st.integers(0, 3))
def test_instruction_costs_from_the_surface_are_the_tokenizers(tmp_path_factory, instructions, compactions):
    kernel = build_kernel(tmp_path_factory.mktemp("costs"), model=WINDOW)
    session = kernel.open_session()
    for i, text in enumerate(instructions):
        chat(session, text, words=20)
        if i < compactions and len(session.surface) > 2:
            session.compact(head_span(session), strategy="basic")
    protected(session)  # fills the costs, from the surface where the node is visible
    ledger = session.instructions
    # the normalised texts the search for lost instructions reads come from a cache per node
    kept = instructions_module._kept_texts(session, set())
    assert kept == [normalized(n.message.text) for n in session.surface.nodes]
    assert len(session.instruction_texts) <= 2 * len(session.surface) + 256
    assert ledger == ledger_of(session.id, list(session.events))
    for item in ledger:
        cost = session.instruction_costs.get((item.session, item.seq))
        if cost is not None:
            assert cost == session.meter.count_text(item.text), item


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from(["alpha ", "β-γ ", "def f():\n    return 1\n", "  \n", "x" * 7]), min_size=1), st.data()
)
def test_the_meters_memo_answers_what_the_tokenizer_does(pieces, data):
    from ctxkernel.meter import MEMO_ENTRIES, MEMO_MIN_CHARS, Meter, get_tokenizer

    tokenizer = get_tokenizer()
    meter = Meter(tokenizer)
    texts = ["".join(pieces) * (1 + MEMO_MIN_CHARS // max(1, len("".join(pieces)))) + str(i) for i in range(12)]
    order = data.draw(st.lists(st.sampled_from(texts), min_size=1, max_size=30))
    for text in order:
        assert meter.count_text(text) == tokenizer.count(text)
        assert meter.count_message(Message.user(text)) == 4 + tokenizer.count(text)
        assert len(meter._memo) <= MEMO_ENTRIES


def test_one_renewer_thread_renews_every_held_lease(tmp_path):
    import threading
    import time
    import urllib.parse

    import orjson

    from ctxkernel.lease import CompactionLease

    # a term long enough that a loaded machine's scheduling stalls cannot lose a lease, polled for
    # its renewal rather than slept past a fixed time (a fixed 0.45 s failed under a load of 12)
    kernel = build_kernel(tmp_path, model=WINDOW, store={"lease_seconds": 1.2})
    sessions = [kernel.open_session() for _ in range(3)]
    leases = [CompactionLease(s) for s in sessions]
    files = [tmp_path / "leases" / (urllib.parse.quote(lease.name, safe="") + ".json") for lease in leases]
    threads = threading.active_count()
    for lease in leases:
        lease.acquire()
    assert threading.active_count() <= threads + 1  # one renewer for all, started at most once
    first = [orjson.loads(f.read_bytes())["expires"] for f in files]
    deadline = time.monotonic() + 10
    while not all(orjson.loads(f.read_bytes())["expires"] > e for f, e in zip(files, first, strict=True)):
        assert time.monotonic() < deadline, "a held lease was not renewed within 10 s"
        time.sleep(0.05)  # every lease is renewed at a third of its term
    assert not any(lease.lost.is_set() for lease in leases)
    for lease in leases:
        lease.release()
    assert not any(f.exists() for f in files)
    time.sleep(0.5)  # past a third of the term: a released lease is not renewed back into existence
    assert not any(f.exists() for f in files)
    again = CompactionLease(sessions[0])
    again.acquire()
    assert threading.active_count() <= threads + 1
    again.release()


def test_the_renewer_is_not_woken_for_a_lease_it_renews_in_time_anyway():
    """Waking the renewer at every ``acquire`` handed it the GIL mid-transaction: idle, it wakes
    every third of the last lease's term by itself, and a lease of that term (or longer) is
    added without a notify; a shorter one still wakes it. Every lease is renewed in time."""
    import time

    from ctxkernel.lease import Renewals

    class Probe:
        def __init__(self, seconds: float) -> None:
            self.seconds, self.renewed = seconds, []

        def renew(self) -> bool:
            self.renewed.append(time.monotonic())
            return True

    renewals = Renewals()
    real, notified = renewals._cond.notify, []
    renewals._cond.notify = lambda *a: (notified.append(1), real(*a))  # type: ignore[method-assign]
    first = Probe(0.9)  # terms long enough for a loaded machine's scheduling slack (0.3 s)
    renewals.add(first)
    time.sleep(0.05)  # the thread is waiting now
    renewals.discard(first)
    later = [Probe(0.9), Probe(1.8)]
    added = time.monotonic()
    for probe in later:
        renewals.add(probe)
    assert notified == []
    short = Probe(0.27)
    renewals.add(short)
    assert notified == [1]  # due before the thread would wake by itself
    time.sleep(1.0)
    for probe in [*later, short]:
        assert probe.renewed, probe.seconds
        # renewed by a third of its term (plus scheduling slack), far inside the term itself
        assert probe.renewed[0] - added < probe.seconds / 3 + 0.3
    for probe in [*later, short]:
        renewals.discard(probe)
    renewals.add(calm := Probe(60.0))  # the idle thread left behind wakes every 20 s, not 30 ms
    renewals.discard(calm)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_the_meters_bound_without_tokenising_is_never_below_the_count(text):
    from ctxkernel.meter import Meter, get_tokenizer

    meter = Meter(get_tokenizer())
    message = Message.user(text)
    bound = meter.message_at_most(message)
    assert bound is not None and meter.count_message(message) <= bound


def test_a_pinned_replacement_is_tokenised_once_and_still_shrink_checked(tmp_path):
    """The replacement that carries the instruction block is counted from its parts: its own
    text once (not again for the shrink check when its byte length already proves it shrinks
    the span), the block from the instructions' counts; neither the block nor the whole carrier
    is tokenised. One that does not shrink is still refused."""
    import pytest

    from ctxkernel import ShrinkCheckError
    from ctxkernel.compaction import checkpoint_message

    kernel = build_kernel(tmp_path, model=WINDOW, fsync=False)
    session = kernel.open_session()
    for n in range(6):
        chat(session, f"instruction {n}: keep the parser strict")
    counted: list[str] = []
    real = session.meter.count_text

    def counting(text: str) -> int:
        counted.append(text)
        return real(text)

    session.meter.count_text = counting  # type: ignore[method-assign]
    span = head_span(session, summary="the head, summarised")
    result = session.compact(span, strategy="basic")
    assert "instructions" in session.events[result.start_seq + 1].data  # the block was pinned
    own = checkpoint_message("the head, summarised", "basic").text
    assert counted.count(own) == 1  # once, for the carrier's count
    node = session.surface.node(result.spans[0].replacement_seq)
    # the block is counted from its parts: its frame once per process, never the whole block
    assert not any("<user-instructions>" in text and "[item_" in text for text in counted)
    assert result.spans[0].tokens_after == node.tokens == real(node.message.text) + 4
    long = " ".join(f"w{i}" for i in range(3000))
    for n in range(3):
        chat(session, f"more instruction {n}")
    with pytest.raises(ShrinkCheckError):
        session.compact(head_span(session, summary=long), strategy="basic")


def test_the_replacement_takes_its_count_without_a_surface_lookup(tmp_path):
    """The commit counted its replacement for the shrink check: the node that lands takes that
    count from the meter's uncounted nodes, and the surface's position index, which the
    replacement invalidated, is rebuilt by the next lookup, not inside the transaction."""
    kernel = build_kernel(tmp_path, model=WINDOW, fsync=False)
    session = kernel.open_session()
    for n in range(4):
        chat(session, f"instruction {n}: keep the parser strict")
    result = session.compact(head_span(session), strategy="basic")
    seq = result.spans[0].replacement_seq
    assert session.surface._pos is None  # nothing looked a node up since the replacement
    node = session.surface.node(seq)
    assert node is not None
    assert node.tokens == result.spans[0].tokens_after == session.meter.count_message(node.message)
    assert session.meter.uncounted_node(seq) is node  # counted, and still the meter's to add
    assert session.meter.surface_tokens() == sum(session.meter.count_message(n.message) for n in session.surface)
