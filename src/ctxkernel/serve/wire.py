"""What the two wire formats share: the parsed client request, request errors, SSE framing,
and usage arithmetic.

A wire module (:mod:`.openai_wire`, :mod:`.anthropic_wire`) turns a client's body into a
:class:`ClientRequest` (kernel messages plus what must pass through untouched), composes the
upstream body from a prepared :class:`ctxkernel.Request`, reads replies, and translates a
stream. It holds no context logic: that is the Session API's.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..messages import Message

#: a client body larger than this is refused with 413 (a 100k-token history is about 0.5 MB)
MAX_BODY_BYTES = 64 * 1024 * 1024
#: one SSE line from the upstream longer than this ends the stream as an upstream error
MAX_SSE_LINE = 8 * 1024 * 1024
#: bound on the model name a client may route to (it is written to the log)
MAX_MODEL_CHARS = 200


class WireError(Exception):
    """A request the proxy refuses, reported in the client's API error shape.

    ``param`` names the offending field (``messages``, ``n``, ``stream`` ...); ``kind`` is the
    API's error type (``invalid_request_error`` and so on); ``code`` an optional error code.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code


@dataclass
class ClientRequest:
    """One client request, parsed and checked.

    ``messages`` are the client's history as kernel messages (system text apart); ``tools`` the
    client's tools as OpenAI function schemas (what the session's meter counts);
    ``raw_tools`` the client's tools exactly as sent (what the upstream receives back);
    ``body`` the client's whole body, whose unknown fields pass through to the upstream.
    """

    api: str
    body: dict[str, Any]
    model: str
    system: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    raw_tools: list[dict[str, Any]]
    stream: bool
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    #: ``reconcile.message_hash`` of each of ``messages`` (from the memo: computed once per message)
    hashes: list[str] | None = None

    @property
    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}


def obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: what the wire code walks an
    untrusted body with, so a missing or mistyped field reads as absent."""
    return value if isinstance(value, dict) else {}


def load_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 naming what is wrong with it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise WireError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def expect(
    body: dict[str, Any], name: str, kinds: type | tuple[type, ...], what: str, *, required: bool = False
) -> Any:
    """``body[name]`` when it has one of ``kinds`` (bools are never numbers), else a 400."""
    if name not in body or body[name] is None:
        if required:
            raise WireError(400, f"{name}: field required ({what})", param=name)
        return None
    value = body[name]
    kinds_tuple = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in kinds_tuple:
        raise WireError(400, f"{name}: expected {what}, got a boolean", param=name)
    if not isinstance(value, kinds_tuple):
        raise WireError(400, f"{name}: expected {what}, got {type(value).__name__}", param=name)
    return value


def check_model(body: dict[str, Any]) -> str:
    model = expect(body, "model", str, "a model name string", required=True)
    if not model or len(model) > MAX_MODEL_CHARS:
        raise WireError(400, f"model: expected 1-{MAX_MODEL_CHARS} characters, got {len(model)}", param="model")
    return model


@dataclass
class Converted:
    """A client history as converted by :meth:`MessageMemo.convert_history`: how many items it
    had and their JSON (kept to compare the next request with), the kernel messages and their
    hashes, the system texts found among the items."""

    count: int
    json: bytes
    messages: list[Message]
    hashes: list[str]
    system: list[str]


class MessageMemo:
    """Wire messages already converted, keyed by their JSON: a client re-sends its whole history
    every time, and converting (and hashing) only the messages never seen before keeps a
    request's cost flat in the history's length (``bench_serve.py``).

    The key is the message's JSON itself (``orjson.dumps`` of the parsed message, after the
    wire format's name), not a digest of it: a dict lookup hashes and compares those bytes in C,
    about three times cheaper than a cryptographic digest of them (the digest was most of a
    request's cost at 100k tokens), and equal keys mean equal messages, with no collision to
    reason about. Kernel messages are immutable, so sessions may share an entry. Bounded by
    entries and by the bytes its keys hold (least recently used goes first)."""

    def __init__(self, limit: int = 200_000, max_bytes: int = 256 << 20, histories: int = 256) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.held_bytes = 0
        self._entries: OrderedDict[bytes, tuple[tuple[Message, ...], tuple[str, ...]]] = OrderedDict()
        self.histories = histories
        self.held_items = 0  # items the remembered histories hold (bounded by ``limit`` too)
        self.held_history_bytes = 0  # their JSON (bounded by ``max_bytes`` too)
        self._histories: OrderedDict[bytes, Converted] = OrderedDict()

    def convert_history(
        self,
        api: bytes,
        items: list[Any],
        one: Callable[[int, Any], tuple[Sequence[Message], Sequence[str], str | None]],
    ) -> Converted:
        """A client's whole history converted: ``one(i, item)`` gives an item's messages, their
        hashes and its system text (or None).

        A client re-sends the history it sent last time plus a few new messages. The JSON of the
        last history that began with the same two items is compared with this one's (one
        ``bytes.startswith``, a ``memcmp``); when it is a prefix ending at an item boundary,
        its conversion is reused and only the new items are converted. Equal JSON means equal
        items, so two clients whose histories begin alike cannot get each other's messages.

        The history is remembered as JSON bytes, not as the parsed items: bytes hold no
        references, so the collector never walks them, while keeping thousands of parsed dicts
        alive from one request to the next made them survive into the oldest generation and
        set off a full collection every few requests (``bench_serve.py``: about a third of a
        request's CPU at 100k tokens)."""
        try:
            dumped = orjson.dumps(items)
            key = api + b"\0" + orjson.dumps(items[:2])
        except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
            dumped = key = b""
        out = Converted(len(items), dumped, [], [], [])
        start = 0
        previous = self._histories.get(key) if key else None
        if previous is not None and previous.count and _continues(dumped, previous.json):
            start = previous.count
            out.messages += previous.messages
            out.hashes += previous.hashes
            out.system += previous.system
        for i in range(start, len(items)):
            messages, hashes, system = one(i, items[i])
            out.messages += messages
            out.hashes += hashes
            if system:
                out.system.append(system)
        if key:
            old = self._histories.pop(key, None)
            if old is not None:
                self.held_items -= old.count
                self.held_history_bytes -= len(old.json)
            self.held_items += out.count
            self.held_history_bytes += len(out.json)
            self._histories[key] = out
            while self._histories and (
                len(self._histories) > self.histories
                or self.held_items > self.limit
                or self.held_history_bytes > self.max_bytes
            ):
                _, dropped = self._histories.popitem(last=False)
                self.held_items -= dropped.count
                self.held_history_bytes -= len(dropped.json)
        return out

    def convert(
        self,
        raw: Any,
        convert: Callable[[Any], list[Message]],
        hasher: Callable[[Message], str],
        *,
        api: bytes = b"",
    ) -> tuple[tuple[Message, ...], tuple[str, ...]]:
        """``convert(raw)`` and the hash of each result, from the memo when it has them.

        ``api`` names the wire format: the same JSON may read differently in another one."""
        try:
            key = api + b"\0" + orjson.dumps(raw)
        except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body): convert uncached
            messages = tuple(convert(raw))
            return messages, tuple(hasher(m) for m in messages)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        messages = tuple(convert(raw))
        entry = (messages, tuple(hasher(m) for m in messages))
        self._entries[key] = entry
        self.held_bytes += len(key)
        while self._entries and (len(self._entries) > self.limit or self.held_bytes > self.max_bytes):
            old, _ = self._entries.popitem(last=False)
            self.held_bytes -= len(old)
        return entry


def _continues(array: bytes, prefix: bytes) -> bool:
    """Whether the JSON array ``array`` starts with every item of the JSON array ``prefix``
    (both as ``orjson.dumps`` wrote them): ``[a,b`` is a prefix of it and the next byte ends an
    item. A JSON value cannot be continued past its end, so the first items are then equal."""
    end = len(prefix) - 1  # the position of prefix's closing bracket
    return len(array) > end and array.startswith(prefix[:end]) and array[end] in b",]"


# -- usage -------------------------------------------------------------------------------------------
def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    """The sum of two provider usage objects, key by key (nested counts too)."""
    if not isinstance(usage, dict):
        return total
    out: dict[str, Any] = dict(total or {})
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            previous = out.get(key)
            out[key] = (previous if isinstance(previous, int) and not isinstance(previous, bool) else 0) + value
        elif isinstance(value, dict):
            previous = out.get(key)
            out[key] = add_usage(previous if isinstance(previous, dict) else None, value)
        elif key not in out:
            out[key] = value
    return out


# -- server-sent events --------------------------------------------------------------------------------
@dataclass
class SSEEvent:
    event: str | None
    data: str


async def iter_sse(lines: AsyncIterator[str]) -> AsyncIterator[SSEEvent]:
    """Server-sent events from a stream of lines (the WHATWG framing: ``event:``, ``data:``,
    a blank line ends an event; comments and unknown fields are skipped)."""
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if len(line) > MAX_SSE_LINE:
            msg = f"the upstream sent an event line of {len(line)} characters (limit {MAX_SSE_LINE})"
            raise ValueError(msg)
        if not line:
            if data:
                yield SSEEvent(event, "\n".join(data))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield SSEEvent(event, "\n".join(data))


def wire_forms(
    seqs: list[int], messages: list[Message], cache: dict[Any, Any], convert: Callable[[Message], Any]
) -> list[Any]:
    """Each surface message in its wire form, converted once per node: ``cache`` (per session)
    maps a node's seq to the message object it was converted from and the result, so a request
    costs the new nodes only; entries for nodes that left the surface are dropped.

    The last call's nodes are kept too (under ``"last"``): when this request's surface starts
    with them, the same seqs holding the same message objects (compared in C), their forms are
    taken as a whole and only the nodes after them are looked at one by one."""
    forms: list[Any] = []
    done = 0
    last = cache.get("last")
    if last is not None:
        old_seqs, old_messages, old_forms = last
        done = len(old_seqs)
        if done <= len(seqs) and seqs[:done] == old_seqs and all(map(operator.is_, messages[:done], old_messages)):
            forms = list(old_forms)
        else:
            done = 0
    for i in range(done, len(seqs)):
        seq, message = seqs[i], messages[i]
        hit = cache.get(seq)
        if hit is None or hit[0] is not message:
            hit = (message, convert(message))
            cache[seq] = hit
        forms.append(hit[1])
    cache["last"] = (list(seqs), list(messages), list(forms))
    if len(cache) > 2 * len(seqs) + 64:  # forget nodes that left the surface
        keep = {*seqs, "last"}
        for key in [k for k in cache if k not in keep]:
            del cache[key]
    return forms


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
