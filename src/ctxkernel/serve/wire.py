"""What the two wire formats share: the parsed client request, request errors, SSE framing,
and usage arithmetic.

A wire module (:mod:`.openai_wire`, :mod:`.anthropic_wire`) turns a client's body into a
:class:`ClientRequest` (kernel messages plus what must pass through untouched), composes the
upstream body from a prepared :class:`ctxkernel.Request`, reads replies, and translates a
stream. It holds no context logic: that is the Session API's.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..errors import EventError
from ..jsonbytes import dumps_kept, int_or_float, loads, no_constant
from ..logging import get_logger
from ..messages import Message, check_new_calls
from ..pairing import CallIds
from ..text import storable

log = get_logger("ctxkernel.serve")

#: a client body larger than this is refused with 413 (a 100k-token history is about 0.5 MB)
MAX_BODY_BYTES = 64 * 1024 * 1024
#: one SSE line from the upstream longer than this ends the stream as an upstream error
MAX_SSE_LINE = 8 * 1024 * 1024
#: bound on the model name a client may route to (it is written to the log), and on the one an
#: upstream reply names (it is passed back to the client)
MAX_MODEL_CHARS = 200
#: the most messages one request's history may hold (a 100k-token coding history is about 900)
MAX_MESSAGES = 10_000
#: the most content parts (text, tool results, images...) the messages new to a request may hold
MAX_PARTS = 50_000
#: the most tools one request may declare
MAX_TOOLS = 1_000
#: the most JSON objects a dense body may hold (see :func:`parse_json`): room for a history at
#: the bounds above, with its tool calls and schemas
MAX_OBJECTS = 4 * (MAX_MESSAGES + MAX_PARTS)
#: the deepest JSON orjson writes (it reads 1,024 levels): everything serve writes (the session
#: log, a kept response, the upstream's body) nests at most this deep
ENCODER_DEPTH = 254
#: how deep a client's JSON may nest, counted from its body (the body itself is level 1); the
#: rest of :data:`ENCODER_DEPTH` is room for what wraps a part in what serve writes (a message in
#: a session log's record, a tool call's argument string read into an object, a tool result's
#: part in its block)
MAX_DEPTH = 240


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
    ``body`` the client's body, whose unknown fields pass through to the upstream (its
    ``messages`` may hold only the items after the ones a remembered body had: ``messages``
    above is the whole history; see :meth:`MessageMemo.parse`).
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


class Translator(Protocol):
    """What the routes drive a wire format's ``StreamTranslator`` with: the upstream's events of
    one or more rounds in, the client's one stream out."""

    strategy_tools: set[str]
    #: the ids the round's tool calls may take (the routes give each round its own)
    ids: CallIds
    #: the model name the client asked for: what it gets when the upstream's is not a name
    model: str

    @property
    def round_complete(self) -> bool:
        """The round's reply is whole (its last event seen)."""
        ...

    def begin_round(self) -> None: ...

    def feed_event(self, event: str | None, data: dict[str, Any]) -> list[bytes]:
        """One upstream event (its SSE ``event:`` name and its data) in; the client's bytes out."""
        ...

    def end_round(self) -> tuple[list[bytes], Message, dict[str, Any] | None, list[str]]: ...

    def finish_stream(self) -> list[bytes]: ...

    def error_event(self, message: str, kind: str = "api_error") -> list[bytes]: ...

    def passthrough_error(self, error: dict[str, Any]) -> list[bytes]: ...

    def client_view(self) -> Message: ...


def obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: what the wire code walks an
    untrusted body with, so a missing or mistyped field reads as absent."""
    return value if isinstance(value, dict) else {}


#: a body at most this large is parsed by orjson whatever its shape (its cost is small anyway)
SMALL_BODY_BYTES = 64 * 1024
_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes, *, lean: bool = False) -> Any:
    """A client's JSON, parsed with its memory bounded by a small multiple of its size.

    orjson builds a document of its own first (about 12 bytes per byte of input) and then the
    Python objects: for a body of tiny values (100,000 one-character messages, 3 MB) the
    objects alone take 10 times the body and the peak was 22 times. A body large enough to
    matter whose braces and brackets are dense (one per 40 bytes or more: a real history is
    text) is parsed by the standard library instead, which builds the objects directly and here
    counts them as it goes (at most :data:`MAX_OBJECTS`); a body that is mostly brackets (one
    per 8 bytes) is no request at all and is refused before any parsing. Each refusal is a 400
    naming the bound; a lone surrogate becomes U+FFFD either way (:func:`ctxkernel.jsonbytes.loads`).

    ``lean``: a large body is parsed by the standard library whatever its shape. orjson's
    document peaks near 14 times a text body (a 436 KB history: 13.7 times, against 2.7 for the
    standard library, which takes 1.1 ms where orjson takes 0.4), so a caller that parses a body
    whole while its session already holds several times it asks for the lower peak."""
    if len(raw) <= SMALL_BODY_BYTES:
        return loads(raw)
    arrays = raw.count(b"[")
    if arrays * 8 > len(raw):
        msg = f"the request body holds {arrays} '[' in {len(raw)} bytes: not a chat request"
        raise WireError(400, msg)
    if not lean and (arrays + raw.count(b"{")) * 40 <= len(raw):
        return loads(raw)
    built = 0

    def counted(value: dict[str, Any]) -> dict[str, Any]:
        nonlocal built
        built += 1
        if built > MAX_OBJECTS:
            msg = (
                f"the request body holds more than {MAX_OBJECTS} JSON objects; ctxkernel serve takes at most that many"
            )
            raise WireError(400, msg)
        return value

    try:
        value = json.loads(raw, object_hook=counted, parse_constant=no_constant, parse_int=int_or_float)
    except RecursionError:
        msg = "the request body is nested too deeply"
        raise WireError(400, msg) from None
    return storable(value) if _LONE_SURROGATE.search(raw) else value


def nested(value: Any, level: int) -> Any:
    """``value`` wrapped in as many one-item arrays as put it ``level`` levels deep in a body,
    with the room :data:`MAX_DEPTH` keeps: orjson writes it only when ``value`` nests within
    :data:`MAX_DEPTH` counted from the body (its encoder walks it, in C: a check that costs
    nothing where the value is encoded anyway)."""
    for _ in range(level - 1 + ENCODER_DEPTH - MAX_DEPTH):
        value = [value]
    return value


def too_deep(exc: TypeError) -> bool:
    """Whether orjson refused to write a value for its nesting (:func:`nested`)."""
    return "Recursion limit" in str(exc)


def fits(value: Any, level: int) -> bool:
    """Whether ``value``, ``level`` levels deep in a client's body, nests within
    :data:`MAX_DEPTH` (one encode: for a part no encode of serve's checks anyway)."""
    try:
        orjson.dumps(nested(value, level))
    except TypeError as exc:
        if too_deep(exc):
            return False
        raise
    return True


def depth_refusal(where: str) -> str:
    """What a client is told of a part of its body nested too deeply."""
    return (
        f"{where}: nested too deeply; ctxkernel serve takes JSON nested at most {MAX_DEPTH} levels, counted "
        f"from the request body, a tool call's argument string as the JSON it holds (what serve writes "
        f"nests at most {ENCODER_DEPTH}, with room for what wraps it)"
    )


def check_depth(parsed: ParsedBody) -> None:
    """Refuse with a 400 a field of the body, other than its history (whose items are checked
    as they are converted: :meth:`MessageMemo.convert`), nested deeper than :data:`MAX_DEPTH`.
    A body's fields that a remembered body had (``parsed.fields``) were checked with it: only
    a body parsed whole pays the one encode of its fields."""
    if parsed.fields:
        return
    for name, value in parsed.body.items():
        if name != parsed.array and isinstance(value, (dict, list)) and not fits(value, 2):
            raise WireError(400, depth_refusal(name), param=name)


def check_reply(message: Message) -> None:
    """A ``ValueError`` (an unreadable reply) for an upstream reply holding JSON nested deeper
    than :data:`MAX_DEPTH`, counted from a log record (a tool call's arguments, a block kept as
    it came): read 1,024 levels deep, it would fail where serve writes it. Only a reply's tool
    calls and kept blocks are encoded to tell: a text reply costs nothing. A tool name the log
    would refuse is unreadable too (an id past the bound is renamed instead, as a reused one is)."""
    try:
        check_new_calls(message, ids=False)
    except EventError as exc:
        raise ValueError(str(exc)) from None
    for block in message.content:
        value = getattr(block, _PROVIDER_JSON.get(block.type, ""), None)
        # record, data, message, content, block, then the value
        if value is not None and not fits(value, 6):
            msg = (
                f"a {block.type} block nested too deeply (ctxkernel serve takes JSON nested at most "
                f"{MAX_DEPTH} levels, counted from the session log's record; what it writes nests at most {ENCODER_DEPTH})"
            )
            raise ValueError(msg)


#: the field of a kernel block that holds a provider's JSON as it came
_PROVIDER_JSON = {"tool_call": "arguments", "opaque": "data", "media": "wire"}


def load_json_object(raw: bytes, *, lean: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 naming what is wrong with it (``lean``: see
    :func:`parse_json`)."""
    try:
        body = parse_json(raw, lean=lean)
    except ValueError as exc:  # orjson's JSONDecodeError, the standard library's, UnicodeDecodeError
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
    model: str = expect(body, "model", str, "a model name string", required=True)
    if not model or len(model) > MAX_MODEL_CHARS:
        raise WireError(400, f"model: expected 1-{MAX_MODEL_CHARS} characters, got {len(model)}", param="model")
    return model


def model_name(value: Any, fallback: str) -> str:
    """A model name an upstream reply gives, passed back only when it is 1 to
    :data:`MAX_MODEL_CHARS` characters of text; else ``fallback`` (the name the client asked for)."""
    return value if isinstance(value, str) and 0 < len(value) <= MAX_MODEL_CHARS else fallback


def check_size(parsed: ParsedBody, what: str = "messages") -> None:
    """Refuse a history longer than :data:`MAX_MESSAGES`, or whose new messages hold more than
    :data:`MAX_PARTS` content parts, before any of it is converted: the memory a history costs
    grows with both, whatever few bytes each takes in the body."""
    items = parsed.items
    count = len(items) + (parsed.previous.count if parsed.previous is not None else 0)
    if count > MAX_MESSAGES:
        msg = f"{what}: {count} messages; ctxkernel serve takes at most {MAX_MESSAGES} in one request"
        raise WireError(400, msg, param=what)
    parts = 0
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            parts += len(content)
    if parts > MAX_PARTS:
        msg = f"{what}: {parts} content parts; ctxkernel serve takes at most {MAX_PARTS} in the messages of one request"
        raise WireError(400, msg, param=what)


def check_tools(tools: list[Any], what: str = "tools") -> None:
    if len(tools) > MAX_TOOLS:
        msg = f"{what}: {len(tools)} tools; ctxkernel serve takes at most {MAX_TOOLS}"
        raise WireError(400, msg, param=what)


@dataclass
class Converted:
    """A client history as converted by :meth:`MessageMemo.convert_history`: how many items it
    had and their JSON array without its closing bracket, as a :class:`Digest` (to compare the
    next request with), the kernel messages and their hashes, the system texts found among the
    items."""

    count: int
    json: Digest | None
    messages: list[Message]
    hashes: list[str]
    system: list[str]
    #: whether an item was found ``marked`` (the caller's test: Anthropic's cache marks)
    marked: bool = False
    #: what the last item gave: how many kernel messages, whether a system text, and
    #: ``marked`` before it (None: not known), so that a body that rewrites its last item
    #: drops just that item's conversion (:meth:`without_last`)
    last_item: tuple[int, bool, bool] | None = None
    #: what the route that remembered this history tied to it (the Responses API: the response
    #: kept for the request whose history it is), set once that is known
    tag: str | None = None

    def without_last(self) -> Converted | None:
        """The conversion of every item but the last; None when what the last gave is not known."""
        if self.last_item is None or not self.count:
            return None
        messages, system, marked = self.last_item
        stop = len(self.messages) - messages
        return Converted(
            self.count - 1,
            None,
            self.messages[:stop],
            self.hashes[:stop],
            self.system[:-1] if system else list(self.system),
            marked,
        )

    def extend(
        self,
        items: Sequence[Any],
        first: int,
        one: Callable[[int, Any], tuple[Sequence[Message], Sequence[str], str | None]],
        marked: Callable[[Any], bool] | None,
    ) -> None:
        """Add the conversion of ``items``, the history's items from index ``first`` on."""
        for i, item in enumerate(items, first):
            before = self.marked
            messages, hashes, system = one(i, item)
            self.messages += messages
            self.hashes += hashes
            if system:
                self.system.append(system)
            self.marked = before or (marked is not None and marked(item))
            self.last_item = (len(messages), bool(system), before)


@dataclass
class ParsedBody:
    """A client body as :meth:`MessageMemo.parse` read it: ``body`` is the JSON object, whose
    ``array`` (``"messages"``; ``"input"`` for the Responses API) holds only ``items``, the
    messages still to convert; ``previous`` the
    conversion of the messages before them (None: ``items`` is the whole array)."""

    body: dict[str, Any]
    items: list[Any]
    previous: Converted | None = None
    raw: bytes = b""
    #: where the messages array's closing bracket is in ``raw`` (-1: not known), and whether
    #: that is proven (a guess is proven by the next body that continues this one)
    end: int = -1
    proven: bool = False
    fields: bytes = b""
    #: the SHA-256 of ``raw`` up to ``end``, when :meth:`MessageMemo.parse` has hashed it
    #: already (remembering the body then hashes no byte twice)
    head_sha256: Any = None
    #: where the last message's JSON starts in ``raw`` (-1: not known; proven with ``end``),
    #: and the SHA-256 of ``raw`` up to there when already hashed
    last_start: int = -1
    last_sha256: Any = None
    #: the remembered history this body continues (its record is replaced by this body's)
    continued: Converted | None = None
    #: the body's field that holds the history
    array: str = "messages"
    #: that no field of the body is written twice around its history (:attr:`_Chain.plain`);
    #: None when not known yet (the memo then reads its fields after the history to know)
    plain: bool | None = None


@dataclass(frozen=True, slots=True)
class Digest:
    """Bytes remembered without keeping them: their length, their last bytes and their SHA-256.

    The memo compares a client's next body with the last one through these, so that an open
    session does not hold its client's whole body. The last bytes turn away a body that differs
    near the end (another conversation behind the same system prompt) without hashing it; the
    digest proves the rest, so equal means equal bytes, whoever chose them."""

    size: int
    last: bytes
    sha256: bytes

    #: how many of the last bytes are kept to compare before hashing
    LAST = 64

    @classmethod
    def of(cls, data: bytes | memoryview) -> Digest:
        return cls.hashed(data, hashlib.sha256(data))

    @classmethod
    def hashed(cls, data: bytes | memoryview, sha: Any) -> Digest:
        """The digest of ``data``, whose SHA-256 object ``sha`` has hashed them already."""
        return cls(len(data), bytes(data[len(data) - min(len(data), cls.LAST) :]), sha.digest())

    def matches(self, data: bytes | memoryview) -> bool:
        """Whether ``data`` are the remembered bytes."""
        return self.hash_if_matches(data) is not None

    def hash_if_matches(self, data: bytes | memoryview) -> Any:
        """The SHA-256 object that hashed ``data`` (to hash what follows them with) when they
        are the remembered bytes; else None."""
        size = self.size
        if len(data) != size or data[size - len(self.last) :] != self.last:
            return None
        sha = hashlib.sha256(data)
        return sha if sha.digest() == self.sha256 else None


@dataclass
class _Chain:
    """A client body remembered as digests of its bytes before and after the end of its
    messages array, so that the next body, which appends messages to it, is parsed from the
    appended bytes only (:meth:`MessageMemo.parse`)."""

    head: Digest  # the body up to the messages array's closing bracket
    tail: Digest  # from that bracket on
    last: Digest | None  # the body up to its last message's first byte (None: not known)
    proven: bool  # that ``head`` and ``last`` end where they are said to
    fields: bytes  # the body with its history's field null, as JSON (fresh objects on every parse)
    history: Converted
    #: that ``fields`` are, in their order, the fields written before the history and then those
    #: after it (no field written twice): what :func:`_parsed_around` rebuilds a body from
    plain: bool = False

    @property
    def end(self) -> int:
        return self.head.size


#: the size of a memo key's digest (:meth:`MessageMemo.convert`)
_DIGEST_BYTES = hashlib.sha256().digest_size


class MessageMemo:
    """Wire messages already converted, keyed by their JSON: a client re-sends its whole history
    every time, and converting (and hashing) only the messages never seen before keeps a
    request's cost flat in the history's length (``bench_serve.py``).

    The key is the wire format's name and the SHA-256 digest of the message's JSON
    (``orjson.dumps`` of the parsed message; a JSON shorter than a digest is its own key, so the
    two kinds never meet): the memo keeps no copy of the bodies it has seen (a history or body
    it compares the next one with is kept as a :class:`Digest`). Only messages a
    request is the first to send are looked up here (a body that continues a remembered one is
    converted from its new items: :meth:`parse`), so the digest is paid once per message, not
    once per request. Kernel messages are immutable, so sessions may share an entry. Bounded by
    entries and by the bytes of the messages' JSON (least recently used goes first)."""

    def __init__(self, limit: int = 200_000, max_bytes: int = 256 << 20, histories: int = 256) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.held_bytes = 0
        #: key -> the messages, their hashes and the size of their JSON (what ``held_bytes`` sums)
        self._entries: OrderedDict[bytes, tuple[tuple[Message, ...], tuple[str, ...], int]] = OrderedDict()
        self.histories = histories
        self.held_items = 0  # items the remembered histories hold (bounded by ``limit`` too)
        self._histories: OrderedDict[bytes, Converted] = OrderedDict()
        self.held_chains = 0  # bodies remembered as digests (:meth:`parse`; bounded by ``histories``)
        self.held_chain_bytes = 0  # their other fields' JSON (bounded by ``max_bytes`` too)
        self._chains: OrderedDict[bytes, list[_Chain]] = OrderedDict()

    #: a remembered body is found by the API and its first bytes (fewer than a body grows by,
    #: so that a short body finds the one it continues); bodies that share them (one system
    #: prompt, many conversations) are told apart by their bytes, at most this many each (a
    #: body that is not continued is rejected by three byte compares and two compares of 64
    #: bytes, before any hash: :class:`Digest`)
    CHAIN_KEY_BYTES = 48
    CHAINS_PER_KEY = 64

    def parse(self, api: bytes, raw: bytes, array: str = "messages") -> ParsedBody:
        """The client's body as a JSON object (or a 400), parsed once, and as little of it as
        can be.

        A client re-sends its last body with messages appended: the same bytes up to its
        messages array's closing bracket ``]`` (at ``end``), then ``,`` and the new items, then
        the same bytes again. Claude Code also moves its rolling cache mark from the last
        message to the new last one, so its body is the last one up to where that message
        started, then the message rewritten and the new items, then the same bytes again. When
        the body has either shape against a remembered one whose cut points are proven, only
        ``[`` + the bytes between + ``]`` is parsed; the other fields come from the remembered
        body. That is exact: the bytes before the cut and after the end are the remembered
        body's, which was valid JSON with its messages array holding the items before the cut
        and closing at the end, and an array that parses on its own is a list of values, so the
        body parses as the remembered one with its items from the cut on replaced by these (no
        parse of the whole 0.6 MB at 100k tokens, no encoding of the history to compare it:
        ``bench_serve.py``). Anything else, or new bytes that do not parse as an array, is
        parsed whole, with the usual errors.

        A whole parse guesses its ``end`` (where the last message's JSON, as orjson writes it,
        is followed by ``]``) and where that message starts, proven at once when the body up to
        there is written as orjson writes it; otherwise the next body that has either shape
        against the guess is parsed whole too, and the guess is proven when its messages are
        exactly the remembered ones before the cut plus the new items (items added to any other
        array, or inside a string, would not add to the messages). A body parsed from its new
        bytes knows its own cut points: its end, and its last message's start when those bytes
        are the items as orjson writes them. A body that appends to a proven history while the
        bytes after it changed (Codex's metadata) is read by :func:`_parsed_after`."""
        for chain in self._chains.get(api + b"\0" + raw[: self.CHAIN_KEY_BYTES], ()):
            found = _continued(raw, chain)
            if found is None:
                sha = _head_continued(raw, chain)
                if sha is None:
                    continue
                return _parsed_after(raw, chain, sha, array)
            cut, stop, sha, previous = found
            try:
                items = _new_items(raw[cut:stop])
            except (ValueError, WireError):
                break  # not a continuation after all: the whole parse reports what is wrong
            if not isinstance(items, list) or not items:
                break
            if chain.proven:
                body = orjson.loads(chain.fields)
                body[array] = items
            else:
                # the body that proves the remembered one's cut points is parsed whole once a
                # session, while the session holds its history: with the lower peak
                body = load_json_object(raw, lean=True)
                messages = body.get(array)
                kept = previous.count
                if not (isinstance(messages, list) and len(messages) == kept + len(items) and messages[kept:] == items):
                    return _parsed_whole(body, raw, array, chain.history)
            last_start = _last_start(memoryview(raw), cut, stop, items)
            return _from_new_items(
                body, items, previous, raw, chain, (cut, sha), stop, last_start, array, chain.fields, chain.plain
            )
        return _parsed_whole(load_json_object(raw), raw, array)

    def convert_history(
        self,
        api: bytes,
        parsed: ParsedBody | list[Any],
        one: Callable[[int, Any], tuple[Sequence[Message], Sequence[str], str | None]],
        marked: Callable[[Any], bool] | None = None,
    ) -> Converted:
        """A client's whole history converted: ``one(i, item)`` gives an item's messages, their
        hashes and its system text (or None); ``marked(item)`` sets :attr:`Converted.marked`.

        A body :meth:`parse` found continuing a remembered one has the conversion of its first
        messages already: only the new items are converted. Otherwise the history is compared
        with the last one that began with the same two items, as JSON (below), and the
        conversion remembered for the next body."""
        if isinstance(parsed, list):
            parsed = ParsedBody({}, parsed)
        previous = parsed.previous
        if previous is None:
            # a body remembered as digests (:meth:`remember`) is compared through those: its
            # history is not remembered a second time as JSON
            out = self._convert_items(api, parsed.items, one, marked, keep=parsed.end < 0 or not parsed.raw)
        else:
            out = Converted(
                previous.count + len(parsed.items),
                None,
                list(previous.messages),
                list(previous.hashes),
                list(previous.system),
                previous.marked,
                previous.last_item,
            )
            out.extend(parsed.items, previous.count, one, marked)
        self.remember(api, parsed, out)
        return out

    def remember(self, api: bytes, parsed: ParsedBody, out: Converted) -> Converted | None:
        """Remember ``parsed``'s bytes, as digests, and ``out``, the conversion of its whole
        history, for the next body; it replaces the one it continued. Returns the history kept
        (the ``previous`` of a next body that continues this one), None when nothing is."""
        if parsed.end < 0 or not parsed.raw:
            return None
        key = api + b"\0" + parsed.raw[: self.CHAIN_KEY_BYTES]
        try:
            fields = parsed.fields or dumps_kept({**parsed.body, parsed.array: None})
        except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
            return None
        history = Converted(out.count, None, out.messages, out.hashes, out.system, out.marked, out.last_item)
        view = memoryview(parsed.raw)
        last_start, head_sha, last_sha = parsed.last_start, parsed.head_sha256, parsed.last_sha256
        if head_sha is None:  # one pass over the bytes for both digests
            head_sha = hashlib.sha256(view[: max(last_start, 0)])
            last_sha = head_sha.copy() if last_start > 0 else None
            head_sha.update(view[max(last_start, 0) : parsed.end])
        last = Digest.hashed(view[:last_start], last_sha) if last_start > 0 and last_sha is not None else None
        head = Digest.hashed(view[: parsed.end], head_sha)
        # only the Responses route reads it; known already for a body parsed from its new items
        plain = parsed.array == "input" and (parsed.plain if parsed.plain is not None else _plain_fields(parsed))
        chain = _Chain(head, Digest.of(view[parsed.end :]), last, parsed.proven, fields, history, plain)
        kept = [chain]
        for old in self._chains.pop(key, []):
            if old.history is parsed.continued or (old.head, old.tail) == (chain.head, chain.tail):
                self._forget(old)  # continued by this body, or this body again
            else:
                kept.append(old)
        self._chains[key] = kept
        self.held_chains += 1
        self.held_chain_bytes += len(chain.fields)
        while len(kept) > self.CHAINS_PER_KEY:
            self._forget(kept.pop())
        while self._chains and (self.held_chains > self.histories or self.held_chain_bytes > self.max_bytes):
            oldest = next(iter(self._chains))
            self._forget(self._chains[oldest].pop())
            if not self._chains[oldest]:
                del self._chains[oldest]
        return history

    def _forget(self, chain: _Chain) -> None:
        self.held_chains -= 1
        self.held_chain_bytes -= len(chain.fields)

    def _convert_items(
        self,
        api: bytes,
        items: list[Any],
        one: Callable[[int, Any], tuple[Sequence[Message], Sequence[str], str | None]],
        marked: Callable[[Any], bool] | None,
        *,
        keep: bool = True,
    ) -> Converted:
        """The whole array converted, reusing the conversion of the last history that began
        with the same two items (found by their JSON's SHA-256) when its JSON starts this
        one's; remembered for the next one when ``keep``.

        That history's JSON is compared with this one's (its :class:`Digest`: one SHA-256 of
        as many bytes of this one); when it is a prefix ending at an item boundary, its
        conversion is reused and only the new items are converted. Equal JSON means equal items,
        so two clients whose histories begin alike cannot get each other's messages.

        The history is remembered as a digest of its JSON, not as the parsed items: it holds no
        references, so the collector never walks it, while keeping thousands of parsed dicts
        alive from one request to the next made them survive into the oldest generation and
        set off a full collection every few requests (``bench_serve.py``: about a third of a
        request's CPU at 100k tokens)."""
        try:
            dumped = orjson.dumps(items)
            key = api + b"\0" + hashlib.sha256(orjson.dumps(items[:2])).digest()
        except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
            dumped = key = b""
        out = Converted(len(items), None, [], [], [])
        start = 0
        previous = self._histories.get(key) if key else None
        if previous is not None and previous.count and previous.json and _continues(dumped, previous.json):
            start = previous.count
            out.messages += previous.messages
            out.hashes += previous.hashes
            out.system += previous.system
            out.marked = previous.marked
            out.last_item = previous.last_item
        out.extend(items[start:], start, one, marked)
        if key and keep:
            out.json = Digest.of(memoryview(dumped)[:-1])  # the array up to its closing bracket
            old = self._histories.pop(key, None)
            if old is not None:
                self.held_items -= old.count
            self.held_items += out.count
            self._histories[key] = out
            while self._histories and (len(self._histories) > self.histories or self.held_items > self.limit):
                _, dropped = self._histories.popitem(last=False)
                self.held_items -= dropped.count
        return out

    def convert(
        self,
        raw: Any,
        convert: Callable[[Any], list[Message]],
        hasher: Callable[[Message], str],
        *,
        api: bytes = b"",
        where: str = "",
        level: int = 3,
    ) -> tuple[tuple[Message, ...], tuple[str, ...]]:
        """``convert(raw)`` and the hash of each result, from the memo when it has them.

        ``api`` names the wire format: the same JSON may read differently in another one.
        ``raw`` sits ``level`` levels deep in its body, ``where`` (what an error names): an
        ``EventError`` refuses it, or a tool call's arguments it holds, nested deeper than
        :data:`MAX_DEPTH`. Only JSON holding enough brackets to nest that deep is encoded
        again to tell (the arguments are a string of JSON in some wire formats)."""
        try:
            dumped = orjson.dumps(raw)
        except TypeError as exc:
            if too_deep(exc):
                raise EventError(depth_refusal(where)) from None
            # not JSON-encodable as parsed (cannot happen for a parsed body): convert uncached
            messages = tuple(convert(raw))
            return messages, tuple(hasher(m) for m in messages)
        key = api + b"\0" + (dumped if len(dumped) < _DIGEST_BYTES else hashlib.sha256(dumped).digest())
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry[0], entry[1]
        deep = dumped.count(b"[") + dumped.count(b"{") > MAX_DEPTH // 2
        if deep and not fits(raw, level):
            raise EventError(depth_refusal(where))
        messages = tuple(convert(raw))
        for message in messages if deep else ():
            # what a message holds of ``raw`` is no deeper in a log record than in the body but
            # a tool call's arguments
            for call in message.tool_calls:
                if not fits(call.arguments, 6):  # record, data, message, content, block, arguments
                    raise EventError(depth_refusal(where))
        hashes = tuple(hasher(m) for m in messages)
        self._entries[key] = (messages, hashes, len(dumped))
        self.held_bytes += len(dumped)
        while self._entries and (len(self._entries) > self.limit or self.held_bytes > self.max_bytes):
            _, (_, _, size) = self._entries.popitem(last=False)
            self.held_bytes -= size
        return messages, hashes


def _parsed_after(raw: bytes, chain: _Chain, sha: Any, array: str) -> ParsedBody:
    """A body that keeps the remembered one's bytes up to its proven end, then appends items,
    while what follows them changed (Codex CLI writes a map of metadata in a new order every
    time): parsed whole, and only the items after the remembered ones converted. Exact: up to
    the end the bytes are the remembered body's, whose history's items all came before it, so
    the whole parse's first items are those. The new end is known when the appended bytes are
    the new items as orjson writes them (as :meth:`MessageMemo.parse` finds a last message's
    start), and guessed otherwise."""
    around = _parsed_around(raw, chain, sha, array)
    if isinstance(around, ParsedBody):
        return around
    body = load_json_object(raw)
    every = body.get(array)
    count = chain.history.count
    if around is _TWICE or not isinstance(every, list) or len(every) <= count:
        return _parsed_whole(body, raw, array, chain.history)
    items = every[count:]
    view = memoryview(raw)
    cut = chain.end + 1
    span = _items_span(view, cut, items, len(raw))
    if span is None or raw[span[0] : span[0] + 1] != b"]":
        # the new items are not where orjson puts them, so nothing shows that the array parsed
        # is the one the remembered bytes open (a second history field after it would be the
        # one JSON reads): converted whole, as a body that continues nothing
        return _parsed_whole(body, raw, array, chain.history)
    stop, last_start = span
    if _fields_after(raw, stop, array) is _TWICE:  # the array parsed is a second one after them
        return _parsed_whole(body, raw, array, chain.history)
    body[array] = items  # as a body parsed from its new bytes holds them: the rest is converted
    return _from_new_items(body, items, chain.history, raw, chain, (chain.end, sha), stop, last_start, array)


def _new_items(piece: bytes) -> Any:
    """The new items, ``piece`` being their bytes between a history's items and its end: parsed
    as deep as they sit in a body (an array in an object), so that a nesting the whole parse
    refuses is refused here too; None when the piece closes the array early (``a],[b`` gives the
    outer array two values)."""
    parsed = parse_json(b"[[" + piece + b"]]")
    return parsed[0] if isinstance(parsed, list) and len(parsed) == 1 else None


def _plain_fields(parsed: ParsedBody) -> bool:
    """Whether the body's fields after its history, parsed on their own, are the fields its
    parse holds after the history, in order: no field of the body was written twice."""
    after = _fields_after(parsed.raw, parsed.end, parsed.array)
    if not isinstance(after, dict):
        return False
    names = list(parsed.body)
    return names.index(parsed.array) == len(names) - len(after) - 1 and list(after) == names[len(names) - len(after) :]


def _fields_after(raw: bytes, stop: int, array: str) -> dict[str, Any] | object | None:
    """The fields after a history that ends at ``stop`` in ``raw``, parsed on their own; None
    when they are no JSON object's rest (a trailing comma included), :data:`_TWICE` when they
    hold the history's field again."""
    rest = raw[stop + 1 :]
    if rest == b"}":
        return {}
    if rest[:1] != b",":
        return None
    try:
        after = parse_json(b"{" + rest[1:])
    except (ValueError, WireError):
        return None
    if not isinstance(after, dict) or not after:  # ",}" is no JSON
        return None
    return _TWICE if array in after else after


#: what :func:`_parsed_around` answers for a body whose history field comes twice
_TWICE = object()
#: where :func:`_parsed_around` looks for the end of the new items, at most
_STOPS = 8


def _stops(raw: bytes, chain: _Chain, after: str | None) -> Iterator[int]:
    """Where the new items may end in ``raw``: where the remembered body's fields after its
    history would begin if they kept their length, then (newest first) each ``]`` followed by
    the first of those fields' names (``after``), as orjson writes a key."""
    end, tried = chain.end, -1
    same = len(raw) - chain.tail.size
    if end + 1 < same < len(raw) - 1 and raw[same] == ord("]"):
        tried = same
        yield same
    if after is None:
        return
    marker = b"]," + orjson.dumps(after) + b":"
    at = len(raw)
    for _ in range(_STOPS):
        at = raw.rfind(marker, end + 1, at)
        if at < 0:
            return
        if at != tried:
            yield at


def _parsed_around(raw: bytes, chain: _Chain, sha: Any, array: str) -> ParsedBody | object | None:
    """:func:`_parsed_after` without the whole parse, when the new items' end is found
    (:func:`_stops`: what follows them is as long as before, a map written in another order, or
    begins with the same field as before): ``[`` + the bytes from the remembered end to there +
    ``]`` parsed as the new items, and ``{`` + the rest as the fields after them; None when no
    place gives two pieces that parse, :data:`_TWICE` when the fields after hold the history's
    field again (JSON reads the last one). Exact: the bytes up to the proven end leave the parse
    inside the history between two items, and a ``]`` anywhere else would leave one of the two
    pieces unbalanced, inside a value, or followed by more than one value."""
    if not chain.plain:  # a field written twice: only the whole parse reads it as JSON does
        return None
    end = chain.end
    fields = orjson.loads(chain.fields)
    names = list(fields)
    at = names.index(array) if array in names else len(names)
    for stop in _stops(raw, chain, names[at + 1] if at + 1 < len(names) else None):
        after = _fields_after(raw, stop, array)
        if after is None:
            continue
        try:
            items = _new_items(raw[end + 1 : stop])
        except (ValueError, WireError):
            continue
        if not isinstance(items, list) or not items:
            continue
        if after is _TWICE:
            return _TWICE
        assert isinstance(after, dict)
        before = _fields_before(fields, array)
        body = {**before, array: items, **after}
        last_start = _last_start(memoryview(raw), end + 1, stop, items)
        plain = before.keys().isdisjoint(after)  # the remembered fields are plain (above)
        return _from_new_items(body, items, chain.history, raw, chain, (end, sha), stop, last_start, array, plain=plain)
    return None


def _from_new_items(
    body: dict[str, Any],
    items: list[Any],
    previous: Converted,
    raw: bytes,
    chain: _Chain,
    hashed: tuple[int, Any],
    stop: int,
    last_start: int,
    array: str,
    fields: bytes = b"",
    plain: bool | None = None,
) -> ParsedBody:
    """A body parsed from its new ``items``, which end its history at ``stop`` (proven), the
    last of them starting at ``last_start`` (-1: not known): ``hashed`` is where the SHA-256
    object beside it has hashed ``raw`` up to, and it goes on to both cut points (the digests
    :meth:`MessageMemo.remember` keeps). ``fields``: the body's other fields as JSON when they
    are the remembered body's."""
    at, sha = hashed
    view, last_sha = memoryview(raw), None
    if last_start > 0:
        sha.update(view[at:last_start])
        at, last_sha = last_start, sha.copy()
    sha.update(view[at:stop])
    return ParsedBody(
        body,
        items,
        previous,
        raw,
        stop,
        True,
        fields,
        head_sha256=sha,
        last_start=last_start,
        last_sha256=last_sha,
        continued=chain.history,
        array=array,
        plain=plain,
    )


def parsed_whole(raw: bytes, array: str = "messages", continued: Converted | None = None) -> ParsedBody:
    """``raw`` parsed whole (a 400 when it is no JSON object), as :meth:`MessageMemo.parse` does
    when the body continues no remembered one; ``continued``: the remembered history whose
    record this body's replaces (:meth:`MessageMemo.remember`)."""
    return _parsed_whole(load_json_object(raw), raw, array, continued)


def _parsed_whole(
    body: dict[str, Any], raw: bytes, array: str = "messages", continued: Converted | None = None
) -> ParsedBody:
    """A body parsed whole, with a guess of where its history closes and where its last item
    starts (:func:`_guessed_end`), proven at once when the body is written as orjson writes it.
    ``continued``: the remembered history of a body that starts with its bytes but is converted
    whole all the same; this body's record replaces it, as a continuation's does."""
    items = body.get(array)
    if not isinstance(items, list) or not items:
        return ParsedBody(body, items if isinstance(items, list) else [], raw=raw, array=array, continued=continued)
    end, last_start = _guessed_end(raw, items)
    proven = end >= 0 and _written_as_orjson(body, raw, array, items, end)
    return ParsedBody(body, items, None, raw, end, proven, last_start=last_start, continued=continued, array=array)


def _guessed_end(raw: bytes, items: list[Any]) -> tuple[int, int]:
    """Where the history ``items`` closes in ``raw`` (after the last item's JSON as orjson writes
    it, and any blanks, when that is where ``]`` is) and where that item starts (after a ``,`` or
    the ``[``); -1 for what is not found."""
    try:
        last = orjson.dumps(items[-1])
    except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
        return -1, -1
    start = raw.rfind(last)
    if start < 0:
        return -1, -1
    end = start + len(last)
    del last  # orjson's buffer, at least 4 KiB and several times a large message: one at a time
    while end < len(raw) and raw[end] in b" \t\r\n":
        end += 1
    if end >= len(raw) or raw[end] != ord("]"):
        return -1, -1
    before = start - 1
    while before >= 0 and raw[before] in b" \t\r\n":  # not raw[:start].rstrip(): a copy of the body
        before -= 1
    opens = before >= 0 and raw[before] == (ord(",") if len(items) > 1 else ord("["))
    return end, start if opens else -1


def _fields_before(body: dict[str, Any], array: str) -> dict[str, Any]:
    """The fields of ``body`` before its history field ``array`` (a parsed body keeps its keys in
    their order in the JSON)."""
    before: dict[str, Any] = {}
    for key, value in body.items():
        if key == array:
            break
        before[key] = value
    return before


def _written_as_orjson(body: dict[str, Any], raw: bytes, array: str, items: list[Any], end: int) -> bool:
    """Whether ``raw`` up to ``end`` is the body's fields before its history, then the history's
    items, as orjson writes them (Codex CLI and Claude Code write compact JSON): then ``end``,
    and every item's place, are where the history's items are, proven without the next body.
    A body parses to a dict in its keys' order, so those fields are the dict's first ones."""
    before = _fields_before(body, array)
    try:
        opening = (orjson.dumps(before)[:-1] + b"," if before else b"{") + orjson.dumps(array) + b":["
    except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
        return False
    if not raw.startswith(opening):
        return False
    span = _items_span(memoryview(raw), len(opening), items, end)
    return span is not None and span[0] == end


def _continued(raw: bytes, chain: _Chain) -> tuple[int, int, Any, Converted] | None:
    """How ``raw`` continues the remembered body, if it does: (``cut``, ``stop``, the SHA-256
    object that hashed ``raw[:cut]``, the conversion of the items before ``cut``), where the
    bytes from ``cut`` to ``stop`` (the messages' new ``]``) are new items and the rest is the
    remembered body's. Either items were appended after its last message (``cut`` after the
    ``,`` that replaced its ``]``), or its last message was rewritten too (``cut`` where that
    message started, when that keeps at least half the body). None otherwise."""
    stop = len(raw) - chain.tail.size  # where raw's closing bracket would be
    if stop < 1 or raw[stop] != ord("]"):
        return None
    view = memoryview(raw)
    if not chain.tail.matches(view[stop:]):
        return None
    end = chain.end
    if 0 < end < stop - 1 and raw[end] == ord(","):
        sha = chain.head.hash_if_matches(view[:end])
        if sha is not None:
            sha.update(view[end : end + 1])
            return end + 1, stop, sha, chain.history
    last = chain.last
    # a rewritten last message must leave most of the body as it was: a cut near the start (the
    # last body held one message, or another conversation shares its first ones) saves no parse
    if last is None or not stop // 2 <= last.size < stop:
        return None
    sha = last.hash_if_matches(view[: last.size])
    previous = chain.history.without_last() if sha is not None else None
    return None if previous is None else (last.size, stop, sha, previous)


def _items_span(raw: memoryview, cut: int, items: list[Any], limit: int) -> tuple[int, int] | None:
    """Where ``items`` end in ``raw`` and where the last of them starts, when the bytes from
    ``cut`` (at most to ``limit``) are the items as orjson writes them, joined by commas (so every
    item's place is known); else None. One item's JSON is held at a time: each ``orjson.dumps``
    holds a buffer of at least 4 KiB (``jsonbytes.py``), 40 MB for 10,000 short items."""
    at, start = cut, -1
    for item in items:
        try:
            encoded = orjson.dumps(item)
        except TypeError:  # not JSON-encodable as parsed (cannot happen for a parsed body)
            return None
        if at != cut:
            if at >= limit or raw[at] != ord(","):
                return None
            at += 1
        if at + len(encoded) > limit or raw[at : at + len(encoded)] != encoded:
            return None
        start, at = at, at + len(encoded)
    return (at, start) if start >= 0 else None


def _last_start(raw: memoryview, cut: int, stop: int, items: list[Any]) -> int:
    """Where the last of ``items`` starts in ``raw``, which holds them from ``cut`` to ``stop``,
    when those bytes are the items as orjson writes them, joined by commas; else -1."""
    span = _items_span(raw, cut, items, stop)
    return span[1] if span is not None and span[0] == stop else -1


def _head_continued(raw: bytes, chain: _Chain) -> Any:
    """The SHA-256 object that hashed ``raw`` up to the remembered body's proven end, when
    ``raw`` is that body up to there and a ``,`` follows (items appended, whatever comes after
    them: a client whose other fields change from one request to the next); else None."""
    end = chain.end
    if not chain.proven or not 0 < end < len(raw) - 1 or raw[end] != ord(","):
        return None
    return chain.head.hash_if_matches(memoryview(raw)[:end])


def _continues(array: bytes, prefix: Digest) -> bool:
    """Whether the JSON array ``array`` starts with every item of the JSON array whose bytes up
    to its closing bracket ``prefix`` remembers (both as ``orjson.dumps`` wrote them): those
    bytes start it and the next byte ends an item. A JSON value cannot be continued past its
    end, so the first items are then equal."""
    end = prefix.size  # the position of the remembered array's closing bracket
    return len(array) > end and array[end] in b",]" and prefix.matches(memoryview(array)[:end])


# -- usage -------------------------------------------------------------------------------------------
#: how deep a provider's usage object may nest (real ones nest two levels: ``usage`` and its
#: ``prompt_tokens_details``); what nests deeper is left out of the sum, with a warning
MAX_USAGE_DEPTH = 4


def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    """The sum of two provider usage objects, key by key (nested counts too). What ``usage``
    nests deeper than :data:`MAX_USAGE_DEPTH` is left out and logged (usage is a provider's:
    read 1,024 levels deep, it would exhaust the recursion here and fail where it is written)."""
    if not isinstance(usage, dict):
        return total
    dropped: list[str] = []
    out = _add_usage(total, usage, 1, "usage", dropped)
    if dropped:
        log.warning(
            "serve: upstream usage nested too deeply; left out",
            fields=[f[:100] for f in dropped[:5]],
            max_depth=MAX_USAGE_DEPTH,
        )
    return out


def _add_usage(
    total: dict[str, Any] | None, usage: dict[str, Any], depth: int, path: str, dropped: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = dict(total or {})
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            previous = out.get(key)
            out[key] = (previous if isinstance(previous, int) and not isinstance(previous, bool) else 0) + value
        elif isinstance(value, (dict, list)) and not _shallow(value, MAX_USAGE_DEPTH - depth):
            dropped.append(f"{path}.{key}")
        elif isinstance(value, dict):
            previous = out.get(key)
            out[key] = _add_usage(
                previous if isinstance(previous, dict) else None, value, depth + 1, f"{path}.{key}", dropped
            )
        elif key not in out:
            out[key] = value
    return out


def _shallow(value: Any, levels: int) -> bool:
    """Whether ``value`` nests at most ``levels`` objects or arrays (the walk stops there)."""
    if not isinstance(value, (dict, list)):
        return True
    if levels <= 0:
        return False
    return all(_shallow(v, levels - 1) for v in (value.values() if isinstance(value, dict) else value))


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


class Forms(list[Any]):
    """:func:`wire_forms`' answer: the forms in surface order, and with a ``measure`` the sum of
    their measures (``size``; 0 without one)."""

    size: int = 0


def wire_forms(
    seqs: list[int],
    messages: list[Message],
    cache: dict[Any, Any],
    convert: Callable[[Message], Any],
    measure: Callable[[Any], int] | None = None,
) -> Forms:
    """Each surface message in its wire form, converted once per node: ``cache`` (per session)
    maps a node's seq to the message object it was converted from and the result, so a request
    costs the new nodes only; entries for nodes that left the surface are dropped.

    The last call's nodes are kept too (under ``"last"``): when this request's surface starts
    with them, the same seqs holding the same message objects (compared in C), their forms are
    taken as a whole and only the nodes after them are looked at one by one. With a ``measure``
    (``len`` of the JSON bytes), ``size`` is the forms' total, kept with them the same way: the
    kept nodes' total plus the new nodes' measures."""
    forms = Forms()
    done = 0
    size = 0
    last = cache.get("last")
    if last is not None:
        old_seqs, old_messages, old_forms, old_size = last
        done = len(old_seqs)
        if done <= len(seqs) and seqs[:done] == old_seqs and all(map(operator.is_, messages[:done], old_messages)):
            forms = Forms(old_forms)
            if measure is not None:
                # kept by a call with no measure (or another one): measured afresh
                size = old_size[1] if old_size is not None and old_size[0] is measure else sum(map(measure, old_forms))
        else:
            done = 0
    for i in range(done, len(seqs)):
        seq, message = seqs[i], messages[i]
        hit = cache.get(seq)
        if hit is None or hit[0] is not message:
            hit = (message, convert(message))
            cache[seq] = hit
        forms.append(hit[1])
        if measure is not None:
            size += measure(hit[1])
    forms.size = size
    cache["last"] = (list(seqs), list(messages), list(forms), None if measure is None else (measure, size))
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
