"""Provider-neutral messages and their content blocks.

A :class:`Message` has a role, a list of blocks and a :class:`Source` saying who wrote it. The
kernel stores messages inside events as plain dicts (``to_dict``/``from_dict``) and converts them
to and from the two dominant wire formats in :mod:`ctxkernel.convert`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .errors import EventError

Role = Literal["user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("user", "assistant", "tool")
SOURCE_KINDS: tuple[str, ...] = ("user", "model", "tool", "plugin")


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    text: str
    signature: str | None = None
    type: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True, slots=True)
class ToolCallBlock:
    id: str
    name: str
    arguments: dict[str, Any]
    type: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True, slots=True)
class MediaBlock:
    """An image, a document, a file or audio a client sent, kept as it came.

    The bytes live in the store's blob table under ``blob`` (content-addressed, so one image
    sent in a hundred requests is stored once); ``wire`` is the client's block in its wire
    format ``api`` (``anthropic``, ``openai`` or ``responses``) with the bytes taken out, so it
    is sent upstream as it came, bytes put back. ``tokens`` is its cost counted at intake with
    the provider's rules (the meter adds it; its size in text is not what it costs). ``data``
    holds the bytes in memory until they are stored; it is never written to the log."""

    kind: str
    api: str
    wire: dict[str, Any]
    tokens: int
    blob: str | None = None
    media_type: str | None = None
    data: bytes | None = field(default=None, compare=False, repr=False)
    type: Literal["media"] = "media"


@dataclass(frozen=True, slots=True)
class OpaqueBlock:
    """A provider's content the kernel does not read, kept as it came and sent back only to the
    same wire format ``api``: a ``redacted_thinking`` block, a server tool's call and result
    (``server_tool_use`` + ``web_search_tool_result``: a pair the provider ran, needing no
    client result), a Responses reasoning item with its encrypted content, or (``whole``) a
    whole message such as Anthropic's mid-conversation ``{"role": "system"}``. It counts as its
    JSON text (an upper bound of what it costs)."""

    api: str
    data: dict[str, Any]
    whole: bool = False
    type: Literal["opaque"] = "opaque"


#: a block a tool result's content array may hold (:attr:`ToolResultBlock.parts`)
Part = TextBlock | MediaBlock | OpaqueBlock


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """A tool's result. ``content`` is its text (what strategies read, excerpt and replace);
    ``parts``, when the tool answered with an array (text and images), keeps that array in
    order. The parts are sent upstream only while their text still says what ``content`` says
    (:meth:`kept_parts`): a strategy that rewrites ``content`` builds a new block, and a stale
    array never goes out."""

    call_id: str
    content: str
    is_error: bool = False
    name: str | None = None
    parts: tuple[Part, ...] | None = None
    type: Literal["tool_result"] = "tool_result"

    def kept_parts(self) -> tuple[Part, ...] | None:
        """``parts`` when their text joined by newlines is ``content``, else None."""
        parts = self.parts
        if not parts:
            return None
        if "\n".join(p.text for p in parts if isinstance(p, TextBlock)) != self.content:
            return None
        return parts


Block = TextBlock | ReasoningBlock | ToolCallBlock | ToolResultBlock | MediaBlock | OpaqueBlock
#: the blocks a user message may hold (a tool result goes in a tool message)
USER_BLOCKS = frozenset({"text", "media", "opaque"})


@dataclass(frozen=True, slots=True)
class Source:
    """Who wrote a message: ``user``, ``model`` (provider, model), ``tool`` (call id) or
    ``plugin`` (plugin name and a form such as instructions, snapshot, notice, recall)."""

    kind: str
    provider: str | None = None
    model: str | None = None
    call_id: str | None = None
    plugin: str | None = None
    form: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k in _SOURCE_FIELDS if (v := getattr(self, k)) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Source:
        if not isinstance(data, dict) or data.get("kind") not in SOURCE_KINDS:
            msg = f"message source must be an object with kind in {list(SOURCE_KINDS)}, got {data!r}"
            raise EventError(msg)
        if not _SOURCE_KEYS.issuperset(data):
            unknown = set(data) - _SOURCE_KEYS
            msg = f"message source has unknown keys {sorted(unknown)}; accepted: {list(_SOURCE_FIELDS)}"
            raise EventError(msg)
        wrong = sorted(k for k, v in data.items() if not (v is None or isinstance(v, str)))  # kind: checked above
        if wrong:
            msg = f"message source fields {wrong} must be strings, got {[type(data[k]).__name__ for k in wrong]}"
            raise EventError(msg)
        if "call_id" in data:
            return cls(**data)
        # replay builds one per message; user and model sources repeat, and a Source is immutable
        key = (data.get("kind"), data.get("provider"), data.get("model"), data.get("plugin"), data.get("form"))
        cached = _SOURCE_CACHE.get(key)
        if cached is None:
            cached = cls(**data)
            if len(_SOURCE_CACHE) >= 1024:
                _SOURCE_CACHE.clear()
            _SOURCE_CACHE[key] = cached
        return cached

    @classmethod
    def plugin_form(cls, plugin: str, form: str) -> Source:
        return cls(kind="plugin", plugin=plugin, form=form)


_SOURCE_FIELDS = ("kind", "provider", "model", "call_id", "plugin", "form")
_SOURCE_KEYS = frozenset(_SOURCE_FIELDS)
_SOURCE_CACHE: dict[tuple[Any, ...], Source] = {}
USER = Source(kind="user")
#: the dict form of each source that many messages share (every source but a tool result's, which
#: names its call): one dict for all of them instead of one per message. Every message event's
#: data holds one, and a session holds its events (read-only, as all event data is).
_SOURCE_DICTS: dict[Source, dict[str, Any]] = {}


def _source_dict(source: Source) -> dict[str, Any]:
    if source.call_id is not None:
        return source.to_dict()
    shared = _SOURCE_DICTS.get(source)
    if shared is None:
        if len(_SOURCE_DICTS) >= 1024:  # bounded: plugin names and model names come from outside
            _SOURCE_DICTS.clear()
        shared = _SOURCE_DICTS[source] = source.to_dict()
    return shared


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: tuple[Block, ...]
    source: Source = field(default=USER)
    #: the participant's name a client gave the message (OpenAI's ``name``), sent back as it came
    name: str | None = None

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def user(cls, text: str, source: Source = USER) -> Message:
        return cls("user", (TextBlock(text),), source)

    @classmethod
    def assistant(
        cls,
        text: str = "",
        tool_calls: list[ToolCallBlock] | tuple[ToolCallBlock, ...] = (),
        *,
        reasoning: str | None = None,
        source: Source | None = None,
    ) -> Message:
        blocks: list[Block] = []
        if reasoning:
            blocks.append(ReasoningBlock(reasoning))
        if text:
            blocks.append(TextBlock(text))
        blocks.extend(tool_calls)
        return cls("assistant", tuple(blocks), source or Source(kind="model"))

    @classmethod
    def tool(cls, call_id: str, content: str, *, is_error: bool = False, name: str | None = None) -> Message:
        return cls(
            "tool",
            (ToolResultBlock(call_id, content, is_error, name),),
            Source(kind="tool", call_id=call_id),
        )

    # -- views --------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The concatenated text blocks (tool results contribute their content)."""
        content = self.content
        if len(content) == 1 and content[0].type == "text":  # the usual message: no list, no join
            return content[0].text
        parts = []
        for b in self.content:
            if b.type == "text":
                parts.append(b.text)
            elif b.type == "tool_result":
                parts.append(b.content)
        return "\n".join(parts)

    @property
    def tool_calls(self) -> list[ToolCallBlock]:
        return [b for b in self.content if b.type == "tool_call"]

    @property
    def tool_result(self) -> ToolResultBlock | None:
        for b in self.content:
            if b.type == "tool_result":
                return b
        return None

    def with_content(self, content: tuple[Block, ...] | list[Block]) -> Message:
        return replace(self, content=tuple(content))

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "content": [_block_to_dict(b) for b in self.content],
            "source": _source_dict(self.source),
        }
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Message:
        if not isinstance(data, dict):
            msg = f"a message must be an object, got {type(data).__name__}"
            raise EventError(msg)
        role = data.get("role")
        if role not in ROLES:
            msg = f"message role must be one of {list(ROLES)}, got {role!r}"
            raise EventError(msg)
        content = data.get("content")
        if not isinstance(content, list):
            msg = f"message content must be a list of blocks, got {type(content).__name__}"
            raise EventError(msg)
        blocks = tuple([_block_from_dict(b) for b in content])
        if role == "tool":
            if len(blocks) != 1 or blocks[0].type != "tool_result":
                msg = "a tool message holds exactly one tool_result block"
                raise EventError(msg)
        else:
            # one pass over the blocks (replay parses every message: keep this loop cheap)
            for b in blocks:
                if b.type == "tool_result":
                    msg = f"a {role} message cannot hold a tool_result block; use a tool message"
                    raise EventError(msg)
                if role == "user" and b.type not in USER_BLOCKS:
                    msg = f"a user message holds only {sorted(USER_BLOCKS)} blocks, got {b.type!r}"
                    raise EventError(msg)
        source = data.get("source")
        name = data.get("name")
        if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS):
            msg = f"message name must be a string of 1-{MAX_NAME_CHARS} characters, got {name!r:.80}"
            raise EventError(msg)
        return cls(role, blocks, USER if source is None else Source.from_dict(source), name)


#: the longest participant name a message keeps (OpenAI allows 64; bounded, it is written to the log),
#: and the longest tool name a new reply may call
MAX_NAME_CHARS = 256
#: the longest tool-call id a new reply may carry (providers' are 20-40 characters; each is written
#: to the log and sent back with every later request); the agent loop, serve and the framework
#: adapters rename a longer one (:class:`ctxkernel.pairing.CallIds`)
MAX_CALL_ID_CHARS = 256


def check_new_calls(message: Message, *, ids: bool = True) -> None:
    """An :class:`EventError` naming the first tool call of a new reply whose id (unless not
    ``ids``: a caller that renames them) or name is not a string of 1-256 characters. Checked
    where a reply is committed, not where a log is read: a log written before the bound opens."""
    for i, call in enumerate(message.tool_calls):
        checks = (("id", call.id, MAX_CALL_ID_CHARS),) if ids else ()
        for what, value, bound in (*checks, ("name", call.name, MAX_NAME_CHARS)):
            if not (isinstance(value, str) and 0 < len(value) <= bound):
                got = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
                msg = f"tool call {i}: {what} must be a string of 1-{bound} characters, got {got}"
                raise EventError(msg)


#: media kinds a :class:`MediaBlock` names
MEDIA_KINDS = frozenset({"image", "document", "file", "audio"})
#: the wire formats a media or opaque block may come from
WIRE_APIS = frozenset({"anthropic", "openai", "responses"})


_BLOCK_FIELDS: dict[str, tuple[type, dict[str, tuple[type, ...]], tuple[str, ...]]] = {
    "text": (TextBlock, {"text": (str,)}, ("text",)),
    "reasoning": (ReasoningBlock, {"text": (str,), "signature": (str, type(None))}, ("text",)),
    "tool_call": (ToolCallBlock, {"id": (str,), "name": (str,), "arguments": (dict,)}, ("id", "name", "arguments")),
    "tool_result": (
        ToolResultBlock,
        {
            "call_id": (str,),
            "content": (str,),
            "is_error": (bool,),
            "name": (str, type(None)),
            "parts": (list, type(None)),
        },
        ("call_id", "content"),
    ),
    "media": (
        MediaBlock,
        {
            "kind": (str,),
            "api": (str,),
            "wire": (dict,),
            "tokens": (int,),
            "blob": (str, type(None)),
            "media_type": (str, type(None)),
        },
        ("kind", "api", "wire", "tokens"),
    ),
    "opaque": (OpaqueBlock, {"api": (str,), "data": (dict,), "whole": (bool,)}, ("api", "data")),
}
#: the blocks a tool result's ``parts`` may hold
PART_BLOCKS = frozenset({"text", "media", "opaque"})


def _block_to_dict(block: Block) -> dict[str, Any]:
    out: dict[str, Any] = {"type": block.type}
    for name in _BLOCK_FIELDS[block.type][1]:
        value = getattr(block, name)
        if value is not None and value is not False:
            out[name] = [_block_to_dict(p) for p in value] if name == "parts" else value
    return out


def _check_block(block: Block) -> Block:
    """What the field types cannot say: media and opaque values in range, parts of the right kinds."""
    if isinstance(block, MediaBlock):
        if block.kind not in MEDIA_KINDS or block.api not in WIRE_APIS:
            msg = f"media block: kind must be one of {sorted(MEDIA_KINDS)} and api one of {sorted(WIRE_APIS)}"
            raise EventError(msg)
        if block.tokens < 0 or isinstance(block.tokens, bool):
            msg = f"media block: tokens must be a non-negative integer, got {block.tokens!r}"
            raise EventError(msg)
        if block.blob is not None:
            from .store.base import check_blob_key  # the store's rule; imported late (the store imports events)

            try:
                check_blob_key(block.blob)
            except Exception as exc:  # a StoreError, reported as the event's error
                raise EventError(f"media block: {exc}") from None
    elif isinstance(block, OpaqueBlock):
        if block.api not in WIRE_APIS:
            msg = f"opaque block: api must be one of {sorted(WIRE_APIS)}, got {block.api!r:.60}"
            raise EventError(msg)
    elif isinstance(block, ToolResultBlock) and isinstance(block.parts, list):
        parts: list[Part] = []
        for raw in block.parts:
            part = _block_from_dict(raw)
            if not isinstance(part, TextBlock | MediaBlock | OpaqueBlock):
                msg = f"tool_result parts hold only {sorted(PART_BLOCKS)} blocks, got {part.type!r}"
                raise EventError(msg)
            parts.append(part)
        return ToolResultBlock(block.call_id, block.content, block.is_error, block.name, tuple(parts) or None)
    return block


def _block_from_dict(data: Any) -> Block:
    # fast paths for the shapes _block_to_dict writes most; anything else takes the checked path
    if type(data) is dict:
        kind = data.get("type")
        if kind == "text" and len(data) == 2 and type(text := data.get("text")) is str:
            return TextBlock(text)
        if kind == "tool_call" and len(data) == 4:
            call_id, name, arguments = data.get("id"), data.get("name"), data.get("arguments")
            if type(call_id) is str and type(name) is str and type(arguments) is dict:
                return ToolCallBlock(call_id, name, arguments)
        if kind == "tool_result":
            call_id, content, name = data.get("call_id"), data.get("content"), data.get("name")
            is_error = data.get("is_error", False)
            if (
                type(call_id) is str
                and type(content) is str
                and (name is None or type(name) is str)
                and type(is_error) is bool
                and len(data) == 3 + ("name" in data) + ("is_error" in data)
            ):
                return ToolResultBlock(call_id, content, is_error, name)
    if not isinstance(data, dict) or not isinstance(data.get("type"), str) or data["type"] not in _BLOCK_FIELDS:
        msg = f"a content block must be an object with type in {list(_BLOCK_FIELDS)}, got {data!r:.200}"
        raise EventError(msg)
    cls, fields, required = _BLOCK_FIELDS[data["type"]]
    kwargs = {}
    for key, value in data.items():
        if key == "type":
            continue
        allowed = fields.get(key)
        if allowed is None:
            msg = f"{data['type']} block has unknown key {key!r}; accepted: {['type', *fields]}"
            raise EventError(msg)
        # exact-type membership first: replay parses every block, and this is its common case
        if type(value) not in allowed and not isinstance(value, allowed):
            names = [t.__name__ for t in fields[key]]
            msg = f"{data['type']} block key {key!r} must be {' or '.join(names)}, got {type(value).__name__}"
            raise EventError(msg)
        kwargs[key] = value
    missing = [k for k in required if k not in kwargs]
    if missing:
        msg = f"{data['type']} block is missing {missing}"
        raise EventError(msg)
    return _check_block(cls(**kwargs))
