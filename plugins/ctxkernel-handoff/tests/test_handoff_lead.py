"""The handoff-log line's first line is read from the handoff's start (issue 21, item 2, seventh
round): ``leading_line`` against ``first_line(text).strip()``, which stripped and split the whole
16 KB handoff for it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.text import first_line
from ctxkernel_handoff.engine import LEADING_CHARS, leading_line


@given(
    head=st.text(st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x85\u2028ab<>")), max_size=30),
    middle=st.integers(0, 2 * LEADING_CHARS),
    tail=st.text(st.sampled_from(list(" \t\n\r\u2028ab")), max_size=30),
)
@settings(max_examples=300, deadline=None)
def test_the_leading_line_is_the_first_line_stripped(head, middle, tail):
    text = head + "x" * middle + tail
    assert leading_line(text) == first_line(text).strip()
