"""Redaction: keep credentials out of every message, log line, report and stored event.

One place knows what a secret looks like. :func:`redact` replaces, in any text:

- the password of a URL or DSN (``postgresql://user:PASSWORD@host/db`` → ``user:***@``);
- secret query parameters and ``key=value`` / ``"key": "value"`` pairs (``password``, ``passwd``,
  ``api_key``/``api-key``/``apikey``, ``access_token``, ``refresh_token``,
  ``auth_token``, ``secret``, ``client_secret``, ``secret_key``, ``sig``/``signature``, ``token``
  and ``key`` in a query string), including libpq's quoted ``password='a b'``;
- header values: ``Authorization``, ``Proxy-Authorization``, ``X-Api-Key``, ``Api-Key``,
  ``X-Goog-Api-Key``, ``Cookie``, ``Set-Cookie`` (``Authorization: ***``);
- ``Bearer <token>`` and ``Basic <base64>`` credentials;
- API keys by their shape: ``sk-…`` (OpenAI, DeepSeek, ``sk-proj-``, ``sk-ant-`` Anthropic,
  ``sk-or-`` OpenRouter), ``gsk_`` (Groq), ``hf_`` (Hugging Face), ``ghp_``/``gho_``/
  ``ghs_``/``github_pat_`` (GitHub), ``xox?-`` (Slack), ``AKIA…`` (AWS), ``AIza…`` (Google).

What it keeps is what a reader needs to find the problem: the scheme, user, host, port and path
of a URL, the name of the parameter or header, and a key's public prefix (``sk-ant-***``).

Every pattern is linear in its input (no nested quantifiers; each run of characters is scanned
from one anchor), so redacting a hostile provider's error body cannot hang; callers also bound
the text first (an excerpt), because redaction is applied after a body was capped, never to an
unbounded stream. :func:`redact` is idempotent: redacting twice gives the same text.

Use :func:`redact` for free text, :func:`redact_url` for a URL shown as a location (it also drops
the query), :func:`redact_headers` for a header mapping, and :func:`structlog_processor` (installed
by :func:`ctxkernel.logging.configure_logging`) for log lines.

A caller that knows the exact credentials it sent (the HTTP model adapter its key, ``serve`` the
request's and its own) also takes them out with a :class:`Scrubber`: a provider that echoes a key
in its error (``Incorrect API key provided: ...``) would otherwise put a key of a shape
:func:`redact` does not know (a Mistral key, a local server's token) in a message, a log line or
the session log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import orjson
import structlog

MASK = "***"

_SECRET_NAMES = (
    r"password|passwd|api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|auth[_-]?token|"
    r"client[_-]?secret|secret[_-]?key|secret"
)
_SECRET_HEADERS = r"proxy-authorization|authorization|x-api-key|api-key|x-goog-api-key|set-cookie|cookie"

_PATTERNS: list[tuple[re.Pattern[str], Any]] = [
    # userinfo password of a URL or DSN: scheme://user:PASSWORD@host. The password runs to the
    # last "@" before the path (an unescaped "@" in a password is common in hand-written DSNs).
    (
        re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s/:@?#]*:)(?P<secret>[^\s/?#]*)(?=@)"),
        r"\g<head>" + MASK,
    ),
    # secret query parameters: ?password=..., &api_key=..., &token=..., &sig=..., Google's ?key=...
    (
        re.compile(
            rf"(?P<head>[?&;](?:{_SECRET_NAMES}|token|sig|signature|key)=)(?P<secret>[^&#\s\"']*)", re.IGNORECASE
        ),
        r"\g<head>" + MASK,
    ),
    # header lines and JSON/dict header entries: Authorization: Bearer x, "x-api-key": "y"
    (
        re.compile(
            rf"(?P<head>\b(?:{_SECRET_HEADERS})[\"']?\s*[:=]\s*)(?P<q>[\"']?)(?P<secret>[^\r\n\"']+)", re.IGNORECASE
        ),
        r"\g<head>\g<q>" + MASK,
    ),
    # key=value / "key": "value" pairs, quoted (libpq allows \' inside; the quotes are kept) or bare
    (
        re.compile(
            rf"(?P<head>\b(?:{_SECRET_NAMES})[\"']?\s*[:=]\s*)"
            r"(?:(?P<q>[\"'])(?P<quoted>(?:(?!(?P=q))[^\\\r\n]|\\.)*)(?P=q)|(?P<secret>[^\s,;&\"'}\]]+))",
            re.IGNORECASE,
        ),
        lambda m: f"{m['head']}{m['q']}{MASK}{m['q']}" if m["q"] else f"{m['head']}{MASK}",
    ),
    # credentials of an HTTP auth scheme in free text
    (re.compile(r"(?P<head>\bBearer\s+)(?P<secret>[A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE), r"\g<head>" + MASK),
    (re.compile(r"(?P<head>\bBasic\s+)(?P<secret>(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}=*)"), r"\g<head>" + MASK),
    # API keys by shape, keeping the public prefix
    (
        re.compile(r"\b(?P<head>sk-(?:ant-(?:api\d\d-)?|proj-|or-(?:v1-)?)?+)(?P<secret>[A-Za-z0-9_-]{8,})"),
        r"\g<head>" + MASK,
    ),
    (
        re.compile(r"\b(?P<head>gsk_|hf_|ghp_|gho_|ghs_|ghu_|github_pat_)(?P<secret>[A-Za-z0-9_]{8,})"),
        r"\g<head>" + MASK,
    ),
    (re.compile(r"\b(?P<head>xox[abposr]-)(?P<secret>[A-Za-z0-9-]{8,})"), r"\g<head>" + MASK),
    (re.compile(r"\b(?P<head>AKIA)(?P<secret>[0-9A-Z]{16})\b"), r"\g<head>" + MASK),
    (re.compile(r"\b(?P<head>AIza)(?P<secret>[0-9A-Za-z_-]{35})"), r"\g<head>" + MASK),
]


def redact(text: str) -> str:
    """``text`` with every credential it recognises replaced by ``***`` (see the module doc)."""
    if not text:
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_url(url: str) -> str:
    """A URL fit to show as a location: no userinfo password, no query, no fragment."""
    base = url.split("#", 1)[0].split("?", 1)[0]
    return redact(base)


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, without userinfo, path or query ("" if it has none)."""
    match = re.match(r"\s*([A-Za-z][A-Za-z0-9+.-]{0,30})://([^/?#\s]*)", url)
    if not match:
        return ""
    authority = match.group(2).rpartition("@")[2]
    return f"{match.group(1).lower()}://{authority.lower()}"


_SECRET_HEADER = re.compile(rf"^(?:{_SECRET_HEADERS})$", re.IGNORECASE)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``headers`` with the values of credential headers masked."""
    return {name: (MASK if _SECRET_HEADER.match(name) else redact(value)) for name, value in headers.items()}


def secret_header_values(headers: Mapping[str, str]) -> list[str]:
    """The values of the credential headers among ``headers`` (``Authorization``, ``X-Api-Key``...)."""
    return [value for name, value in headers.items() if _SECRET_HEADER.match(name)]


#: a credential shorter than this is not scrubbed (see :class:`Scrubber`)
MIN_SCRUB = 4


class Scrubber:
    """Replaces each of some exact secrets with ``***`` in text and bytes.

    The secrets are credential values (a header's, a key), their token part (after ``Bearer``),
    and the same in JSON-escaped form (how a provider's JSON error body spells a key holding a
    quote or a control character, or ``/`` written ``\\/``). Secrets of fewer than
    :data:`MIN_SCRUB` characters are left: replacing ``ab`` everywhere would garble the text
    without protecting anything."""

    MASK = MASK

    def __init__(self, values: Iterable[str | None]) -> None:
        found: set[str] = set()
        for value in values:
            if not value:
                continue
            value = value.strip()
            for part in (value, value.partition(" ")[2].strip()):
                if len(part) >= MIN_SCRUB:
                    escaped = orjson.dumps(part).decode()[1:-1]
                    found.update((part, escaped, escaped.replace("/", "\\/")))
        # the longest first: a token inside its own "Bearer <token>" is replaced with it
        self.texts = sorted(found, key=len, reverse=True)
        self.raw = [t.encode("utf-8", "surrogatepass") for t in self.texts]

    def __bool__(self) -> bool:
        return bool(self.texts)

    def text(self, text: str) -> str:
        for secret in self.texts:
            if secret in text:
                text = text.replace(secret, self.MASK)
        return text

    def error(self, error: dict[str, Any]) -> dict[str, Any]:
        """An error object with each of its text fields scrubbed."""
        return {k: self.text(v) if isinstance(v, str) else v for k, v in error.items()}

    def bytes(self, data: bytes) -> bytes:
        for secret in self.raw:
            if secret in data:
                data = data.replace(secret, self.MASK.encode())
        return data


def redact_value(value: Any) -> Any:
    """For log fields: strings redacted, containers walked, numbers, booleans and None kept,
    anything else (an exception, a URL object, a path) turned into redacted text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(item) for item in value]
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return redact(str(value))


def structlog_processor(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor that redacts every field of a log line. An ``exc_info`` is rendered
    here (as structlog's ``format_exc_info`` would) so that its traceback text is redacted too."""
    if event_dict.get("exc_info"):
        event_dict = structlog.processors.format_exc_info(logger, method, event_dict)
    for key, value in list(event_dict.items()):
        event_dict[key] = redact_value(value)
    return event_dict
