"""The user's instructions survive every compaction (the kernel's budget, ``[instructions]``).

An *instruction* is a message the user wrote: a ``user/message`` appended with a ``user``
source (``session.user(...)``, a proxy client's user turn), never a plugin notice, a summary
or a tool result. That is what ``ctxkernel simulate`` counts in ``instructions_visible``.

The kernel keeps a ledger of them per session, folded from the log: the session's own user
messages, after the ones it inherited from its parent (a chapters continuation or fork). The
*protected* instructions are the newest of the ledger whose tokens fit the budget
(``[instructions] budget_ratio`` of the routed model's effective window), newest first up to the
first that does not fit; one larger than the whole budget is passed over.

Every compaction transaction (:func:`ctxkernel.compaction.run_transaction`, the one path by
which any strategy changes the surface beyond appending) calls :func:`pin_lost` before it
commits: each protected instruction that would no longer be on the surface verbatim after the
commit (not in a kept message, not quoted by a replacement) is written, verbatim, into a
``<user-instructions>`` block at the end of the transaction's first replacement. So no strategy
can compact an instruction away, and none has to remember to carry them. A session that continues
another (``open_session(..., instructions_from=...)``, or ``parent``) inherits that session's
newest instructions: before its first request the kernel records them (``instructions/inherited``)
and pins, in a block of their own, those its seed does not already show. Instructions outside the budget stay
in the log, where the history tools (``item_<seq>``) and ``search`` reach them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .events import USER_MESSAGE, Event, EventSpec, append_op
from .frames import KERNEL_FRAMES, guard
from .messages import Message, Source, TextBlock
from .meter import EXACT_COUNT_CHARS, MESSAGE_OVERHEAD, message_text_for_count

if TYPE_CHECKING:
    from .ports import SessionPort
    from .surface import Node

KERNEL = "kernel"
FORM = "instructions"
BLOCK_FRAME = "user-instructions"
BLOCK_OPEN = f"<{BLOCK_FRAME}>"
BLOCK_CLOSE = f"</{BLOCK_FRAME}>"
BLOCK_INTRO = (
    "The user's own messages of this session, verbatim, oldest first. They were compacted out of "
    "the context above and still apply; any other earlier message can be found with the history tools."
)
#: inner words an instruction keeps to rule out texts without it (:attr:`Instruction.inner_words`):
#: its longest, which are the rarest; one absent is enough, and every word kept per user message
#: cost about four times its text in memory
FILTER_WORDS = 8
#: the ignorable event with which a continuation records the instructions it inherited
#: (``{"instructions": [{"session", "seq", "text"}, ...]}``), written before its first request
INHERITED_EVENT = "instructions/inherited"
#: the store's key-value namespace holding a new continuation's inheritance until its first
#: request writes it to its log (durable across processes, and out of the log until then, so the
#: strategy's seed stays the continuation's first event)
PENDING_NAMESPACE = "ctxkernel.instructions"


@dataclass(frozen=True, slots=True)
class Instruction:
    """One user message: the session whose log holds it, its seq there, and its text."""

    session: str
    seq: int
    text: str
    #: :meth:`_search_keys`, once computed (a slot: the ledger holds one instruction per user message)
    _keys: tuple[str, Sequence[str]] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def ref(self) -> str:
        return f"item_{self.seq}"

    @property
    def shown(self) -> str:
        """The text as the block shows it, every kernel frame's tag (``frames.KERNEL_FRAMES``) neutralised
        so it cannot end the block or forge one in its message; what matching looks for (:attr:`normalized`)."""
        return guard(self.text, *KERNEL_FRAMES)

    @property
    def normalized(self) -> str:
        """The text as :func:`normalized` has it, computed once per instruction (the ledger keeps
        its instructions, so every compaction of the session reads it)."""
        return self._search_keys()[0]

    @property
    def inner_words(self) -> Sequence[str]:
        """Some words of :attr:`normalized` but its first and last (the :data:`FILTER_WORDS`
        longest): a text that contains the instruction verbatim (whitespace aside) holds each of
        them as a whole word (the first and last may be the ends of longer words there)."""
        return self._search_keys()[1]

    def _search_keys(self) -> tuple[str, Sequence[str]]:
        # kept on the instance by hand: functools.cached_property takes a lock per read in
        # Python 3.11, which cost more than computing the two keys
        keys = self._keys
        if keys is None:
            # as the block shows it: a block that carries the instruction is where it is found
            shown = self.shown
            words = shown.split()  # normalized() joins these: one split gives both keys
            joined = " ".join(words)
            inner: Sequence[str] = words[1:-1] if len(words) > 2 else ()  # () is one shared object
            if len(inner) > FILTER_WORDS:
                inner = tuple(sorted(inner, key=len, reverse=True)[:FILTER_WORDS])
            keys = (shown if joined == shown else joined, inner)  # the text itself, not a copy, when the same
            object.__setattr__(self, "_keys", keys)
        return keys

    def to_dict(self) -> dict[str, Any]:
        return {"session": self.session, "seq": self.seq, "text": self.text}


def normalized(text: str) -> str:
    """Whitespace collapsed: how verbatim presence is judged (as ``instructions_visible`` does)."""
    return " ".join(text.split())


def instruction_of(session_id: str, event: Event) -> Instruction | None:
    """The instruction ``event`` appends, or None (not a user-written message)."""
    if event.type != USER_MESSAGE or (event.surface or {}).get("op") != "append":
        return None
    message = event.data.get("message")
    if not isinstance(message, dict) or (message.get("source") or {}).get("kind", "user") != "user":
        return None
    text = "\n".join(
        b.get("text", "") for b in message.get("content") or () if isinstance(b, dict) and b.get("type") == "text"
    )
    return Instruction(session_id, event.seq, text) if text.strip() else None


def inherited_of(event: Event) -> list[Instruction]:
    """The ledger a continuation inherited (empty for any other event)."""
    if event.type != INHERITED_EVENT:
        return []
    raw = event.data.get("instructions")
    if not isinstance(raw, list):
        return []
    out = []
    for item in raw:
        if (
            isinstance(item, dict)
            and isinstance(item.get("session"), str)
            and isinstance(item.get("seq"), int)
            and isinstance(item.get("text"), str)
        ):
            out.append(Instruction(item["session"], item["seq"], item["text"]))
    return out


@dataclass
class Ledger:
    """A session's instructions, built from its log on demand and extended incrementally (a
    cursor over ``session.events``, like the history index), so it needs no state of its own in
    the log or a snapshot: any process that can read the events rebuilds it."""

    cursor: int = 0
    inherited: list[Instruction] = field(default_factory=list)
    own: list[Instruction] = field(default_factory=list)
    #: (session, seq) -> tokens, counted once per process
    costs: dict[tuple[str, int], int] = field(default_factory=dict)
    #: surface node seq -> (its message, that message's text normalised): what a compaction
    #: searches for lost instructions, normalised once per message instead of at every compaction
    normalized_texts: dict[int, tuple[Message, str]] = field(default_factory=dict)
    #: id of an instruction -> (it, tokens of its line in a block: text, id, newline), exactly: of the
    #: instruction alone (and of this session's id and tokenizer), so the block a strategy sized
    #: (``pin_cost``) and the one its transaction then pins add the same lines without recounting
    line_costs: dict[int, tuple[Instruction, int]] = field(default_factory=dict)
    #: the last answers of the search of the kept surface (``_missing_from_kept``): the surface's
    #: revision and the cited set they hold for, and for each instruction searched (by id, kept
    #: beside its answer) whether no kept node shows it. A strategy sizing its replacement and its
    #: transaction search the same kept nodes on the same surface; any append or replacement
    #: changes the revision, so it is never stale
    kept_answers: tuple[Any, set[int], dict[int, tuple[Instruction, bool]]] | None = None
    #: the last ``protected`` answer and what it was chosen from (the ledger's lists and the budget)
    protected_answer: tuple[Any, list[Instruction]] | None = None
    #: ``len(own)`` when the protected instructions were last made afresh together (:func:`_repack`)
    packed: int = 0
    #: the seqs of the surface's nodes whose message is text only (an instruction among them is
    #: on the surface as sent), for the surface's revision: collected once per revision from the
    #: surface's nodes instead of one lookup per protected instruction at each question
    as_sent: tuple[Any, set[int]] | None = None
    #: the last ``_not_kept_as_sent`` answer: the revision, cited set and protected list it holds
    #: for. A strategy sizing its replacement (``pin_cost``) and its transaction (``pin_lost``)
    #: ask the same question of the same surface
    not_kept_answer: tuple[Any, set[int], list[Instruction], list[Instruction]] | None = None
    #: the last ``block_tokens`` answer and the instructions it counted (compared item by item:
    #: the same objects, so a C loop of identity checks)
    block_answer: tuple[str, list[Instruction], int] | None = None

    def sync(self, session_id: str, events: Sequence[Event]) -> list[Instruction]:
        """The ledger, oldest first, after folding the events appended since the last call."""
        for seq in range(self.cursor, len(events)):
            self.fold(session_id, events[seq])
        return self.inherited + self.own

    def fold(self, session_id: str, event: Event, *, live: bool = False) -> None:
        """Fold the event at the cursor. The session calls it as each event folds while the
        ledger is current, so a compaction reads a ready ledger instead of walking the log
        (a session opened from a snapshot starts behind and catches up in :meth:`sync`).

        ``live``: the event is one this process appends (not a replay): its instruction's
        search keys are computed as it lands, ~1 µs once per user message, instead of at the
        session's first compaction, which reads every cited one (moved, not removed; a replay
        leaves them to the first search, so opening a long log does not pay for them)."""
        self.cursor = event.seq + 1
        if event.type == INHERITED_EVENT:
            self.inherited = inherited_of(event)
            if live:
                for kept in self.inherited:
                    kept._search_keys()
        elif event.type == USER_MESSAGE:
            item = instruction_of(session_id, event)
            if item is not None:
                self.own.append(item)
                if live:
                    item._search_keys()


def budget_tokens(session: SessionPort) -> int:
    """The budget of the routed model: ``budget_ratio`` x its effective window."""
    ratio = session.kernel.profile.instructions.budget_ratio
    return int(ratio * session.model_settings().effective_window)


def protected(session: SessionPort, budget: int | None = None) -> list[Instruction]:
    """The newest instructions of the session's ledger within ``budget`` tokens (default: the
    profile's budget for the routed model), oldest first."""
    budget = budget_tokens(session) if budget is None else budget
    ledger, costs = session.instructions, session.instruction_costs
    # the choice is a function of the ledger's instructions and the budget (each cost is the
    # exact count of its text, wherever it was taken): the ledger only grows (``own``) or is
    # replaced (``inherited``), so its lists and length name what it holds
    book = session.instruction_ledger
    chosen_from = (book.inherited, len(book.own), budget)
    last = book.protected_answer
    if last is not None and last[0][0] is chosen_from[0] and last[0][1:] == chosen_from[1:]:
        return list(last[1])
    _costs_from_surface(session, ledger, costs)
    chosen = within(ledger, budget, costs, session.meter.count_text)
    if len(book.own) - book.packed >= max(1, len(chosen) // 4):
        chosen = _repack(session, book, chosen)
    book.protected_answer = (chosen_from, chosen)
    return list(chosen)


def _repack(session: SessionPort, book: Ledger, chosen: list[Instruction]) -> list[Instruction]:
    """``chosen`` with the session's own instructions among them (and every later one of the
    ledger) made afresh, one after another, with their search keys.

    A live session makes each instruction as its message lands, among everything else the
    session allocates meanwhile, so after a long run the protected ones lie one to a memory page
    and a compaction, which reads each of them several times, waits on the memory for each read:
    a compaction of a session built live to 40,000 events took 1.35x the same compaction of the
    same log reopened (``bench_compaction_flat.py``). Made together, they share pages; done when a
    quarter of the protected ones are new since the last time, so at most once every few
    compactions, and only for those that landed since the last time. The copies are equal to the
    originals (the same session, seq and text)."""
    own = session.id
    first = next((item for item in chosen if item.session == own), None)
    packed, book.packed = book.packed, len(book.own)
    if first is None:
        return chosen
    # those made together last time still share their pages: only the ones since are made again
    start = max(packed, bisect.bisect_left(book.own, first.seq, key=lambda item: item.seq))
    known = book.line_costs
    fresh: dict[int, Instruction] = {}
    for index in range(start, len(book.own)):
        old = book.own[index]
        item = Instruction(old.session, old.seq, old.text)
        item._search_keys()
        line = known.pop(id(old), None)
        if line is not None and line[0] is old:
            known[id(item)] = (item, line[1])
        book.own[index] = fresh[item.seq] = item
    return [fresh.get(item.seq, item) if item.session == own else item for item in chosen]


def _costs_from_surface(session: SessionPort, ledger: Sequence[Instruction], costs: dict[tuple[str, int], int]) -> None:
    """Fill the costs of the session's own instructions from their surface nodes: a user message
    of text blocks only is counted as its texts joined by newlines plus the message overhead,
    the very string and tokenizer of the instruction's cost, and the meter counts every visible
    node anyway, so a compaction does not tokenise each instruction a second time."""
    own, node_of, node_tokens = session.id, session.surface.node, session.meter.node_tokens
    for item in reversed(ledger):
        key = (item.session, item.seq)
        if key in costs:
            break  # filled newest first up to here on an earlier call: the older ones are too
        node = node_of(item.seq) if item.session == own else None
        if node is None:
            continue
        for block in node.message.content:
            if block.type != "text":
                break
        else:
            costs[key] = node_tokens(node) - MESSAGE_OVERHEAD


def within(
    ledger: Sequence[Instruction], budget: int, costs: dict[tuple[str, int], int], count: Any
) -> list[Instruction]:
    """Newest first, the instructions of ``ledger`` whose tokens (``count``, cached in ``costs``)
    fit ``budget``, up to the first that does not; returned oldest first.

    One larger than the whole budget is passed over (it could never be kept, and must not hide
    the older ones). Stopping at the first that does not fit keeps the choice monotonic: an
    instruction a compaction left out never becomes protected again by a newer one arriving."""
    if budget <= 0:
        return []
    chosen: list[Instruction] = []
    left = budget
    for item in reversed(ledger):
        key = (item.session, item.seq)
        cost = costs.get(key)
        if cost is None:
            cost = costs[key] = count(item.text)
        if cost > budget:
            continue
        if cost > left:
            break
        chosen.append(item)
        left -= cost
    chosen.reverse()
    return chosen


def ledger_of(session_id: str, events: Sequence[Event]) -> list[Instruction]:
    """A session's ledger read from its events (for a parent not open in this process)."""
    return Ledger().sync(session_id, events)


def missing(items: Sequence[Instruction], texts: Iterable[str]) -> list[Instruction]:
    """The ``items`` none of ``texts`` contains verbatim (whitespace aside)."""
    if not items:
        return []
    return _missing_in(items, [normalized(t) for t in texts])


def _missing_in(items: Sequence[Instruction], normalized_texts: list[str]) -> list[Instruction]:
    # one message's text per line: a normalised instruction holds no newline, so it can only
    # match inside one message, never across two
    visible = "\n".join(normalized_texts)
    return [i for i in items if i.normalized not in visible]


def _missing_from_kept(session: SessionPort, items: Sequence[Instruction], cited: set[int]) -> list[Instruction]:
    """The ``items`` no surface node outside ``cited`` shows verbatim (whitespace aside): what
    ``_missing_in(items, _kept_texts(session, cited))`` answers, mostly without normalising or
    searching the kept texts. An instruction one of whose inner words (:attr:`Instruction.inner_words`)
    is no whole word of any kept text cannot be in one; only the others are searched for."""
    if not items:
        return []
    book = session.instruction_ledger
    revision = _revision(session)
    last = book.kept_answers
    if last is not None and last[0] == revision and last[1] == cited:
        answers = last[2]
    else:
        answers = {}
        book.kept_answers = (revision, set(cited), answers)
    # by id, with the instruction kept beside its answer (so the id is not reused meanwhile) and
    # checked: hashing a frozen dataclass's three fields per lookup cost more than the search saved
    unknown = []
    for item in items:
        hit = answers.get(id(item))
        if hit is None or hit[0] is not item:
            unknown.append(item)
    if unknown:
        lost = {id(item) for item in _search_kept(session, unknown, cited)}
        for item in unknown:
            answers[id(item)] = (item, id(item) in lost)
    return [item for item in items if answers[id(item)][1]]


def _search_kept(session: SessionPort, items: Sequence[Instruction], cited: set[int]) -> list[Instruction]:
    """What :func:`_missing_from_kept` answers, searched afresh (no memo)."""
    kept = [node for node in session.surface.nodes if node.seq not in cited]
    inner = [i.inner_words for i in items]
    wanted: set[str] = set()
    for words in inner:
        wanted.update(words)
    # the kept texts' words that some instruction needs (an intersection hashes each word once
    # and stores only the few that match: cheaper than a set of every kept word)
    seen = wanted.intersection(" ".join([node.message.text for node in kept]).split()) if wanted else wanted
    maybe = [i for i, words in zip(items, inner, strict=True) if seen.issuperset(words)]
    if not maybe:
        return list(items)
    visible = "\n".join(_normalized_texts(session, kept))  # one text per line, as in _missing_in
    found = {id(i) for i in maybe if i.normalized in visible}
    return [i for i in items if id(i) not in found]


def _kept_texts(session: SessionPort, cited: set[int]) -> list[str]:
    """The normalised texts of the surface nodes not in ``cited``, from the ledger's cache."""
    return _normalized_texts(session, [node for node in session.surface.nodes if node.seq not in cited])


def _normalized_texts(session: SessionPort, nodes: Sequence[Node]) -> list[str]:
    """The normalised texts of ``nodes`` (on the surface), from the ledger's cache."""
    cache = session.instruction_texts
    surface = session.surface
    out = []
    for node in nodes:
        hit = cache.get(node.seq)
        if hit is None or hit[0] is not node.message:
            hit = cache[node.seq] = (node.message, normalized(node.message.text))
        out.append(hit[1])
    if len(cache) > 2 * len(surface) + 256:  # replaced nodes: keep the visible ones only
        visible = {node.seq for node in surface.nodes}
        for seq in [seq for seq in cache if seq not in visible]:
            del cache[seq]
    return out


#: the block's first two lines, as one part of its count (the same for every session)
_BLOCK_HEAD = f"{BLOCK_OPEN}\n{BLOCK_INTRO}\n"
#: tokenizer name -> the counts of the block's head and closing tag (texts no session changes)
_FRAME_COUNTS: dict[str, tuple[int, int]] = {}


#: an id on its line is `` [item_<seq>]`` (``Instruction.ref`` in brackets): the text around its seq
_ID_OPEN = " [item_"
_ID_CLOSE = "]"


def _pointer(item: Instruction, session_id: str) -> str:
    """What follows an instruction's text on its line: its id, only for this session's own
    messages (the history tools read this session's log)."""
    return f"{_ID_OPEN}{item.seq}{_ID_CLOSE}" if item.session == session_id else ""


def block_text(items: Sequence[Instruction], session_id: str) -> str:
    """One line per instruction, its text then its id: the id after the text, so the cut before
    it is exact (``Meter.joins_exactly``) and the block is counted from the instructions' own
    counts (:func:`block_tokens`)."""
    lines = [BLOCK_OPEN, BLOCK_INTRO]
    lines.extend(item.shown.strip() + _pointer(item, session_id) for item in items)
    lines.append(BLOCK_CLOSE)
    return "\n".join(lines)


def block_tokens(session: SessionPort, items: Sequence[Instruction]) -> int:
    """Tokens of ``block_text(items, session.id)``, exactly: each instruction's text taken at the
    count the ledger already holds for it (counted when it landed on the surface, or for the
    budget), so only the frame is tokenised (once per process) and each id is counted from its
    digits (``Meter.count_numbered``).

    Every cut taken is one ``Meter.joins_exactly`` proves: a line's text is stripped and not
    empty, so it starts after a newline with a character that is not white space and ends with
    one before its id, which starts with a space; an id ends with a newline before the next
    line's text or the closing tag. A tokenizer without that proof, or an instruction with no
    text, gets the whole block counted."""
    book: Ledger = session.instruction_ledger
    last = book.block_answer
    if last is not None and last[0] == session.id and last[1] == items:
        return last[2]  # a strategy's sizing and its transaction count the same block
    total = _block_tokens(session, items)
    book.block_answer = (session.id, list(items), total)
    return total


def _block_tokens(session: SessionPort, items: Sequence[Instruction]) -> int:
    meter, costs = session.meter, session.instruction_costs
    lines = [(item, item.shown.strip()) for item in items]
    if not meter.joins_exactly("\n", "x") or not all(text for _, text in lines):
        return meter.count_text(block_text(items, session.id))
    frame = _FRAME_COUNTS.get(meter.tokenizer.name)
    if frame is None:  # the frame is the same text in every session: counted once per process
        frame = _FRAME_COUNTS[meter.tokenizer.name] = (meter.count_text(_BLOCK_HEAD), meter.count_text(BLOCK_CLOSE))
    total = frame[0] + frame[1]
    known = session.instruction_ledger.line_costs
    if len(known) > _LINE_COSTS_KEPT:
        known.clear()  # bounded: a ledger's protected instructions are far fewer
    for item, text in lines:
        hit = known.get(id(item))  # by id, the instruction kept beside its count and checked
        if hit is not None and hit[0] is item:
            total += hit[1]
        else:
            line = _line_tokens(session, item, text, costs)
            known[id(item)] = (item, line)
            total += line
    return total


#: how many instructions' line counts a ledger keeps (its protected instructions fit a budget)
_LINE_COSTS_KEPT = 4096


def _line_tokens(session: SessionPort, item: Instruction, text: str, costs: dict[tuple[str, int], int]) -> int:
    """Tokens of ``item``'s line in a block (``text``: its stripped text, not empty), with the
    newline that ends it, exactly (the cuts :func:`block_tokens` names)."""
    meter = session.meter
    # a count is of the whole text: usable when stripping changed nothing, and exact only up
    # to the meter's exact length (a longer text's count is a bound)
    cost = costs.get((item.session, item.seq)) if text == item.text and len(text) <= EXACT_COUNT_CHARS else None
    if item.session == session.id:  # the text, then its id and newline: the id's digits counted, not tokenised
        id_tokens = meter.count_numbered(_ID_OPEN, item.seq, _ID_CLOSE + "\n")
        return (meter.count_text(text) if cost is None else cost) + id_tokens
    # an inherited instruction's line ends at its text: its last line and the newline
    return meter.count_text(text + "\n") if cost is None else meter.count_extended(text, cost, "\n")


def carried_tokens(
    session: SessionPort, message: Message | None, tokens: int | None, items: Sequence[Instruction]
) -> int:
    """Tokens of the replacement that carries ``items`` (``with_block(message, ...)``, or the block
    alone for a transaction of removals: ``message`` None), exactly. ``tokens``, when not None, is
    ``message``'s own count: then only its last line is tokenised again, with the join."""
    meter = session.meter
    block = block_tokens(session, items)
    if message is None:
        return MESSAGE_OVERHEAD + block
    # the meter's text of a message joins its blocks with newlines; the block starts with "<",
    # so the cut after that newline is exact
    text = message_text_for_count(message)
    if not message.content or len(text) >= EXACT_COUNT_CHARS or not meter.joins_exactly(text + "\n", BLOCK_OPEN):
        return meter.count_message(with_block(message, items, session.id))
    # the text's own count: given, or the meter's (a strategy that sized a long replacement
    # counted it already, and the meter remembers it); only its last line is counted again
    own = meter.count_text(text) if tokens is None else tokens - MESSAGE_OVERHEAD
    return MESSAGE_OVERHEAD + meter.count_extended(text, own, "\n") + block


def with_block(message: Message, items: Sequence[Instruction], session_id: str) -> Message:
    """``message`` with the block appended as one more text block."""
    return Message(message.role, (*message.content, TextBlock(block_text(items, session_id))), message.source)


def block_message(items: Sequence[Instruction], session_id: str) -> Message:
    """A replacement of its own for a transaction that only removes."""
    return Message.user(block_text(items, session_id), Source.plugin_form(KERNEL, FORM))


def pin_lost(
    session: SessionPort, cited: set[int], replacements: list[Message | None]
) -> tuple[list[Message | None], list[Instruction], int]:
    """Step 5b of the transaction: carry into ``replacements`` every protected instruction the
    commit would take off the surface. Returns the new replacements, the instructions pinned and
    the index of the replacement that carries them (-1 when none)."""
    if not any(m is None or m.role != "tool" for m in replacements):
        return replacements, [], -1  # only tool-result rewrites: no user message leaves the surface
    keep = _not_kept_as_sent(session, cited)
    if not keep:
        return replacements, [], -1
    # the replacements first: an instruction a summary quotes is found there without a search
    # of every kept message (a normalised instruction holds no newline: it cannot match across
    # two texts, so searching the two groups apart finds what searching them joined would)
    lost = _missing_from_kept(session, _unquoted(keep, [m.text for m in replacements if m is not None]), cited)
    if not lost:
        return replacements, [], -1
    out = list(replacements)
    for i, message in enumerate(out):
        if message is not None and message.role != "tool":
            out[i] = with_block(message, lost, session.id)
            return out, lost, i
    # removals and tool-result rewrites only (a removal, checked above): the first becomes the block
    carrier = out.index(None)
    out[carrier] = block_message(lost, session.id)
    return out, lost, carrier


def _unquoted(items: Sequence[Instruction], texts: Sequence[str]) -> list[Instruction]:
    """The ``items`` none of ``texts`` contains verbatim (whitespace aside), as ``_missing_in``
    answers. An instruction's raw text inside one text is a quote found without normalising (a
    substring's words, white space collapsed, are a substring of the text's so collapsed): a
    seed or summary that quotes the instructions as written normalises nothing."""
    # a text that quotes them as written (a window's seed) quotes them all: the raw test runs
    # while it finds them, and everything from the first it does not find is searched normalised
    # (at most one raw search more than the normalised search alone, wherever they are not quoted)
    found = 0
    for item in items:
        if not any(item.shown in text for text in texts):
            break
        found += 1
    rest = items[found:]
    if not rest:
        return []
    # the rest as _search_kept filters the kept texts: an instruction one of whose inner words is
    # no whole word of the texts is not in them, so only the others are searched for (a handoff's
    # ~16 KB quotes few of the ~60 instructions a switch asks about); one split per text gives
    # both the words and the normalised text (normalized() is that split joined)
    words = [text.split() for text in texts]
    inner = [item.inner_words for item in rest]
    wanted: set[str] = set().union(*inner)
    seen = wanted.intersection(itertools.chain.from_iterable(words)) if wanted else wanted
    maybe = [item for item, needed in zip(rest, inner, strict=True) if seen.issuperset(needed)]
    if not maybe:
        return list(rest)
    searched = {id(item) for item in maybe}
    absent = {id(item) for item in _missing_in(maybe, [" ".join(split) for split in words])}
    return [item for item in rest if id(item) not in searched or id(item) in absent]


def _not_kept_as_sent(session: SessionPort, cited: set[int]) -> list[Instruction]:
    """The protected instructions whose own messages a commit replacing ``cited`` takes off the
    surface (or that are off it already). When every instruction of the ledger stays on the
    surface as sent (a compaction that cites no user message), none is, and the budget's choice
    is not needed: the scan runs newest first, so it stops at the newest one that does not stay."""
    own, as_sent = session.id, _as_sent(session)
    for item in reversed(session.instructions):
        if item.session != own or item.seq in cited or item.seq not in as_sent:
            break
    else:
        return []
    chosen = protected(session)
    book = session.instruction_ledger
    revision = _revision(session)
    last = book.not_kept_answer
    if last is not None and last[0] == revision and last[1] == cited and last[2] == chosen:
        return list(last[3])
    out = [i for i in chosen if i.session != own or i.seq in cited or i.seq not in as_sent]
    book.not_kept_answer = (revision, set(cited), chosen, out)
    return list(out)


def _revision(session: SessionPort) -> tuple[Any, int, int]:
    """What names the surface's state: any append or replacement moves it."""
    surface = session.surface
    return (surface, surface.applied, surface.version)


def _as_sent(session: SessionPort) -> set[int]:
    """The seqs of the surface's nodes whose message is text only: an instruction whose own
    message is among them (and not cited) is visible verbatim without searching the surface's
    texts, which is what most protected instructions are at any compaction."""
    book: Ledger = session.instruction_ledger
    revision = _revision(session)
    last = book.as_sent
    if last is not None and last[0] == revision:
        return last[1]
    seqs = set()
    for node in session.surface.nodes:
        for block in node.message.content:
            if block.type != "text":
                break
        else:
            seqs.add(node.seq)
    book.as_sent = (revision, seqs)
    return seqs


def _kept_as_sent(session: SessionPort, item: Instruction, cited: set[int]) -> bool:
    """True when the instruction's own message stays on the surface (not cited, text blocks
    only, so its text is the instruction's): the definition :func:`_not_kept_as_sent` answers
    from :func:`_as_sent` for every protected instruction at once."""
    if item.session != session.id or item.seq in cited:
        return False
    node = session.surface.node(item.seq)
    if node is None:
        return False
    return all(block.type == "text" for block in node.message.content)


def pin_cost(session: SessionPort, cited: set[int]) -> int:
    """Tokens the block of a compaction replacing the nodes ``cited`` would cost at most (the
    protected instructions only those nodes show, counted as if the replacement quoted none of
    them): what a strategy sizing its replacement to a target must leave room for."""
    keep = _not_kept_as_sent(session, cited)
    if not keep:
        return 0
    lost = _missing_from_kept(session, keep, cited)
    return block_tokens(session, lost) if lost else 0


def inherited(session: SessionPort, source_ledger: Sequence[Instruction]) -> list[Instruction]:
    """What a continuation inherits: the newest of its source's instructions within its budget."""
    return within(source_ledger, budget_tokens(session), session.instruction_costs, session.meter.count_text)


def pending_of(raw: Any) -> list[Instruction]:
    """The inheritance kept in the store for a continuation (a list of instruction dicts)."""
    if not isinstance(raw, list):
        return []
    return inherited_of(Event(0, INHERITED_EVENT, {"instructions": raw}, "", None, True))


def inheritance_batch(session: SessionPort, kept: Sequence[Instruction]) -> list[EventSpec]:
    """The events that record ``kept`` as inherited and pin those not on the surface."""
    batch = [EventSpec(INHERITED_EVENT, {"instructions": [i.to_dict() for i in kept]}, ignorable=True)]
    lost = missing(kept, [n.message.text for n in session.surface.nodes])
    if lost:
        batch.append(EventSpec(USER_MESSAGE, {"message": block_message(lost, session.id).to_dict()}, append_op()))
    return batch


__all__ = [
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "Instruction",
    "budget_tokens",
    "instruction_of",
    "missing",
    "normalized",
    "pin_lost",
    "protected",
]
