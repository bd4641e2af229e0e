"""The replacement that carries the user's instructions is counted from its parts (issue 21,
item 2): the block from the counts the ledger already holds for each instruction, the strategy's
replacement from its own count. Checked against the tokenizer on the whole text, for any
instructions (own and inherited, surrounding white space, punctuation, several lines) and any
replacement, with and without its count known."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Source, Span
from ctxkernel.compaction import checkpoint_message
from ctxkernel.instructions import (
    Instruction,
    block_message,
    block_text,
    block_tokens,
    carried_tokens,
    with_block,
)
from ctxkernel.messages import TextBlock
from ctxkernel.testing import build_kernel

PIECES = st.sampled_from(
    ["keep", " it", " short", ".", "!", "\n", "  ", "\t", "é", "\u00a0", "42", "'s", "/", ")", "中文", "<x>", "\n\n"]
)
TEXTS = st.lists(PIECES, min_size=1, max_size=14).map("".join)


@pytest.fixture(scope="module")
def session(tmp_path_factory: Any) -> Any:
    kernel = build_kernel(tmp_path_factory.mktemp("block"), fsync=False)
    return kernel.open_session()


@st.composite
def instructions(draw: st.DrawFn, session_id: str) -> list[Instruction]:
    items = []
    for seq in range(draw(st.integers(1, 8))):
        owner = session_id if draw(st.booleans()) else "parent-session"
        items.append(Instruction(owner, seq * 3 + 1, draw(TEXTS)))
    return items


@settings(
    max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None
)
@given(st.data())
def test_the_block_and_its_carrier_are_counted_as_the_tokenizer_counts_them(session: Any, data: st.DataObject) -> None:
    meter = session.meter
    items = data.draw(instructions(session.id))
    session.instruction_costs.clear()
    for item in items:  # the ledger knows some counts (exact ones: the surface's or the budget's)
        if data.draw(st.booleans()):
            session.instruction_costs[(item.session, item.seq)] = meter.count_text(item.text)
    assert block_tokens(session, items) == meter.count_text(block_text(items, session.id))
    assert carried_tokens(session, None, None, items) == meter.count_message(block_message(items, session.id))
    own = data.draw(
        st.one_of(
            TEXTS.map(lambda t: checkpoint_message(t, "basic")),
            TEXTS.map(lambda t: Message.user(t, Source.plugin_form("s", "summary"))),
            st.lists(TEXTS, min_size=2, max_size=3).map(
                lambda ts: Message("user", tuple(TextBlock(t) for t in ts), Source.plugin_form("s", "summary"))
            ),
        )
    )
    whole = meter.count_message(with_block(own, items, session.id))
    assert carried_tokens(session, own, None, items) == whole
    assert carried_tokens(session, own, meter.count_message(own), items) == whole


def test_the_block_puts_each_id_after_its_instruction(session: Any) -> None:
    items = [Instruction(session.id, 5, "  keep answers short.\n"), Instruction("parent", 9, "use tabs")]
    lines = block_text(items, session.id).splitlines()
    assert lines[2:] == ["keep answers short. [item_5]", "use tabs", "</user-instructions>"]


def test_a_commit_records_the_carriers_exact_count(tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path, model={"context_window": 8000, "reserved_output_tokens": 500}, fsync=False)
    session = kernel.open_session()
    for n in range(8):
        session.user(f"rule {n}: end every answer with a period." if n % 2 else f"rule {n} (no period)")
        session.prepare_request()
        session.commit_reply(Message.assistant(" ".join(f"w{n}x{i}" for i in range(40))))
        session.end_turn()
    nodes = session.surface.nodes
    result = session.compact(Span(nodes[0].seq, nodes[-3].seq, summary="the head"), strategy="basic")
    node = session.surface.node(result.spans[0].replacement_seq)
    assert "[item_" in node.message.text  # the block was pinned
    assert result.spans[0].tokens_after == node.tokens == session.meter.count_message(node.message)
