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
        self.capabilities = frozenset(self.capabilities)
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
