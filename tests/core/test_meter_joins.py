"""The meter counts a text built from parts by adding the parts' counts only where BPE counts do
add: checked against the tokenizer itself on adversarial texts (newlines, spaces, punctuation,
digits, contractions, '/', CJK, combining marks, every Unicode white space)."""

from __future__ import annotations

import sys
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.meter import Meter, get_tokenizer, splits_after_newlines
from ctxkernel.testing import CountingTokenizer

METER = Meter(get_tokenizer())
ENCODE = METER.tokenizer._enc.encode_ordinary  # type: ignore[attr-defined]

#: the characters the pre-tokenizer treats differently, plus ordinary text
ALPHABET = st.sampled_from(
    list("ab Z9\n\r\t.,/'s-_)(\u00e9\u0301\u4e2d\u6587\u00a0\u2028\u3000\u0085\u200b\x1c")
    + ["'ll", "'re", "  ", "\n\n", " \n", ".\n", "123", "\r\n"]
)
TEXTS = st.lists(ALPHABET, max_size=24).map("".join)


def count(text: str) -> int:
    return len(ENCODE(text))


def test_the_bundled_encoding_is_the_one_whose_joins_are_proven() -> None:
    assert splits_after_newlines(get_tokenizer())


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(TEXTS, TEXTS)
def test_a_join_said_to_be_exact_adds_the_counts(left: str, right: str) -> None:
    if METER.joins_exactly(left, right):
        assert count(left + right) == count(left) + count(right)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(TEXTS.map(lambda t: t + "\n"), TEXTS.filter(lambda t: t[:1] not in ("", " ")))
def test_joins_after_a_newline_are_exact_whenever_claimed(left: str, right: str) -> None:
    """The same property where most draws are claimed exact (the first test's draws rarely are)."""
    if METER.joins_exactly(left, right):
        assert count(left + right) == count(left) + count(right)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(TEXTS, max_size=8), st.data())
def test_count_joined_is_the_count_of_the_whole(parts: list[str], data: st.DataObject) -> None:
    known = [data.draw(st.sampled_from([None, count(part)])) for part in parts]
    assert METER.count_joined(parts) == count("".join(parts))
    assert METER.count_joined(parts, known) == count("".join(parts))


def test_the_exactness_test_covers_every_white_space_of_the_pattern() -> None:
    """The pattern's \\s is Unicode White_Space; a right side starting with any of them is never
    taken as an exact join (str.isspace() is a superset)."""
    white_space = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert all(not METER.joins_exactly("a\n", ch + "b") for ch in white_space)
    # a few White_Space characters by name, in case isspace() ever narrowed
    for name in ("NO-BREAK SPACE", "OGHAM SPACE MARK", "LINE SEPARATOR", "IDEOGRAPHIC SPACE"):
        assert not METER.joins_exactly("a\n", unicodedata.lookup(name) + "b")


def test_known_inexact_joins_are_refused() -> None:
    assert count("end.\n") != count("end.") + count("\n")  # why a cut needs a rule at all
    assert not METER.joins_exactly("end.", "\nnext")
    assert not METER.joins_exactly("end\n", "\nnext")
    assert not METER.joins_exactly("end\n", " next")
    assert METER.joins_exactly("end.\n", "next")
    assert METER.joins_exactly("end.\n", "/usr")  # cl100k's punctuation stops at the newlines


def test_no_join_is_exact_for_a_tokenizer_without_the_proof(tmp_path: object) -> None:
    class Whole:
        name = "whole"

        def count(self, text: str) -> int:
            return len(text)

    meter = Meter(Whole())
    assert not meter.joins_exactly("a\n", "b")
    assert meter.count_joined(["a\n", "b"], [99, 99]) == 3  # the given counts are not trusted


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(TEXTS.filter(lambda t: t[-1:] not in ("", " ", "\n")), TEXTS.map(lambda t: " " + t))
def test_joins_before_a_space_are_exact_whenever_claimed(left: str, right: str) -> None:
    """The second rule: a space after a character that is not white space starts a new piece."""
    if METER.joins_exactly(left, right):
        assert count(left + right) == count(left) + count(right)


def test_a_space_after_white_space_is_no_exact_cut() -> None:
    white_space = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert all(not METER.joins_exactly("a" + ch, " b") for ch in white_space)
    assert count("a   b") != count("a ") + count("  b")  # why: spaces run together
    assert METER.joins_exactly("end.", " [item_3]\n") and METER.joins_exactly("word", " next")
    assert not METER.joins_exactly("end.", "\tnext") and not METER.joins_exactly("", " next")


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(TEXTS, TEXTS)
def test_count_extended_is_the_count_of_the_whole(text: str, suffix: str) -> None:
    """A text's count extended by a suffix: only its last line is tokenised again."""
    assert METER.count_extended(text, count(text), suffix) == count(text + suffix)


def test_a_long_text_counted_from_its_parts_is_not_tokenised_again() -> None:
    """A strategy counts its replacement from parts; the transaction's count of the same text must
    be a lookup, and the same number."""
    meter = Meter(get_tokenizer())
    counting = CountingTokenizer(meter.tokenizer)
    meter.tokenizer = counting  # the same encoding, its calls seen
    calls = counting.texts
    parts = [f"line {n} of the handoff, with a few words\n" for n in range(80)] + ["the end"]
    known = [count(part) for part in parts[:-1]] + [None]
    total = meter.count_joined(parts, known)
    assert calls == ["the end"]  # only the part nobody counted
    assert meter.count_text("".join(parts)) == total == count("".join(parts))
    assert calls == ["the end"]


def test_every_piece_of_one_to_three_digits_is_one_token() -> None:
    """What ``Meter.count_numbered`` counts a number by (cl100k cuts a run of digits in threes)."""
    pieces = [f"{i:0{n}d}" for n in (1, 2, 3) for i in range(10**n)]
    assert len(pieces) == 1110
    assert all(count(piece) == 1 for piece in pieces)


FRAMES = st.lists(ALPHABET, min_size=1, max_size=6).map("".join)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(FRAMES, st.one_of(st.integers(0, 10**4), st.integers(0, 10**30)), FRAMES)
def test_count_numbered_is_the_count_of_the_whole(prefix: str, number: int, suffix: str) -> None:
    assert METER.count_numbered(prefix, number, suffix) == count(f"{prefix}{number}{suffix}")


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 10**12))
def test_an_instruction_id_is_counted_without_tokenising_its_digits(seq: int) -> None:
    meter = Meter(get_tokenizer())
    counting = CountingTokenizer(meter.tokenizer)
    meter.tokenizer = counting  # the same encoding, its calls seen
    calls = counting.texts
    assert meter.count_numbered(" [item_", seq, "]\n") == count(f" [item_{seq}]\n")
    assert not [c for c in calls if any(ch.isdigit() for ch in c)]  # only the frame, once per process


def test_count_numbered_without_the_proof_counts_the_whole() -> None:
    class Whole:
        name = "whole"

        def count(self, text: str) -> int:
            return len(text)

    meter = Meter(Whole())
    assert meter.count_numbered(" [item_", 12345, "]\n") == len(" [item_12345]\n")
    assert METER.count_numbered(" [item_", -5, "]\n") == count(" [item_-5]\n")
    assert METER.count_numbered("a ", 7, "b") == count("a 7b")  # a space before: counted whole
