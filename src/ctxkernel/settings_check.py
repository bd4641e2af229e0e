"""Settings errors a person can act on: validation of a strategy's settings (a boolean taken for
a number and inf or nan refused whatever its model allows) and pydantic's errors told as one line
per problem, naming the file, the table, the key and what is accepted; the check of a base URL
that settings and flags share."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from .errors import ProfileError
from .redact import redact

#: what a boolean given for a number is told
BOOL_NOT_NUMBER = "must be a number, not a boolean (true and false are not 1 and 0)"


def accepted_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Field names accepted at ``loc`` inside ``model`` (None when not a model there)."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            break
        annotation = field.annotation
        current = _model_in(annotation)
        if current is None:
            return None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def strategy_settings_from(model: type[BaseModel], raw: dict[str, Any], where: str, table: str) -> BaseModel:
    """A strategy's settings validated by its own model, then checked for a boolean taken as a
    number and for non-finite numbers (inf, nan), which a third-party model may let through;
    :class:`ProfileError` names the key."""
    booleans = _booleans_for_numbers(model, raw)
    if booleans:
        raise ProfileError("\n".join(f"{where}: {table}.{key}: {BOOL_NOT_NUMBER}" for key in booleans))
    try:
        settings = model.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(format_validation_error(exc, where, model, table)) from None
    bad = _non_finite(settings)
    if bad:
        msg = "\n".join(f"{where}: {table}.{key}: must be a finite number (got {value!r})" for key, value in bad)
        raise ProfileError(msg)
    return settings


def numeric(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` takes a number and no boolean (``int``, ``float``,
    ``int | None``)."""
    args = getattr(annotation, "__args__", None)
    if args and type(None) in args:
        return all(numeric(a) for a in args if a is not type(None))
    return annotation in (int, float)


def _booleans_for_numbers(model: type[BaseModel], raw: dict[str, Any], key: str = "") -> list[str]:
    """The keys of ``raw`` that give a boolean for a number of ``model`` (in pydantic's lax mode a
    third-party model takes ``true`` for 1), in lists of numbers and nested models too."""
    out = []
    for name, value in raw.items():
        field = model.model_fields.get(str(name))
        if field is None:
            continue
        sub, annotation = f"{key}.{name}" if key else str(name), field.annotation
        if isinstance(value, bool) and numeric(annotation):
            out.append(sub)
        elif isinstance(value, list) and getattr(annotation, "__origin__", None) is list:
            if numeric(annotation.__args__[0]):  # type: ignore[union-attr]
                out += [f"{sub}[{i}]" for i, item in enumerate(value) if isinstance(item, bool)]
        elif isinstance(value, dict) and (inner := _model_in(annotation)) is not None:
            out += _booleans_for_numbers(inner, value, sub)
    return out


def _non_finite(value: Any, key: str = "") -> list[tuple[str, float]]:
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(key, value)]
    if isinstance(value, BaseModel):
        items: Any = ((name, getattr(value, name)) for name in type(value).model_fields)
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return []
    out = []
    for name, inner in items:
        sub = f"{key}{name}" if str(name).startswith("[") else (f"{key}.{name}" if key else str(name))
        out += _non_finite(inner, sub)
    return out


def http_url_problem(value: str) -> str | None:
    """Why ``value`` is no base URL of an HTTP API (an ``http://`` or ``https://`` URL with a
    host, a valid port, no whitespace or control character, and no query or fragment, which the
    paths appended to it would follow), or None when it is one."""
    try:
        parts = urlsplit(value)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a malformed IPv6 address, a port that is no number or out of range
        usable = False
    if not usable or any(ord(c) <= 0x20 or ord(c) == 0x7F or c in "?#" for c in value):
        return (
            "must be an http:// or https:// URL with a host and no query or fragment (paths such as "
            "/chat/completions are appended to it), e.g. https://api.openai.com/v1"
        )
    return None


def check_http_url(value: str | None) -> str | None:
    """``value`` when it is None or a base URL (:func:`http_url_problem`); ValueError otherwise."""
    problem = http_url_problem(value) if value is not None else None
    if problem:
        raise ValueError(problem)
    return value


def key_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a profile key: list indices kept, ``model_policies[2].match``."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key = f"{key}.{part}" if key else str(part)
    return key


def format_validation_error(exc: ValidationError, where: str, model: type[BaseModel], table: str = "") -> str:
    """One line per problem: file, table and key, what was wrong, and what is accepted."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not isinstance(p, int))  # the fields, for accepted_keys
        key = key_path(err["loc"])
        full = f"{table}.{key}" if table and key else (table or key)
        if err["type"] == "extra_forbidden":
            accepted = accepted_keys(model, loc[:-1])
            lines.append(f"{where}: unknown key {full!r}; accepted keys: {accepted}")
        else:
            # the value is echoed to help: a misplaced DSN or URL must not bring its password along
            got = redact(repr(err.get("input"))[:400])[:80]
            lines.append(f"{where}: {full or '(top level)'}: {err['msg']} (got {got})")
    return "\n".join(lines)


__all__ = [
    "BOOL_NOT_NUMBER",
    "accepted_keys",
    "check_http_url",
    "format_validation_error",
    "http_url_problem",
    "key_path",
    "numeric",
    "strategy_settings_from",
]
