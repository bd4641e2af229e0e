"""The Responses API's kept responses: what ``previous_response_id`` is answered from.

A response ``serve`` gave (unless its request said ``store: false``) is kept in the store's
key-value table, namespace ``serve``, key ``response/<id>``, as a record::

    {"owner": tag, "key": session key, "previous": id or null, "keep": count (optional),
     "depth": references walked (optional), "size": characters,
     "items": [{"item": ..., "media": [[path, blob key, encoding, media type], ...]}, ...]}

- ``owner`` is the tenant's tag (the keyed hash of the request's credential, ``tenants.py``): a
  request naming the response with another credential is told there is no such response, as
  when it does not exist, so an id learnt by another tenant reads nothing.
- ``items`` are the request's new input items and the response's output items, each with its
  inline media (``data:`` URLs, base64 ``data`` and ``result`` fields) taken out into the store's
  blob table under ``media/<sha256>`` (the same blob a medium of the session's log uses) and
  recorded by where it goes back, so that it is put back byte for byte.
- ``previous`` and ``keep``: the conversation up to this response is ``previous``'s, its first
  ``keep`` items (all of them without ``keep``), then ``items``. A request naming
  ``previous_response_id`` continues that response. A request that sends its whole input (the
  API's default, ``store`` true, as ``responses.create`` in a loop does) continues the session's
  last kept response for as many items as its input repeats of that conversation, so only its new
  items are written: a session's records grow with the conversation, not with its square.
- ``depth``: how many records reading this one walks back before one that stands alone. At
  :data:`MAX_LINKS` a record holds its whole conversation again instead of a reference, so a
  read walks at most that many records however long the session (a prompt sampled a thousand
  times is a thousand short references otherwise).
- ``size`` is the characters the conversation up to this response holds with its media put back
  (an item a later request re-sent in another form is still counted once for the earlier one):
  a conversation is refused past :data:`~ctxkernel.serve.wire.MAX_BODY_BYTES`, what one request
  could have carried whole, and a response past it is kept as a marker that says so.

The last conversations read are kept in memory, media out, bounded by count and size.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from .. import media as media_rules
from ..logging import get_logger
from . import responses_wire
from .tenants import same_tenant
from .wire import MAX_BODY_BYTES, WireError

log = get_logger("ctxkernel.serve")

NAMESPACE = "serve"
#: how many kept responses a ``previous_response_id`` chain may walk back
MAX_CHAIN = 100_000
#: the characters a conversation may hold with its media put back (what one request may carry)
MAX_CONVERSATION_CHARS = MAX_BODY_BYTES
#: conversations kept in memory, and the characters they may hold together (media out)
CACHE_ENTRIES = 64
CACHE_CHARS = 256 << 20
#: sessions whose last kept response is remembered (a whole input continues it)
LAST_ENTRIES = 4096
#: records a read may walk back: a record that would be deeper holds its whole conversation
MAX_LINKS = 64
#: fields that hold a medium's bytes as plain base64: an ``input_audio`` part's ``data``, an
#: image generation call's ``result``; shorter ones than MIN_BASE64 stay in place
BASE64_FIELDS = frozenset({"data", "result"})
MIN_BASE64 = 1024
#: media are looked for this deep in an item (they sit two or three levels down)
MAX_DEPTH = 12

#: where a medium goes back in its item, its blob's key, ``data_url`` or ``base64``, its media type
MediaRef = tuple[list[str | int], str, str, str | None]


@dataclass(frozen=True)
class Conversation:
    """A kept conversation up to one response: whose, which session, its items (media out)."""

    owner: str
    key: str
    items: tuple[dict[str, Any], ...]
    #: characters with the media put back
    size: int
    #: records reading it walks back before one that stands alone (its record's ``depth``)
    depth: int = 0


# -- media out and back in -------------------------------------------------------------------------------
def detach_media(item: Any) -> tuple[dict[str, Any], dict[str, bytes], int]:
    """``item`` with its inline media taken out: ``{"item": ..., "media": [MediaRef, ...]}`` (each
    medium's string left empty), the media's bytes by blob key, and the characters they took.
    A string is taken out only when putting its bytes back gives the very same string."""
    refs: list[list[Any]] = []
    blobs: dict[str, bytes] = {}
    chars = 0

    def walk(value: Any, path: list[str | int], depth: int) -> Any:
        nonlocal chars
        if depth > MAX_DEPTH:
            return value
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if isinstance(v, str):
                    found = _medium(k, v)
                    if found is not None:
                        data, encoding, media_type = found
                        key = media_rules.blob_key(data)
                        blobs[key] = data
                        refs.append([[*path, k], key, encoding, media_type])
                        chars += len(v)
                        out[k] = ""
                        continue
                out[k] = walk(v, [*path, k], depth + 1)
            return out
        if isinstance(value, list):
            return [walk(v, [*path, i], depth + 1) for i, v in enumerate(value)]
        return value

    stripped = walk(item, [], 0)
    return {"item": stripped, "media": refs}, blobs, chars


def _medium(field: str, value: str) -> tuple[bytes, str, str | None] | None:
    if value.startswith("data:"):
        split = media_rules.split_data_url(value)
        if split is not None and media_rules.data_url(split[0], split[1]) == value:
            return split[1], "data_url", split[0]
        return None
    if field in BASE64_FIELDS and len(value) >= MIN_BASE64:
        data = media_rules.decode_b64(value)
        if data is not None and media_rules.b64(data) == value:
            return data, "base64", None
    return None


def attach_media(wrapped: dict[str, Any], blob: Callable[[str], bytes | None]) -> Any:
    """The item of a kept ``{"item", "media"}`` with its media put back (``blob`` gives a blob's
    bytes); :class:`LookupError` when a blob is gone, :class:`ValueError` for a damaged record."""
    refs = wrapped.get("media") or []
    if not refs:
        return wrapped["item"]
    item = copy.deepcopy(wrapped["item"])
    for ref in refs:
        if not (isinstance(ref, list) and len(ref) == 4 and isinstance(ref[0], list) and ref[0]):
            raise ValueError("a media reference is damaged")
        path, key, encoding, media_type = ref
        data = blob(key) if isinstance(key, str) else None
        if data is None:
            raise LookupError(key)
        parent = item
        for step in path[:-1]:
            parent = parent[step]
        if encoding == "data_url":
            parent[path[-1]] = media_rules.data_url(media_type, data)
        else:
            parent[path[-1]] = media_rules.b64(data)
    return item


# -- the records ------------------------------------------------------------------------------------------
def _record_key(response_id: str) -> str:
    return f"response/{response_id}"


class KeptResponses:
    """The kept responses of one store (every method does store I/O: worker threads only)."""

    def __init__(self, store: Any, blob: Callable[[str], bytes | None]) -> None:
        self.store = store
        self._blob = blob
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Conversation] = OrderedDict()
        self._cache_chars = 0
        self._stored: OrderedDict[str, None] = OrderedDict()  # blob keys known to be stored
        self._last: OrderedDict[tuple[str, str], str] = OrderedDict()  # (owner, session key): response id

    def conversation(self, response_id: str, owner: str) -> Conversation:
        """The conversation up to and including ``response_id`` for the credential tagged
        ``owner``; a 400 when there is none for it (never kept, ``store: false``, another
        credential's, damaged) or it was over :data:`MAX_CONVERSATION_CHARS`."""
        records: list[dict[str, Any]] = []
        base: Conversation | None = None
        current: str | None = response_id
        while current is not None:
            with self._lock:
                base = self._cache.get(current)
            if base is not None:
                break
            if len(records) >= MAX_CHAIN or not responses_wire.RESPONSE_ID.fullmatch(current):
                raise responses_wire.unknown_response(response_id)
            record = self.store.kv_get(NAMESPACE, _record_key(current))
            if not _valid(record) or not same_tenant(record["owner"], owner):
                raise responses_wire.unknown_response(response_id)
            if record.get("too_large"):
                raise too_large(response_id)
            records.append(record)
            current = record["previous"]
        if base is not None and not same_tenant(base.owner, owner):
            raise responses_wire.unknown_response(response_id)
        if not records:
            assert base is not None
            return base
        items = list(base.items if base is not None else ())
        for record in reversed(records):
            keep = record.get("keep", len(items))
            if keep > len(items):  # a damaged record: it cannot continue what it names
                log.warning("serve: a kept response is damaged", response=response_id[:100])
                raise responses_wire.unknown_response(response_id)
            del items[keep:]
            items.extend(record["items"])
        newest = records[0]
        depth = newest.get("depth", len(records) - 1 + (base.depth + 1 if base is not None else 0))
        conversation = Conversation(owner, newest["key"], tuple(items), newest["size"], depth)
        self._remember(response_id, conversation)
        return conversation

    def items(self, conversation: Conversation, response_id: str) -> list[Any]:
        """A conversation's items with their media put back (read from the blob table)."""
        try:
            return [attach_media(wrapped, self._blob) for wrapped in conversation.items]
        except LookupError as exc:
            raise WireError(
                400,
                f"previous_response_id: a medium of the conversation up to {response_id[:100]!r} is no longer "
                f"in the store ({exc}); send the whole input instead",
                param="previous_response_id",
                code="previous_response_not_found",
            ) from None
        except (ValueError, KeyError, IndexError, TypeError):
            log.warning("serve: a kept response is damaged", response=response_id[:100])
            raise responses_wire.unknown_response(response_id) from None

    def keep(
        self,
        response_id: str,
        owner: str,
        key: str,
        previous: Conversation | None,
        previous_id: str | None,
        items: list[Any],
        after: tuple[str, int] | None = None,
    ) -> bool:
        """Keep a response: its request's new input items and its output ``items``, media out.
        Without ``previous`` (no ``previous_response_id``), ``items`` are the request's whole
        input and output: what it repeats of the session's last kept conversation is written as a
        reference to that response (``keep``), not again. ``after`` (a response id and a count):
        the caller proved that the input begins with that many items of that response's
        conversation, and ``items`` are the rest; False, keeping nothing, when that conversation
        is not this tenant's session's to continue (the caller then gives the whole input)."""
        repeats = None
        if previous is None and after is not None:
            prior_id, count = after
            prior = self._readable(prior_id, owner)
            if prior is None or prior.key != key or len(prior.items) < count:
                return False
            previous_id, previous = prior_id, prior
            same = _repeated(prior.items[count:], items)
            repeats, items = count + same, items[same:]
        elif previous is None:
            last = self._last_of(owner, key)
            if last is not None:
                same = _repeated(last[1].items, items)
                if same:
                    previous_id, previous = last
                    repeats, items = same, items[same:]
        detached = [detach_media(item) for item in items]
        wrapped = [one for one, _, _ in detached]
        media = [blobs for _, blobs, _ in detached]
        base = () if previous is None else previous.items if repeats is None else previous.items[:repeats]
        size = len(orjson.dumps(wrapped)) + sum(chars for _, _, chars in detached)
        if previous is not None:
            dropped = previous.items[len(base) :]
            size += previous.size - (len(orjson.dumps(list(dropped))) if dropped else 0)
        if previous is not None and previous.depth + 1 >= MAX_LINKS:
            # deep enough: this record stands alone, so no read walks further than MAX_LINKS
            wrapped, base, previous, previous_id, repeats = [*base, *wrapped], (), None, None, None
        record: dict[str, Any] = {"owner": owner, "key": key, "previous": previous_id, "size": size}
        if repeats is not None:
            record["keep"] = repeats
        depth = 0 if previous is None else previous.depth + 1
        if depth:
            record["depth"] = depth
        if size > MAX_CONVERSATION_CHARS:
            # what a later request could not carry whole is not kept; the marker says why
            self.store.kv_put(NAMESPACE, _record_key(response_id), {**record, "items": [], "too_large": True})
            return True
        for blobs in media:  # before the record that cites them (the base's are in already)
            for blob_key, data in blobs.items():
                self._store_blob(blob_key, data)
        record["items"] = wrapped
        self.store.kv_put(NAMESPACE, _record_key(response_id), record)
        self._remember(response_id, Conversation(owner, key, (*base, *wrapped), size, depth))
        with self._lock:
            self._last[(owner, key)] = response_id
            self._last.move_to_end((owner, key))
            while len(self._last) > LAST_ENTRIES:
                self._last.popitem(last=False)
        return True

    def _last_of(self, owner: str, key: str) -> tuple[str, Conversation] | None:
        """The session's last kept response and its conversation (None: none kept, or no
        longer readable)."""
        with self._lock:
            last = self._last.get((owner, key))
        if last is None:
            return None
        conversation = self._readable(last, owner)
        return None if conversation is None else (last, conversation)

    def _readable(self, response_id: str, owner: str) -> Conversation | None:
        """The conversation up to ``response_id`` for ``owner``, or None where
        :meth:`conversation` refuses it (gone, damaged, too large, another tenant's)."""
        with self._lock:
            conversation = self._cache.get(response_id)
        if conversation is not None and same_tenant(conversation.owner, owner):
            return conversation
        try:
            return self.conversation(response_id, owner)
        except WireError:
            return None

    def _store_blob(self, key: str, data: bytes) -> None:
        with self._lock:
            if key in self._stored:
                return
        if self.store.blob_stat(key) is None:
            self.store.blob_put(key, data)
        with self._lock:
            self._stored[key] = None
            while len(self._stored) > 4096:
                self._stored.popitem(last=False)

    def _remember(self, response_id: str, conversation: Conversation) -> None:
        with self._lock:
            old = self._cache.pop(response_id, None)
            if old is not None:
                self._cache_chars -= old.size
            self._cache[response_id] = conversation
            self._cache_chars += conversation.size
            while self._cache and (len(self._cache) > CACHE_ENTRIES or self._cache_chars > CACHE_CHARS):
                _, dropped = self._cache.popitem(last=False)
                self._cache_chars -= dropped.size


def _repeated(kept: tuple[dict[str, Any], ...], items: list[Any]) -> int:
    """How many of the first ``items`` (as a request sent them) are the ``kept`` ones, as JSON:
    Python's ``==`` holds ``1``, ``1.0`` and ``true`` equal, so equal items are also compared as
    orjson writes them."""
    same = 0
    for old, new in zip(kept, items, strict=False):
        # an item kept without media is kept as it came: compared as it is, not taken apart
        ours = detach_media(new)[0] if old["media"] else new
        theirs = old if old["media"] else old["item"]
        if theirs != ours or _json(theirs) != _json(ours):
            break
        same += 1
    return same


def _json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
        return b""


def too_large(response_id: str) -> WireError:
    return WireError(
        400,
        f"previous_response_id: the conversation up to {response_id[:100]!r} holds more than the "
        f"{MAX_CONVERSATION_CHARS} bytes a request may carry, so it was not kept; start a new conversation "
        "or send the input whole",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def _valid(record: Any) -> bool:
    """Whether a stored record has the shape :meth:`KeptResponses.keep` writes."""
    return (
        isinstance(record, dict)
        and isinstance(record.get("owner"), str)
        and isinstance(record.get("key"), str)
        and (record.get("previous") is None or isinstance(record.get("previous"), str))
        and (
            "keep" not in record
            or (
                type(record["keep"]) is int  # not a bool
                and record["keep"] >= 0
                and record.get("previous") is not None
            )
        )
        and ("depth" not in record or (type(record["depth"]) is int and 0 < record["depth"] < MAX_CHAIN))
        and isinstance(record.get("size"), int)
        and isinstance(record.get("items"), list)
        and all(isinstance(w, dict) and isinstance(w.get("item"), dict) for w in record["items"])
    )
