"""The archive on the strategy's blobs: name checks, and verification cached by content hash
(#21: a search re-reads and re-hashes a chapter only when its stored bytes changed)."""

from __future__ import annotations

import pytest
from helpers_chapters import archive_file, call_tool, chapters_kernel, registry, run_turns

from ctxkernel_chapters import plugin as chapters_plugin
from ctxkernel_chapters.storage import Archive, NotInArchiveError, PathEscapeError, VerifiedCache, check_name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("/etc/passwd", "absolute"),
        ("C:\\x", "absolute"),
        ("a/../../b", "'..'"),
        (".hidden", "not a name"),
        ("", "not a name"),
    ],
)
def test_names_outside_the_archive_are_refused(name, why):
    with pytest.raises(PathEscapeError, match=why):
        check_name(name)


def test_the_cache_is_bounded_least_recently_used_out_first():
    cache = VerifiedCache(limit=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3


def test_search_reads_a_chapter_once_until_its_bytes_change(tmp_path, monkeypatch):
    session = chapters_kernel(tmp_path, window=6_000, reserve=1_000, auto=False).open_session()
    run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    records = registry(session).records(session.id)
    reads: list[str] = []
    real = session.store.blob_get

    def counting(key):
        reads.append(key)
        return real(key)

    monkeypatch.setattr(session.store, "blob_get", counting)
    first = call_tool(session, "chapters_search", query="task")
    assert "match(es)" in first.content and "refused" not in first.content
    reads.clear()
    assert call_tool(session, "chapters_search", query="task").content == first.content
    assert reads == []  # verified before, unchanged: served from the cache, not read or hashed
    path = archive_file(session, records[0]["path"])
    path.write_text(path.read_text().replace("task", "tusk"))
    again = call_tool(session, "chapters_search", query="task")
    assert set(reads) == {f"chapters/{records[0]['path']}"}  # only the changed chapter is read again
    assert "refused (integrity check failed" in again.content and records[0]["id"] in again.content
    with pytest.raises(NotInArchiveError):
        Archive.of(session.context).read("nope/chapters/001-x.md")
