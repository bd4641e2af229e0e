"""The report of ``ctxkernel validate``: one :class:`Check` per result, in the order the checks
ran. Strategies add theirs in their ``validate_profile`` hook (through ``Strategy.validating``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from .redact import redact

Level = Literal["pass", "warn", "fail"]
#: Table of checks in the order they run (also the ``check`` column's vocabulary).
CHECKS = (
    "profile",  # the file parses and its kernel tables validate
    "resolve",  # each strategy name -> exactly one installed distribution
    "hooks",  # every hook implementation matches a hookspec
    "settings",  # strategy tables and per-model policies validate
    "capabilities",  # exclusive capabilities claimed once, or ordered
    "requires",  # [profile] requires against installed distributions
    "tokenizer",  # counts with the network disabled
    "store",  # reachable and writable
    "budgets",  # window, reserve, strategy token budgets, request header size
    "tools",  # no tool name registered twice
    "strategy",  # the strategies' own validate_profile checks
)


@dataclass(frozen=True)
class Check:
    check: str
    level: Level
    strategy: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class ValidationReport:
    """The results of validating one profile, in the order the checks ran."""

    where: str
    strict: bool = False
    path: Path | None = None
    checks: list[Check] = field(default_factory=list)
    #: capabilities each strategy of the profile that loaded claims (for strategies' own checks)
    capabilities: dict[str, frozenset[str]] = field(default_factory=dict)

    def strategies_claiming(self, capability: str) -> list[str]:
        """The profile's loaded strategies that claim ``capability``, in profile order."""
        return [name for name, claimed in self.capabilities.items() if capability in claimed]

    def _add(self, level: Level, check: str, strategy: str | None, message: str) -> Check:
        # CI logs are where validate runs: no check, the kernel's or a strategy's, prints a
        # credential (a DSN's password, a key echoed by a driver's error)
        message = redact(message)
        strategy = strategy or ""
        if level != "pass":
            # one rule for every message, including the ones strategies write: name the file
            # and the strategy, so a CI log line is enough to find and fix the problem
            body = message.removeprefix(f"{self.where}: ") if message.startswith(f"{self.where}: ") else message
            who = f"strategy {strategy!r}: " if strategy and f"strategy {strategy!r}" not in body else ""
            message = f"{self.where}: {who}{body}"
        item = Check(check, level, strategy, message)
        self.checks.append(item)
        return item

    def ok(self, check: str, strategy: str | None, message: str) -> Check:
        """Record a passed check."""
        return self._add("pass", check, strategy, message)

    def warn(self, check: str, strategy: str | None, message: str) -> Check:
        """Record a problem that does not stop the profile from running (fails under ``--strict``)."""
        return self._add("warn", check, strategy, message)

    def fail(self, check: str, strategy: str | None, message: str) -> Check:
        """Record a problem that makes the profile unusable; say how to fix it."""
        return self._add("fail", check, strategy, message)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.level == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.level == "warn"]

    @property
    def valid(self) -> bool:
        """No failure, and no warning either when ``strict``."""
        return not self.failures and not (self.strict and self.warnings)

    def rows(self) -> list[dict[str, str]]:
        return [c.to_dict() for c in self.checks]


__all__ = ["CHECKS", "Check", "Level", "ValidationReport"]
