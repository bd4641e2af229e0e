"""The plugin manager: discovery, selection by profile, conflicts, and a typed hook facade.

Strategies are found through entry points of group ``ctxkernel.strategies``; built-in strategies
(``default_plugins``) are listed the same way with the kernel's own distribution. We enumerate
entry points ourselves rather than with ``load_setuptools_entrypoints`` because pluggy silently
keeps one of two distributions that use the same name; here that is an error naming both.

This is the only module that registers plugins. The rest of the kernel calls hooks through
:class:`HookFacade`, which normalises first-result and list results once.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from . import hookspecs
from .errors import CacheWaitError, ConfigError, CtxKernelError, PluginConflictError
from .logging import get_logger
from .spec import NoSettings, StrategySpec
from .text import clip

if TYPE_CHECKING:
    from .context import Context, ReplyDraft, Request, StepContext
    from .errors import ModelError
    from .profile import Profile
    from .report import ValidationReport
    from .spans import CommitResult, ManualCompaction, ManualOutcome, Region, Summary
    from .tools import Tool

log = get_logger("ctxkernel.plugins")

ENTRY_POINT_GROUP = "ctxkernel.strategies"
KERNEL_DISTRIBUTION = "ctxkernel"
#: Built-in strategies: (entry-point style name, module path), registered like any plugin.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("basic", "ctxkernel.default_plugins.basic"),
    ("history", "ctxkernel.default_plugins.history"),
)
#: Capabilities of which a profile may run only one strategy unless it orders them explicitly.
EXCLUSIVE_CAPABILITIES = frozenset({"pressure"})


@dataclass(frozen=True)
class Available:
    """One strategy that can be loaded: its name, where it comes from, how to load it."""

    name: str
    distribution: str
    version: str
    target: str  # "module:attr" or "module"

    def load(self) -> Any:
        module_name, _, attr = self.target.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in attr.split(".") if attr else ():
                obj = getattr(obj, part)
        except (Exception, SystemExit) as exc:  # a module that exits at import must not end the command
            what = f"{type(exc).__name__}: {exc}" if isinstance(exc, SystemExit) else str(exc)
            msg = f"strategy {self.name!r} from {self.distribution} {self.version} failed to load {self.target}: {what}"
            raise ConfigError(msg) from exc
        if obj is None:  # pluggy would stop at an assertion
            msg = (
                f"strategy {self.name!r} from {self.distribution} {self.version}: its entry point {self.target} "
                "names None; accepted: a module or an object with hook implementations"
            )
            raise ConfigError(msg)
        return obj


def _kernel_version() -> str:
    try:
        return importlib.metadata.version(KERNEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def discover(*, entry_points: bool = True) -> tuple[dict[str, Available], dict[str, list[Available]]]:
    """Every loadable strategy by name, and the names offered by more than one distribution."""
    offers: dict[str, list[Available]] = {}
    version = _kernel_version()
    for name, module in DEFAULT_PLUGINS:
        offers.setdefault(name, []).append(Available(name, KERNEL_DISTRIBUTION, version, module))
    if entry_points:
        seen: set[tuple[str, str]] = set()
        for dist in importlib.metadata.distributions():
            # only a distribution that offers a strategy has its metadata parsed: parsing all of
            # them (over a hundred in a development environment) was most of a kernel's start-up
            offered = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
            if not offered:
                continue
            dist_name = dist.metadata["Name"] or "?"
            for ep in offered:
                if (dist_name, ep.name) in seen:
                    continue
                seen.add((dist_name, ep.name))
                offers.setdefault(ep.name, []).append(Available(ep.name, dist_name, dist.version, ep.value))
    unique = {name: found[0] for name, found in offers.items() if len(found) == 1}
    conflicts = {name: found for name, found in offers.items() if len(found) > 1}
    return unique, conflicts


class StrategyManager:
    """Loads the strategies a profile names and owns the pluggy ``PluginManager``."""

    def __init__(self, *, entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.entry_points = entry_points
        self.available, self.conflicts = discover(entry_points=entry_points)
        self.specs: dict[str, StrategySpec] = {}  # loaded, in profile order
        self.disabled: set[str] = set()
        self.generation = 0  # bumped whenever the enabled set changes
        self.hooks = HookFacade(self.pm)

    # -- loading ----------------------------------------------------------------------------------
    def resolve(self, name: str) -> Available:
        if name in self.conflicts:
            found = ", ".join(f"{a.distribution} {a.version} ({a.target})" for a in self.conflicts[name])
            msg = f"strategy name {name!r} is offered by more than one distribution: {found}; uninstall all but one"
            raise PluginConflictError(msg)
        if name not in self.available:
            msg = f"no installed strategy named {name!r}; installed: {sorted(self.available)}"
            raise ConfigError(msg)
        return self.available[name]

    def load(self, names: Iterable[str]) -> None:
        """Load and register strategies so that hooks run in the given (profile) order."""
        names = list(names)
        loaded = [(name, self.resolve(name)) for name in names]
        # pluggy calls the last registered first: register in reverse to call in profile order
        for name, available in reversed(loaded):
            self.register(available.load(), name, distribution=available.distribution, version=available.version)
        self.specs = {name: self.specs[name] for name in names} | {
            k: v for k, v in self.specs.items() if k not in names
        }

    def register(self, plugin: Any, name: str, *, distribution: str = "", version: str = "") -> StrategySpec:
        """Register one plugin object under its strategy name (tests use this directly)."""
        if name in self.specs:
            existing = self.specs[name]
            msg = (
                f"strategy {name!r} is already registered by {existing.distribution or 'a test'}; "
                f"{distribution or 'this plugin'} cannot register it again"
            )
            raise PluginConflictError(msg)
        declared: list[StrategySpec] = []
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            if "'session'" not in str(exc):
                raise
            # a strategy written for 0.2, whose hooks took the Session: say what replaced it
            msg = (
                f"{exc}; since ctxkernel 0.3 every session hook receives ctx (a ctxkernel.Context) instead of "
                "the session: rename the argument to ctx and act through STRATEGY.on(ctx) (CHANGELOG, 0.3)"
            )
            raise pluggy.PluginValidationError(exc.plugin, msg) from None
        try:
            self.pm.check_pending()
            impl = self.pm.hook.register_strategy.get_hookimpls()
            origin = f"plugin {name!r} ({distribution or 'unknown distribution'})"
            for hookimpl in impl:
                if hookimpl.plugin is plugin:
                    try:
                        hookimpl.function(register=declared.append)
                    except Exception as exc:  # the plugin's own failure, told with its name
                        msg = f"{origin}: register_strategy raised {type(exc).__name__}: {exc}"
                        raise ConfigError(msg) from exc
            wrong = [s for s in declared if not isinstance(s, StrategySpec)]
            if wrong:
                msg = (
                    f"{origin}: register_strategy must register a ctxkernel.StrategySpec (or STRATEGY.spec); "
                    f"it registered {type(wrong[0]).__name__} {wrong[0]!r:.80}"
                )
                raise ConfigError(msg)
            if len(declared) != 1 or declared[0].name != name:
                got = [s.name for s in declared]
                msg = f"{origin} must register exactly one strategy named {name!r} in register_strategy; it registered {got}"
                raise ConfigError(msg)
        except Exception:
            self.pm.unregister(plugin)
            raise
        spec = declared[0]
        spec.plugin = plugin
        spec.distribution = distribution
        spec.version = version
        self.specs[name] = spec
        self.generation += 1
        return spec

    def unregister(self, name: str) -> None:
        spec = self.specs.pop(name, None)
        if spec is not None:
            self.pm.unregister(spec.plugin)
            self.disabled.discard(name)
            self.generation += 1

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Block or unblock a loaded strategy's hooks at run time (no restart needed)."""
        spec = self.specs.get(name)
        if spec is None:
            msg = f"strategy {name!r} is not loaded; loaded: {list(self.specs)}"
            raise ConfigError(msg)
        if enabled and name in self.disabled:
            self.disabled.discard(name)
            self.pm.register(spec.plugin, name=name)
            self._reorder()
        elif not enabled and name not in self.disabled:
            self.disabled.add(name)
            self.pm.unregister(spec.plugin)
        else:
            return
        self.generation += 1

    def _reorder(self) -> None:
        # re-registering puts a plugin first; restore profile order by re-registering all
        for name in self.enabled_names():
            plugin = self.specs[name].plugin
            self.pm.unregister(plugin)
        for name in reversed(self.enabled_names()):
            self.pm.register(self.specs[name].plugin, name=name)

    def enabled_names(self) -> list[str]:
        return [n for n in self.specs if n not in self.disabled]

    def is_enabled(self, name: str) -> bool:
        return name in self.specs and name not in self.disabled

    def hook_names(self, name: str) -> list[str]:
        spec = self.specs[name]
        callers = self.pm.get_hookcallers(spec.plugin) or []
        return sorted(c.name for c in callers)


class HookTarget(Protocol):
    """What the hook facade needs of a session: the ``ctx`` its hooks receive and the strategies
    a person disabled for it (the Session satisfies it)."""

    @property
    def context(self) -> Context: ...

    @property
    def disabled_strategies(self) -> frozenset[str]: ...


def _args(impl: Any, **kwargs: Any) -> list[Any]:
    """The arguments of one implementation called on its own, in its own order: pluggy passes only
    the arguments an implementation names, so one that takes fewer than the spec still works."""
    return [kwargs[name] for name in impl.argnames]


def _answer(owner: str, hook: str, result: Any, accepted: type | tuple[type, ...]) -> Any:
    """``result`` when it is None or of an ``accepted`` type; otherwise a :class:`ConfigError`
    naming the strategy and its hook (a wrong type used to fail later as a bare AttributeError)."""
    if result is None or isinstance(result, accepted):
        return result
    names = " or ".join(t.__name__ for t in (accepted if isinstance(accepted, tuple) else (accepted,)))
    msg = (
        f"strategy {owner!r}: its {hook} hook returned {type(result).__name__} {result!r:.80}; "
        f"accepted: a {names} or None (see docs/hooks.md)"
    )
    raise ConfigError(msg)


def _raised(owner: str, hook: str, exc: Exception) -> ConfigError:
    """The error a strategy's hook that raised becomes: a :class:`ConfigError` naming the
    strategy and its hook, the hook's own exception chained as its cause (raise it ``from
    exc``). A kernel refusal (a :class:`CtxKernelError`) is not renamed: it passes as raised."""
    msg = (
        f"strategy {owner!r}: its {hook} hook raised {type(exc).__name__}: {clip(str(exc), 300)} "
        "(a bug in the strategy; fix or remove it from [profile] strategies)"
    )
    return ConfigError(msg)


def _call_named(owner: str, hook: str, impl: Any, **kwargs: Any) -> Any:
    """What ``owner``'s implementation ``impl`` of ``hook`` answers; an exception but a kernel
    error is named with its strategy (:func:`_raised`)."""
    try:
        return impl.function(*_args(impl, **kwargs))
    except CtxKernelError:
        raise
    except Exception as exc:
        raise _raised(owner, hook, exc) from exc


def _wrapped(impls: list[tuple[str, Any]]) -> bool:
    """Whether a plugin wraps the hook: a wrapper needs pluggy's own call, which does not say
    whose implementation raised."""
    return any(impl.hookwrapper or getattr(impl, "wrapper", False) for _, impl in impls)


class HookFacade:
    """One typed method per hook; the only caller of ``pm.hook``.

    A hook about one session skips the strategies that session disabled (its
    ``session/strategy`` events, see :mod:`ctxkernel.controls`): they stay registered for the
    kernel's other sessions.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._hook = pm.hook

    def _caller(self, name: str, session: HookTarget) -> Any:
        hook = getattr(self._hook, name)
        off = session.disabled_strategies
        if not off:
            return hook
        plugins = [p for n in off if (p := self._pm.get_plugin(n)) is not None]
        return self._pm.subset_hook_caller(name, plugins) if plugins else hook

    def _call_if_implemented(self, name: str, session: HookTarget, /, **kwargs: Any) -> None:
        """Call a hook whose results are not read, unless no strategy implements it: pluggy's
        call would run nothing then, after checking its arguments (the basic profile has no
        ``decorate_request`` or ``sanitize_reply``, and both run at every request)."""
        caller = self._caller(name, session)
        if caller.get_hookimpls():
            caller(ctx=session.context, **kwargs)

    def _each_named(self, name: str, session: HookTarget, /, *, every: bool = False, **kwargs: Any) -> list[Any]:
        """Each strategy's answer to ``name`` (None included), in call order; ``every`` also asks
        the strategies ``session`` disabled. One that raises is named with its strategy
        (:func:`_raised`). A hook wrapper needs pluggy's own call, which is made then."""
        impls = list(self._impls(name, None if every else session))
        if not impls:
            return []
        if _wrapped(impls):
            caller = getattr(self._hook, name) if every else self._caller(name, session)
            answer: Any = caller(ctx=session.context, **kwargs)
            return answer if isinstance(answer, list) else [answer]
        ctx = session.context
        return [_call_named(owner, name, impl, ctx=ctx, **kwargs) for owner, impl in impls]

    def _first_named(
        self, name: str, session: HookTarget, /, *, wrapped: bool = False, **kwargs: Any
    ) -> tuple[str, Any] | None:
        """The first strategy whose ``name`` (a first-result hook) answers other than None, and its
        answer, in call order; one that raises is named with its strategy (:func:`_raised`).
        ``wrapped``: a hook wrapper, if any, needs pluggy's own call, made then (its answer's
        strategy is not known: "")."""
        impls = list(self._impls(name, session))
        if wrapped and _wrapped(impls):
            answer: Any = self._caller(name, session)(ctx=session.context, **kwargs)
            return None if answer is None else ("", answer)
        for owner, impl in impls:
            answer = _call_named(owner, name, impl, ctx=session.context, **kwargs)
            if answer is not None:
                return owner, answer
        return None

    def _impls(self, name: str, session: HookTarget | None = None) -> Iterator[tuple[str, Any]]:
        """(strategy name, implementation) in call order, without those ``session`` disabled."""
        off = session.disabled_strategies if session is not None else frozenset()
        for impl in reversed(getattr(self._hook, name).get_hookimpls()):
            owner = self._pm.get_name(impl.plugin) or impl.plugin_name
            if owner not in off:
                yield owner, impl

    def session_opened(self, session: HookTarget) -> None:
        # every loaded strategy builds its state, so enabling it later finds it ready
        self._each_named("session_opened", session, every=True)

    def snapshot_state(self, session: HookTarget) -> list[Any]:
        # every loaded strategy, as for session_opened: a strategy enabled later opens from it too
        return [part for part in self._each_named("snapshot_state", session, every=True) if part is not None]

    def register_tools(self, session: HookTarget, register: Any) -> None:
        """Each strategy's ``register_tools`` in turn; one that raises is named (:func:`_raised`)."""
        self._each_named("register_tools", session, register=register)

    def system_prompt(self, session: HookTarget) -> list[str]:
        sections = []
        for owner, impl in self._impls("system_prompt", session):
            section = _answer(
                owner, "system_prompt", _call_named(owner, "system_prompt", impl, ctx=session.context), str
            )
            if section:
                sections.append(section)
        return sections

    def pre_step(self, session: HookTarget, step: StepContext) -> None:
        """Each strategy's ``pre_step`` in turn. An edit the prompt cache's break-even rule
        refused (:class:`~ctxkernel.errors.CacheWaitError`, nothing written) and the strategy did
        not catch ends that strategy's step, not the request: the next strategy still runs. Any
        other exception but a kernel error is named with its strategy (:func:`_raised`)."""
        impls = list(self._impls("pre_step", session))
        if _wrapped(impls):
            self._call_if_implemented("pre_step", session, step=step)  # wrappers need pluggy's call
            return
        for owner, impl in impls:
            try:
                _call_named(owner, "pre_step", impl, ctx=session.context, step=step)
            except CacheWaitError as exc:
                log.info(
                    "an edit waits for the prompt cache", strategy=owner, session=session.context.id, reason=str(exc)
                )

    def decorate_request(self, session: HookTarget, request: Request) -> None:
        self._each_named("decorate_request", session, request=request)

    def summarize(self, session: HookTarget, region: Region) -> Summary | str | None:
        """The first summary a strategy writes for ``region``, in call order (``trylast`` last)."""
        from .spans import Summary

        answered = self._first_named("summarize", session, region=region)
        if answered is None:
            return None
        summary: Summary | str = _answer(answered[0], "summarize", answered[1], (Summary, str))
        return summary

    def sanitize_reply(self, session: HookTarget, reply: ReplyDraft) -> None:
        self._each_named("sanitize_reply", session, reply=reply)

    def request_error(self, session: HookTarget, error: ModelError) -> bool | None:
        answered = self._first_named("request_error", session, wrapped=True, error=error)
        handled: bool | None = None if answered is None else answered[1]
        return handled

    def commit(self, session: HookTarget, result: CommitResult) -> None:
        """Each strategy's ``commit`` in turn. The transaction is durable when they run: one that
        raises neither undoes it nor makes it look failed, nor keeps the others from being told;
        it is logged as an error naming the strategy (:func:`_raised`), with its traceback."""
        impls = list(self._impls("commit", session))
        if _wrapped(impls):
            try:  # wrappers need pluggy's call, which does not say whose hook raised
                self._caller("commit", session)(ctx=session.context, result=result)
            except Exception as exc:
                self._commit_failed("a strategy", exc, result, session)
            return
        for owner, impl in impls:
            try:
                _call_named(owner, "commit", impl, ctx=session.context, result=result)
            except Exception as exc:
                self._commit_failed(owner, exc, result, session)

    @staticmethod
    def _commit_failed(owner: str, exc: Exception, result: CommitResult, session: HookTarget) -> None:
        log.error(
            "a commit hook raised; the compaction stays committed",
            strategy=owner,
            session=session.context.id,
            compaction_id=result.compaction_id,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )

    def compact_now(self, session: HookTarget, request: ManualCompaction) -> tuple[str, ManualOutcome] | None:
        """The first strategy that handles ``request`` and its outcome, in profile order."""
        answered: tuple[str, ManualOutcome] | None = self._first_named("compact_now", session, request=request)
        return answered

    def compact_now_strategies(self, session: HookTarget) -> list[str]:
        """The strategies that may answer ``compact_now`` for ``session``, in the order asked."""
        return [owner for owner, _ in self._impls("compact_now", session)]

    def project(self, session: HookTarget) -> dict[str, dict[str, Any]]:
        """Contributions keyed by strategy name, in profile order."""
        out: dict[str, dict[str, Any]] = {}
        # walk the implementations in call order so each contribution keeps its owner's name
        for owner, impl in self._impls("project", session):
            result = _answer(owner, "project", _call_named(owner, "project", impl, ctx=session.context), dict)
            if result:
                out[owner] = result
        return out

    def export_files(self, session: HookTarget) -> dict[str, dict[str, bytes]]:
        """Each strategy's files for ``ctxkernel export``, keyed by strategy name, in profile order."""
        out: dict[str, dict[str, bytes]] = {}
        for impl in reversed(self._hook.export_files.get_hookimpls()):
            name = self._pm.get_name(impl.plugin) or impl.plugin_name
            try:
                result: Any = impl.function(*_args(impl, ctx=session.context))
            except Exception as exc:  # a strategy's failure is named, never a bare traceback
                msg = f"strategy {name!r} could not hand over its files for export: {type(exc).__name__}: {exc}"
                raise ConfigError(msg) from exc
            if result:
                out[name] = result
        return out

    def steward_actions(self, session: HookTarget, request: Request) -> list[dict[str, Any]]:
        """Every strategy's steward calls, in profile order; each ``{"name": tool, "arguments": {...}}``."""
        calls: list[dict[str, Any]] = []
        for owner, impl in self._impls("steward_actions", session):
            result = _call_named(owner, "steward_actions", impl, ctx=session.context, request=request)
            for call in _answer(owner, "steward_actions", result, list) or []:
                if not (
                    isinstance(call, dict)
                    and isinstance(call.get("name"), str)
                    and isinstance(call.get("arguments", {}), dict)
                ):
                    msg = (
                        f"strategy {owner!r}: its steward_actions hook returned the call {call!r:.80}; accepted: "
                        '{"name": <tool name>, "arguments": {...}} in a list (see docs/hooks.md)'
                    )
                    raise ConfigError(msg)
                calls.append(call)
        return calls

    def register_commands(self, subparsers: Any) -> None:
        self._hook.register_commands(subparsers=subparsers)

    def validate_profile(self, profile: Profile, report: ValidationReport) -> None:
        self._hook.validate_profile(profile=profile, report=report)

    def validate_profile_each(
        self, profile: Profile, report: ValidationReport
    ) -> Iterator[tuple[str, BaseException | None]]:
        """Call each strategy's ``validate_profile`` on its own, in profile order, yielding its
        name and the exception it raised (None when it returned): a crash is attributed to its
        strategy and the others still get to check."""
        for impl in reversed(self._hook.validate_profile.get_hookimpls()):
            name = self._pm.get_name(impl.plugin) or impl.plugin_name
            try:
                impl.function(*_args(impl, profile=profile, report=report))
            except Exception as exc:  # handed to the caller, which reports it
                yield name, exc
            else:
                yield name, None

    def register_tools_each(self, session: HookTarget) -> dict[str, list[Tool]]:
        """The tools each strategy registers for ``session``, by strategy, duplicates kept (for
        ``ctxkernel validate``, which reports collisions instead of refusing them)."""
        from .tools import Tool

        owners: dict[str, list[Tool]] = {}
        for impl in reversed(self._hook.register_tools.get_hookimpls()):
            name = self._pm.get_name(impl.plugin) or impl.plugin_name
            found = owners.setdefault(name, [])

            def register(tool: Any, name: str = name, found: list[Tool] = found) -> None:
                if not isinstance(tool, Tool):
                    msg = f"strategy {name!r}: register_tools must register ctxkernel.Tool objects, got {type(tool).__name__}"
                    raise ConfigError(msg)
                found.append(tool)

            try:
                impl.function(*_args(impl, register=register, ctx=session.context))
            except CtxKernelError:
                raise
            except Exception as exc:
                raise _raised(name, "register_tools", exc) from exc
        return owners


__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "EXCLUSIVE_CAPABILITIES",
    "Available",
    "HookFacade",
    "HookTarget",
    "NoSettings",
    "StrategyManager",
    "StrategySpec",
    "discover",
]
