"""What a strategy hands the kernel: its :class:`StrategySpec` (name, settings model,
capabilities), from ``register_strategy``, and its :class:`StrategySnapshot`, from
``snapshot_state``. Plain data, below the hook specifications and the plugin manager that read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from .errors import ConfigError


class NoSettings(BaseModel):
    """Settings model of a strategy that takes none: every key is unknown."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class StrategySpec:
    """What a strategy declares through ``register_strategy``."""

    name: str
    settings: type[BaseModel] = NoSettings
    capabilities: frozenset[str] | set[str] | tuple[str, ...] = frozenset()
    description: str = ""
    # filled in by the manager
    plugin: Any = field(default=None, repr=False)
    distribution: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        # a strategy's own declaration: a wrong type is told here, naming what is accepted, and
        # never taken apart (frozenset("pressure") would claim the letters p, r, e, s, u)
        capabilities: Any = self.capabilities
        if isinstance(capabilities, (str, bytes)) or not isinstance(capabilities, (set, frozenset, list, tuple)):
            msg = (
                f"strategy {self.name!r}: capabilities must be a set of names such as {{'pressure'}}, "
                f"got {type(capabilities).__name__} {capabilities!r:.80}"
            )
            raise ConfigError(msg)
        if not all(isinstance(c, str) for c in capabilities):
            msg = f"strategy {self.name!r}: every capability must be a name (a string), got {capabilities!r:.80}"
            raise ConfigError(msg)
        self.capabilities = frozenset(capabilities)
        if not (isinstance(self.settings, type) and issubclass(self.settings, BaseModel)):
            msg = (
                f"strategy {self.name!r}: settings must be a pydantic model class (a BaseModel subclass with "
                f"model_config = ConfigDict(extra='forbid')), got {self.settings!r:.80}"
            )
            raise ConfigError(msg)
        extra = self.settings.model_config.get("extra")
        if extra != "forbid":
            msg = (
                f"strategy {self.name!r}: settings model {self.settings.__name__} must reject unknown "
                "keys (model_config = ConfigDict(extra='forbid'))"
            )
            raise ConfigError(msg)


@dataclass(frozen=True)
class StrategySnapshot:
    """One strategy's folded state in a session snapshot: what ``snapshot_state`` returns. Make it
    with ``StrategyHandle.snapshot`` (which signs it with the strategy's name).

    ``data`` is plain JSON (dicts with string keys, lists, strings, numbers, booleans, None) and
    holds only what a fold of the log derives, with the position it is folded to, so that the
    state restored from it and folded on over the tail is the state a full fold builds.
    ``version`` is the strategy's own format number: change it whenever the shape of ``data``
    changes, and a snapshot written by another version is set aside (the strategy folds the whole
    log once)."""

    strategy: str
    version: int
    data: dict[str, Any]


__all__ = ["NoSettings", "StrategySnapshot", "StrategySpec"]
