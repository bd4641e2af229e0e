"""What ``ctxkernel serve`` is started with: the flags, as one value every worker process reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from ..errors import ConfigError
from ..kernel import Kernel
from ..profile import load_profile, override_window
from ..redact import redact_url
from ..settings_check import http_url_problem
from . import DEFAULT_MAX_SESSIONS
from .upstream import Limits

DEFAULT_OPENAI_UPSTREAM = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_UPSTREAM = "https://api.anthropic.com"
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
#: the fields holding an upstream's base URL (``--upstream``, ``--anthropic-upstream``, ...)
UPSTREAM_FIELDS = ("upstream", "anthropic_upstream", "responses_upstream")


@dataclass
class ServeConfig:
    """What ``ctxkernel serve`` was started with (the CLI flags)."""

    profile: str = "basic"
    window: int | None = None
    upstream: str | None = None
    anthropic_upstream: str | None = None
    responses_upstream: str | None = None
    api_key_env: str | None = None
    lock_wait_seconds: float = 30.0
    max_inner_rounds: int = 8
    #: sessions kept open in memory, least recently used closed first (never one with a request
    #: in flight); a closed one is opened again from the store by its next request
    max_sessions: int = DEFAULT_MAX_SESSIONS
    #: settle the process's heap before serving (``process.settle_heap``): the garbage
    #: collector and the C allocator are the process's, so only a process serve owns tunes them
    tune_heap: bool = False
    #: seconds a client has to send its whole request body (then a 408 and the connection closed)
    body_seconds: float = 60.0
    #: Host names answered besides the loopback names ("*": any; gate.py)
    allowed_hosts: list[str] = field(default_factory=list)
    #: variable holding the key of the tenant hashes (else one kept in the store: tenants.py)
    tenant_secret_env: str | None = None
    #: mount the inspector at /ui, behind the operator token in $ui_token_env
    ui: bool = False
    ui_token_env: str | None = None
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse an upstream that is no base URL of an HTTP API, as the flags and the profile's
        ``[serve]`` keys do (:func:`ctxkernel.settings_check.http_url_problem`): a config built in
        code is checked when it is made, and again by ``create_app``; :class:`ConfigError`."""
        for name in UPSTREAM_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            text = value if isinstance(value, str) else ""  # a number or a list is no URL either
            problem = http_url_problem(text)
            if problem:
                shown = repr(redact_url(value)) if isinstance(value, str) else f"a {type(value).__name__}"
                raise ConfigError(f"ServeConfig.{name}: {shown} {problem}")

    def to_json(self) -> str:
        data = {
            k: getattr(self, k)
            for k in (
                "profile",
                "window",
                "upstream",
                "anthropic_upstream",
                "responses_upstream",
                "api_key_env",
                "lock_wait_seconds",
                "max_inner_rounds",
                "max_sessions",
                "tune_heap",
                "body_seconds",
                "allowed_hosts",
                "tenant_secret_env",
                "ui",
                "ui_token_env",
            )
        }
        data["limits"] = self.limits.__dict__
        return orjson.dumps(data).decode()

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        data = orjson.loads(text)
        limits = Limits(**data.pop("limits", {}))
        return cls(**data, limits=limits)


def upstream_bases(config: ServeConfig, kernel: Kernel) -> tuple[str, str]:
    """The OpenAI-compatible and the Anthropic base URLs: the flags, else the profile's
    ``[serve]`` table, else the providers' own."""
    profile_serve = kernel.profile.serve
    return (
        config.upstream or profile_serve.upstream or DEFAULT_OPENAI_UPSTREAM,
        config.anthropic_upstream or profile_serve.anthropic_upstream or DEFAULT_ANTHROPIC_UPSTREAM,
    )


def build_kernel(config: ServeConfig) -> Kernel:
    """The kernel of the configured profile (with the ``--window`` override)."""
    profile = load_profile(config.profile)
    if config.window is not None:
        override_window(profile, config.window)
    return Kernel(profile)
