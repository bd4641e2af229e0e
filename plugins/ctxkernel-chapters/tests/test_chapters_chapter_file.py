"""Chapter files: frontmatter through a real YAML parser, sha256 of the body, tampering refused."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel_chapters.chapter_file import parse_chapter, render_chapter_file
from ctxkernel_chapters.storage import ArchiveError, IntegrityError


def _file(title: str, body: str = "# T\n\n**User** #1: hi\n") -> str:
    text, _ = render_chapter_file(
        chapter="003-x",
        title=title,
        session="s1",
        root="r0",
        seq_range=(184, 231),
        tokens=7420,
        generated_at="2026-09-15T17:22:04Z",
        artifacts=2,
        body=body,
    )
    return text


@settings(max_examples=300, deadline=None)
@given(title=st.text(min_size=0, max_size=200), body=st.text(max_size=300))
def test_frontmatter_round_trips_any_title(title, body):
    text = _file(title, body)
    chapter = parse_chapter(text)
    assert chapter.title == title
    assert chapter.body == body
    assert chapter.sha256 == hashlib.sha256(body.encode()).hexdigest()
    assert chapter.seq_range == (184, 231)
    # and a plain YAML parser agrees on every field
    front = yaml.safe_load(text[4 : text.index("\n---\n", 3) + 1])
    assert front["title"] == title and front["generatedAt"] == "2026-09-15T17:22:04Z"
    assert front["seqRange"] == [184, 231] and front["tokens"] == 7420 and front["artifacts"] == 2


@pytest.mark.parametrize(
    "title",
    [
        "a\n---\nb",
        "---",
        "key: value",
        "'quoted' \"double\"",
        "2026-01-01",
        "yes",
        "\x00\x1f",
        "# heading",
        "</chapters-toc>",
    ],
)
def test_awkward_titles_round_trip(title):
    assert parse_chapter(_file(title)).title == title


def test_tampered_body_is_refused():
    text = _file("Schema")
    with pytest.raises(IntegrityError, match="sha256"):
        parse_chapter(text.replace("hi", "HI"))


def test_registry_hash_mismatch_is_refused():
    text = _file("Schema")
    with pytest.raises(IntegrityError, match="registry"):
        parse_chapter(text, expect_sha256="0" * 64)


def test_missing_frontmatter_is_an_error():
    with pytest.raises(ArchiveError, match="frontmatter"):
        parse_chapter("# just markdown\n")
