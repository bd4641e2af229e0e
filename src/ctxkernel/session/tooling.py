"""What every request carries before the surface: the tools (the strategies', registered through
``register_tools``, and the harness's own schemas) and the system prompt (the harness's or the
profile's, then each strategy's ``system_prompt`` section), composed once and kept until the
strategy set or the harness's part changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ..context import RequestHeader
from ..errors import ToolError
from ..messages import ToolCallBlock
from ..text import storable
from ..tools import Tool, ToolOutcome, ToolRegistry, preview

if TYPE_CHECKING:
    from ..meter import Meter
    from ..ports import SessionPort
    from .track import Tracker


#: the session whose header is being composed at its fullest (:meth:`Tooling.offering_everything`)
_IN_FULL: contextvars.ContextVar[Tooling | None] = contextvars.ContextVar("ctxkernel_header_in_full", default=None)


class Tooling:
    """One session's tools and the header they go into."""

    def __init__(self, session: SessionPort, meter: Meter, tracker: Tracker) -> None:
        self.session = session
        self.meter = meter
        self.tracker = tracker
        #: the tools the session's strategies offer: those they registered (rebuilt when the
        #: strategy set changes) but any whose name a harness tool has (:meth:`_offered`)
        self.tools = ToolRegistry()
        #: every tool the strategies registered, those the harness's tools shadow included
        self.registered = ToolRegistry()
        #: the harness's own tool schemas: sent with every request and counted by the meter
        self.harness_tools: list[dict[str, Any]] = []
        #: the names of the harness's tools: a strategy tool of one of these names is left out
        self.harness_names: frozenset[str] = frozenset()
        #: the harness's own system prompt; None means the profile's ``system_prompt``
        self.harness_system: str | None = None
        #: the strategy set (``generation``) the registry was built for
        self._tools_generation = -1
        #: (the surface hid anything, [tools] offer = "always") when the registry was built
        self._offers = (False, False)
        #: (key, system, tools, digest, tokens) of the composed header; the key is the strategy set,
        #: the harness's tool list (by identity and length) and its system prompt
        self._composed: tuple[int, str, list[dict[str, Any]], str, int] | None = None
        #: every tool the strategies may offer, also those they offer only later (:meth:`may_offer`)
        self.offerable = ToolRegistry()
        #: offer every tool from the first request (a framework that binds its tools up front)
        self.every_tool = False

    @property
    def generation(self) -> int:
        """Changes whenever the strategies running in this session change: the kernel's switch
        (``Kernel.set_strategy_enabled``) or this session's ``session/strategy`` events."""
        kernel_generation: int = self.session.kernel.plugins.generation
        return kernel_generation + self.tracker.strategy_toggles

    # -- tools ----------------------------------------------------------------------------------------
    def sync_tools(self) -> None:
        generation = self.generation
        # the recall tools come once the surface first hides something (StrategyHandle.offer_tools):
        # any edit may be that first one (a summary, a window switch, a pruned result), and the
        # request right after it must carry the tools its text names; a reloaded profile may
        # change [tools] offer
        offers = (self.session.surface.hides_anything(), self.offers_always)
        if generation == self._tools_generation and offers == self._offers:
            return
        with self.offering_everything():
            # a tool two strategies may offer is refused now, not once both offer it
            self.offerable = self._registered()
        self.registered = self._registered()
        self.tools = self._offered(self.registered)
        self._tools_generation = generation
        self._offers = offers
        self._composed = None

    def _registered(self) -> ToolRegistry:
        registry = ToolRegistry()
        kernel = self.session.kernel
        manager = kernel.plugins

        def register(tool: Tool) -> None:
            if not isinstance(tool, Tool):
                msg = f"register_tools must register ctxkernel.Tool objects, got {type(tool).__name__}"
                raise ToolError(msg)
            spec = manager.specs.get(tool.strategy)
            if spec is not None and not tool.distribution:
                tool.distribution = spec.distribution
            registry.add(tool)

        kernel.hooks.register_tools(self.session, register)
        return registry

    def _offered(self, registry: ToolRegistry) -> ToolRegistry:
        """``registry`` without the tools whose name one of the harness's tools has: the
        harness's tool wins (a provider refuses a request naming a tool twice), its schema is
        the one sent and its calls are the harness's to run, as in ``serve``. The registry
        itself when nothing clashes."""
        names = self.harness_names
        if not names or names.isdisjoint(registry.names()):
            return registry
        offered = ToolRegistry()
        for tool in registry:
            if tool.name not in names:
                offered.add(tool)
        return offered

    def owns(self, name: str) -> bool:
        self.sync_tools()
        return name in self.tools

    def may_offer(self, name: str) -> bool:
        """Whether a strategy offers this tool now or once it has something to do (not one
        whose name a harness tool has)."""
        self.sync_tools()
        return name in self.offerable and name not in self.harness_names

    def run(self, call: ToolCallBlock | dict[str, Any]) -> ToolOutcome:
        """Run a kernel tool. Bad arguments give an error outcome; nothing is written for them."""
        self.sync_tools()
        if isinstance(call, dict):
            call_id, name = call.get("id"), call.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                return ToolOutcome(
                    f"a tool call needs a string 'id' and 'name', got keys {preview(sorted(map(str, call))[:10], 200)}",
                    is_error=True,
                )
            call = ToolCallBlock(call_id, name, call.get("arguments") or {})
        if call.name in self.harness_names and call.name in self.registered:
            return ToolOutcome(
                f"{preview(call.name)} is the harness's own tool in this session (set_harness_tools): the "
                "strategy tool of that name is left out of its requests, so its calls are the harness's to "
                "run. Nothing was changed.",
                is_error=True,
            )
        # a tool that compacted (decay's compress) leaves its snapshot to the step's end, which the
        # call's result closes: as for every commit, the snapshot is not the compaction's cost
        return self.tools.run(self.session, call)

    # -- the composed header --------------------------------------------------------------------------
    def compose(self) -> tuple[str, list[dict[str, Any]], str, int]:
        """The composed system prompt, tool schemas, their hash and token count (kept)."""
        self.sync_tools()
        key = hash((self._tools_generation, len(self.harness_tools), id(self.harness_tools), self.harness_system))
        if self._composed is None or self._composed[0] != key:
            system, tools = self._system(), self.tools.schemas() + list(self.harness_tools)
            digest = hashlib.sha256(orjson.dumps([system, tools], option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]
            self._composed = (key, system, tools, digest, self.meter.count_header(system, tools))
        _, system, tools, digest, tokens = self._composed
        return system, tools, digest, tokens

    def _system(self) -> str:
        kernel = self.session.kernel
        own = kernel.profile.profile.system_prompt if self.harness_system is None else self.harness_system
        sections = [own, *kernel.hooks.system_prompt(self.session)]
        return "\n\n".join(s.strip() for s in sections if s and s.strip())

    def full_header(self) -> tuple[int, int]:
        """The header's tokens and tool count at its fullest, for the header guard: with every tool
        and system prompt section a strategy offers only once it has something to do (it reads
        ``ctx.header_in_full``), so that a header that would outgrow the window's room once they
        come is refused up front, not in the middle of the session."""
        system, tools, _, tokens = self.compose()
        with self.offering_everything():
            full_tools = self._offered(self._registered()).schemas() + list(self.harness_tools)
            full_system = self._system()
        if full_system == system and full_tools == tools:
            return tokens, len(tools)
        return self.meter.count_header(full_system, full_tools), len(full_tools)

    @property
    def in_full(self) -> bool:
        """True while :meth:`offering_everything` runs in this thread or task, for this session,
        and always for a session that offers every tool from the first request (``every_tool``,
        or the profile's ``[tools] offer = "always"``)."""
        return self.every_tool or self.weighing or self.offers_always

    @property
    def weighing(self) -> bool:
        """True inside :meth:`offering_everything`, in this thread or task, for this session."""
        return _IN_FULL.get() is self

    @property
    def offers_always(self) -> bool:
        """The profile's ``[tools] offer = "always"`` (read live: a profile may be reloaded)."""
        return bool(self.session.kernel.profile.tools.offer == "always")

    @contextlib.contextmanager
    def offering_everything(self) -> Iterator[None]:
        """Within the block, ``ctx.header_in_full`` is True: the strategies register every tool and
        system prompt section they may offer (the header guard, ``validate``'s checks). Only for
        the caller: another thread composing this session's header meanwhile sees it as it is."""
        token = _IN_FULL.set(self)
        try:
            yield
        finally:
            _IN_FULL.reset(token)

    def request_header(self) -> RequestHeader:
        system, tools, _, tokens = self.compose()
        return RequestHeader(system, tools, tokens)

    def invalidate(self) -> None:
        """Register the tools and compose again at the next request (a strategy's system prompt
        section or the tools it offers changed)."""
        self._tools_generation = -1
        self._composed = None

    def restore_harness_tools(self) -> None:
        """On resume, the harness's tools are those of the last recorded header that no strategy
        owns, so a reopened session composes the same request as before: also a harness tool
        that took a strategy tool's name (:meth:`_offered`), found as the header's tail after the
        strategies' schemas it left (:func:`_harness_tail`)."""
        self.sync_tools()
        header = self.tracker.header_tools
        tail = _harness_tail(header, self.registered.schemas())
        if tail is None:  # the strategies offer other schemas now: every name they own is theirs
            own = set(self.registered.names())
            tail = [t for t in header if _schema_name(t) not in own]
        self.harness_tools = tail
        self._set_harness_names()
        self._composed = None

    def set_harness_tools(self, schemas: list[dict[str, Any]]) -> None:
        self.harness_tools = storable(list(schemas))
        self._set_harness_names()
        self._composed = None

    def _set_harness_names(self) -> None:
        names = frozenset(n for n in map(_schema_name, self.harness_tools) if n is not None)
        if names != self.harness_names:
            self.harness_names = names
            self.tools = self._offered(self.registered)

    def set_harness_system(self, system: str | None) -> None:
        if system != self.harness_system:
            self.harness_system = system
            self._composed = None


def _harness_tail(header: list[dict[str, Any]], strategy: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The harness's part of a composed tool list ``header`` (the strategies' schemas but those a
    harness tool's name shadows, then the harness's, :meth:`Tooling.compose`), given the
    strategies' schemas now; None when no split gives it (the strategies changed). The longest
    strategy part wins: a harness tool identical to the strategy's is taken for the strategy's."""
    for cut in range(min(len(header), len(strategy)), -1, -1):  # the strategy part holds their schemas only
        tail = header[cut:]
        names = {_schema_name(t) for t in tail}
        kept = [s for s in strategy if _schema_name(s) not in names]
        if len(kept) == cut and header[:cut] == kept:
            return list(tail)
    return None


def _schema_name(schema: Any) -> str | None:
    """A tool schema's name: OpenAI's function format (``{"function": {"name"}}``), or a flat
    ``{"name"}`` (Anthropic's, a Responses API function tool)."""
    if not isinstance(schema, dict):
        return None
    function = schema.get("function")
    name = function.get("name") if isinstance(function, dict) else schema.get("name")
    return name if isinstance(name, str) else None


__all__ = ["Tooling"]
