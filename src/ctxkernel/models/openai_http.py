"""An OpenAI-compatible chat-completions client (OpenAI, DeepSeek, vLLM, llama.cpp, Ollama...).

It runs on httpx (a pooled, synchronous :class:`httpx.Client` per model), an optional dependency:
``pip install 'ctxkernel[http]'``; building a model without it raises :class:`ConfigError` saying
so. Asyncio harnesses run it in a thread (:class:`ctxkernel.loop.AsyncAgentLoop` does).

Everything the provider sends is treated as hostile (see docs/security.md, "Provider responses"):

- **No redirects.** A 3xx answer is an error naming the ``Location``'s origin (without
  credentials): following it would send the API key to wherever the server points, and turn the
  POST into a GET whose answer would be taken for the model's. Set ``base_url`` to the final address.
- **Bounded bodies.** A reply is read as a stream and refused past ``max_response_bytes``
  (default 16 MiB); an error body is read up to 64 KiB and the rest dropped. The request asks for
  ``Accept-Encoding: identity`` and a compressed reply is refused, so the cap counts real bytes.
- **A whole-request deadline.** ``timeout`` bounds one attempt from connect to the last byte:
  every socket wait is cut at the deadline (:mod:`._transport`), not only each read.
- **Bounded parsing.** Error text is parsed from its first 4,096 characters with patterns whose
  numbers are bounded, so no error body can make the classification slow.
- **No secrets in errors.** Messages, ``body`` excerpts and the URL shown are redacted
  (:mod:`ctxkernel.redact`), and the exact credentials the model sends (its key, credential
  headers, a password in ``base_url``) are taken out of every error it raises or logs, whatever
  their shape.

Errors are classified so that strategies can react (docs/design/host-model.md §3, overflow retry):

- the provider says the prompt does not fit (HTTP 413, or HTTP 400 with a code such as
  ``context_length_exceeded`` or a message like "maximum context length" / "prompt is too
  long") → :class:`ctxkernel.ContextOverflowError`, with the prompt size and limit when the
  message states them; never retried unchanged;
- anything else → :class:`HTTPModelError` (a :class:`ctxkernel.ModelError`) carrying the
  status, a redacted excerpt of the body and ``retryable``. Retried ``max_retries`` times first,
  with exponential backoff (``Retry-After`` honoured up to 60 s): rate limits and transient
  server errors (429, 500, 502, 503, 504), connection failures, timeouts and the deadline, and
  malformed HTTP (a truncated body, a bad status line, oversized or too many header bytes).
  Not retried: other statuses, redirects, a reply over the size cap, a compressed reply, an
  unreadable 200 body, a request httpx refuses to send.

No transport failure escapes as anything but a :class:`ModelError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Self

import orjson

from ..convert import from_openai_message, to_openai_messages
from ..errors import ConfigError, ContextOverflowError, ModelError
from ..jsonbytes import loads
from ..logging import get_logger
from ..messages import Message, Source
from ..redact import Scrubber, redact, redact_url, secret_header_values, url_origin
from ..settings_check import http_url_problem
from .base import Reply

if TYPE_CHECKING:
    import httpx

    from ..profile import SummarizerSettings

log = get_logger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: statuses worth retrying unchanged: rate limits and transient server trouble
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: error codes providers use for "the prompt does not fit"
OVERFLOW_CODES = frozenset(
    {"context_length_exceeded", "context_window_exceeded", "prompt_too_long", "request_too_large"}
)
_OVERFLOW_MESSAGE = re.compile(
    r"maximum context length|context length|context window|prompt is too long|too many tokens|"
    r"input is too long|exceeds? the (?:model's )?(?:maximum|context)|reduce the length",
    re.IGNORECASE,
)
#: default cap on a successful reply body (a long completion is well under 1 MiB)
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: how much of an error body is read; only an excerpt and the error fields are needed
ERROR_BODY_BYTES = 64 * 1024
#: how much error text the overflow patterns look at
PARSE_CHARS = 4096
#: longest Retry-After honoured, in seconds
MAX_RETRY_AFTER = 60.0
_BODY_EXCERPT = 500
#: a number in an overflow message: bounded, so a run of 200k digits costs no more than a short one
_NUMBER = r"(\d[\d,]{0,15})"


class HTTPModelError(ModelError):
    """A provider call failed for a reason other than context overflow.

    ``status`` is the HTTP status (None for transport failures); ``body`` a redacted excerpt of
    the response body; ``code`` the provider's error code when it sent one; ``retryable`` whether
    the adapter's retry policy retries it.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str = "",
        code: str | None = None,
        retryable: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.code = code
        self.retryable = retryable
        super().__init__(redact(message))


def classify_http_error(status: int, body: bytes, *, url: str = "") -> ModelError:
    """The kernel error for a failed response: :class:`ContextOverflowError` when the provider
    says the prompt does not fit, otherwise :class:`HTTPModelError`. Only the first
    :data:`ERROR_BODY_BYTES` of ``body`` are looked at; the texts it carries are redacted."""
    text = body[:ERROR_BODY_BYTES].decode("utf-8", "replace")
    message, code = _error_fields(text)
    message = message[:PARSE_CHARS]
    code = redact(code[:200]) if code else None
    excerpt = redact(text[: _BODY_EXCERPT * 2])[:_BODY_EXCERPT]
    where = redact_url(url) if url else "provider"
    overflow = status == 413 or (
        status == 400
        and ((code or "") in OVERFLOW_CODES or bool(_OVERFLOW_MESSAGE.search(message or text[:PARSE_CHARS])))
    )
    if overflow:
        prompt_tokens, limit = _overflow_numbers(message or text[:PARSE_CHARS])
        detail = redact(message)[:_BODY_EXCERPT] if message else (excerpt or f"HTTP {status}")
        err: ModelError = ContextOverflowError(
            redact(f"{where}: context overflow (HTTP {status}{f', {code}' if code else ''}): {detail}"),
            prompt_tokens=prompt_tokens,
            limit=limit,
        )
        err.status = status  # type: ignore[attr-defined]
        err.body = excerpt  # type: ignore[attr-defined]
        return err
    return HTTPModelError(
        f"{where}: HTTP {status}{f' ({code})' if code else ''}: {excerpt or '(empty body)'}",
        status=status,
        body=excerpt,
        code=code,
        retryable=status in RETRY_STATUSES,
    )


def _error_fields(text: str) -> tuple[str, str | None]:
    """``(message, code)`` from an OpenAI-style ``{"error": {...}}`` body (or Anthropic-style)."""
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError:
        return "", None
    error = raw.get("error", raw) if isinstance(raw, dict) else None
    if isinstance(error, str):
        return error, None
    if not isinstance(error, dict):
        return "", None
    message = error.get("message") or raw.get("message") or ""
    code = error.get("code") or error.get("type")
    return str(message), (str(code) if code is not None else None)


def _overflow_numbers(message: str) -> tuple[int | None, int | None]:
    """Prompt size and limit stated in an overflow message, when there are any.

    Handles "maximum context length is 8192 tokens. However, your messages resulted in 9000
    tokens" (OpenAI, vLLM) and "prompt is too long: 210000 tokens > 200000 maximum" (Anthropic).
    Looks at the first :data:`PARSE_CHARS` characters only.
    """
    message = message[:PARSE_CHARS]
    m = re.search(rf"(?<![\d,]){_NUMBER} tokens? > {_NUMBER}", message)
    if m:
        return _int(m.group(1)), _int(m.group(2))
    limit = re.search(rf"maximum context length is {_NUMBER}", message)
    prompt = re.search(rf"(?:resulted in|requested|you have|prompt (?:has|of)) {_NUMBER} tokens", message)
    return (_int(prompt.group(1)) if prompt else None, _int(limit.group(1)) if limit else None)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        msg = "the OpenAI-compatible HTTP adapter needs httpx, which is not installed: pip install 'ctxkernel[http]'"
        raise ConfigError(msg) from None
    return httpx


class _Refused(Exception):
    """An attempt's outcome that is already a classified error (raised inside the stream)."""

    def __init__(self, error: ModelError, retry_after: str | None = None) -> None:
        self.error = error
        self.retry_after = retry_after


class OpenAIChatModel:
    """``complete(messages, system=, tools=)`` over ``POST {base_url}/chat/completions``.

    :param model: the model name sent in the request.
    :param base_url: the API root, e.g. ``https://api.deepseek.com/v1`` or ``http://127.0.0.1:8000/v1``.
    :param api_key: sent as a bearer token; None sends no ``Authorization`` header (local servers).
    :param provider: the provider name recorded on replies and used for per-model policies.
    :param timeout: seconds one attempt may take in all, from connect to the reply's last byte.
    :param max_tokens: the output reservation sent as ``max_tokens`` (None: the server's default).
    :param send_reasoning: send earlier ``reasoning_content`` back (DeepSeek's thinking mode asks
        for it within a tool-calling turn; most providers reject or ignore it).
    :param extra_body: extra top-level request fields (``temperature``, ``tool_choice``...).
    :param headers: extra request headers.
    :param max_retries: retries of a retryable failure (see the module doc) before it is raised.
    :param backoff_seconds: first retry delay, doubled each retry.
    :param max_response_bytes: the largest reply body accepted.

    The model holds a pooled connection; :meth:`close` (or ``with``) releases it.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        provider: str = "openai",
        timeout: float = 120.0,
        max_tokens: int | None = None,
        send_reasoning: bool = False,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        max_retries: int = 2,
        backoff_seconds: float = 1.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if not model:
            msg = "OpenAIChatModel needs a model name (e.g. model='gpt-4o-mini')"
            raise ConfigError(msg)
        # the check that the flags and the profile share: a scheme, a host, a port in range, no
        # whitespace, no query or fragment (a port of 99999 failed only when connecting)
        problem = http_url_problem(base_url) if isinstance(base_url, str) else http_url_problem("")
        if problem:
            shown = repr(redact_url(base_url)) if isinstance(base_url, str) else f"a {type(base_url).__name__}"
            raise ConfigError(f"base_url {shown} {problem}")
        http = _httpx()  # not named httpx: the annotations below name the module's types
        self.model = model
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        #: the URL as messages show it (no password, no query)
        self.where = redact_url(self.url)
        try:
            parsed = http.URL(self.url)
        except http.InvalidURL as exc:
            msg = f"base_url {redact_url(base_url)!r} is not a URL ({redact(str(exc))}); write e.g. https://api.openai.com/v1"
            raise ConfigError(msg) from None
        if not timeout > 0:  # also refuses NaN
            msg = f"timeout must be a positive number of seconds, got {timeout!r}"
            raise ConfigError(msg)
        if max_response_bytes < 1:
            msg = f"max_response_bytes must be at least 1, got {max_response_bytes!r}"
            raise ConfigError(msg)
        self.api_key = api_key
        self._password = parsed.password or None
        self.timeout = float(timeout)
        self.max_tokens = max_tokens
        self.send_reasoning = send_reasoning
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_response_bytes = max_response_bytes
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: SummarizerSettings, **kwargs: Any) -> OpenAIChatModel:
        """Build the profile's ``[summarizer]`` model (``kind = "openai"``).

        The key is read from the environment variable named by ``api_key_env``; it may be unset
        only for a server other than api.openai.com (local servers usually need none).
        """
        if not settings.model:
            msg = "[summarizer] kind = 'openai' needs 'model' (the model name to call); set summarizer.model"
            raise ConfigError(msg)
        base_url = settings.base_url or DEFAULT_BASE_URL
        api_key = os.environ.get(settings.api_key_env) or None
        if api_key is None and base_url.rstrip("/") == DEFAULT_BASE_URL:
            msg = (
                f"[summarizer] calls {DEFAULT_BASE_URL} but the environment variable {settings.api_key_env} "
                "is not set; export the key or set summarizer.api_key_env to the variable that holds it"
            )
            raise ConfigError(msg)
        provider = kwargs.pop("provider", None) or _provider_from_url(base_url)
        return cls(
            settings.model,
            base_url=base_url,
            api_key=api_key,
            provider=provider,
            timeout=settings.timeout_seconds,
            **kwargs,
        )

    # -- the connection -----------------------------------------------------------------------
    def _http(self) -> httpx.Client:
        with self._client_lock:
            if self._client is None:
                from ._transport import new_client

                self._client = new_client(self.url)
            return self._client

    def close(self) -> None:
        """Close the pooled connections (a later call opens new ones)."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # copies and pickles get their own connection pool
        state = dict(self.__dict__)
        state["_client"] = None
        state.pop("_client_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    @property
    def _scrub(self) -> Scrubber:
        """What a provider may echo of the credentials this model sends (its key, its credential
        headers, a password in ``base_url``), to take out of every error; read at each use, so a
        key changed on the model is scrubbed too."""
        return Scrubber([self.api_key, *secret_header_values(self.headers), self._password])

    # -- the call -----------------------------------------------------------------------------
    def request_body(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(messages, system=system, reasoning_content=self.send_reasoning),
        }
        if tools:
            body["tools"] = tools
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        """Send one request; raises :class:`ContextOverflowError` or :class:`HTTPModelError`."""
        payload = orjson.dumps(self.request_body(messages, system=system, tools=tools))
        raw = self._post(payload)
        return self.parse_response(raw)

    def _post(self, payload: bytes) -> dict[str, Any]:
        # identity: the size cap must count the bytes that are parsed, not compressed ones
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            **self.headers,
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            try:
                status, body = self._attempt(payload, headers)
            except _Refused as refused:
                error = self._scrubbed(refused.error)
                if getattr(error, "retryable", False) and attempt < self.max_retries:
                    attempt += 1
                    log.warning(
                        "model request failed; retrying",
                        provider=self.provider,
                        url=self.where,
                        attempt=attempt,
                        error=str(error),
                    )
                    self._sleep(attempt, refused.retry_after)
                    continue
                if isinstance(error, HTTPModelError) and error.status is None:  # no answer: say how often it was tried
                    detail = str(error).removeprefix(f"{self.where}: ")
                    error = HTTPModelError(
                        f"{self.where}: request failed after {attempt + 1} attempt(s): {detail}",
                        retryable=error.retryable,
                    )
                raise error from None
            try:
                return self._json_object(status, body)
            except ModelError as error:
                raise self._scrubbed(error) from None

    def _attempt(self, payload: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """One POST under the whole-request deadline: ``(status, body)`` of a 2xx answer, or
        :class:`_Refused` carrying the classified error."""
        httpx = _httpx()
        from ._transport import deadline

        timeout = httpx.Timeout(self.timeout)
        with deadline(self.timeout) as at:
            try:
                with self._http().stream(
                    "POST", self.url, content=payload, headers=headers, timeout=timeout
                ) as response:
                    status = response.status_code
                    if 300 <= status < 400:
                        raise _Refused(self._redirect_error(response))
                    if status >= 400:
                        body = self._scrub.bytes(self._read(response, ERROR_BODY_BYTES, at, truncate=True))
                        raise _Refused(
                            classify_http_error(status, body, url=self.url), response.headers.get("Retry-After")
                        )
                    return status, self._read(response, self.max_response_bytes, at, truncate=False)
            except _Refused:
                raise
            except httpx.TimeoutException as exc:
                raise _Refused(
                    self._transport_error(
                        exc, f"no complete answer within the {self.timeout:g} s timeout", retryable=True
                    )
                ) from None
            except (httpx.LocalProtocolError, httpx.UnsupportedProtocol) as exc:
                # the request itself cannot be sent (a bad header value, a scheme httpx refuses)
                raise _Refused(self._transport_error(exc, "the request could not be sent", retryable=False)) from None
            except httpx.TransportError as exc:
                # connection refused/reset, a truncated body, a bad status line, oversized headers...
                raise _Refused(self._transport_error(exc, "transport failure", retryable=True)) from None
            except httpx.HTTPError as exc:
                raise _Refused(self._transport_error(exc, "unreadable answer", retryable=False)) from None
            except Exception as exc:  # a provider must never raise into the harness: logged, then classified
                log.exception("model request failed unexpectedly", provider=self.provider, url=self.where)
                raise _Refused(self._transport_error(exc, "unexpected failure", retryable=False)) from None

    def _read(self, response: httpx.Response, limit: int, at: float, *, truncate: bool) -> bytes:
        """The body, at most ``limit`` bytes: an error body is cut there (``truncate``), a reply
        over it is refused. The deadline is also checked between chunks."""
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity") and not truncate:
            msg = (
                f"{self.where}: HTTP {response.status_code} with Content-Encoding {encoding[:40]!r} although the request "
                "asked for identity; compressed replies are refused because their size cannot be bounded before "
                "decompressing. Fix: configure the server or proxy to honour Accept-Encoding"
            )
            raise _Refused(HTTPModelError(msg, status=response.status_code))
        declared = response.headers.get("Content-Length", "")
        if not truncate and declared.isdigit() and int(declared) > limit:
            raise _Refused(self._too_large(response.status_code, f"declares {int(declared)} bytes"))
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_raw():
            size += len(chunk)
            if size > limit:
                if truncate:
                    chunks.append(chunk[: limit - (size - len(chunk))])
                    break
                raise _Refused(self._too_large(response.status_code, f"sent more than {limit} bytes"))
            chunks.append(chunk)
            if time.monotonic() > at:
                error = self._transport_error(
                    TimeoutError("deadline"),
                    f"no complete answer within the {self.timeout:g} s timeout",
                    retryable=True,
                )
                raise _Refused(error)
        return b"".join(chunks)

    def _too_large(self, status: int, what: str) -> HTTPModelError:
        msg = (
            f"{self.where}: HTTP {status} reply {what}, over the limit of {self.max_response_bytes} bytes "
            "(max_response_bytes); the rest was not read and the reply was dropped"
        )
        return HTTPModelError(msg, status=status)

    def _redirect_error(self, response: httpx.Response) -> HTTPModelError:
        location = response.headers.get("Location", "")
        target = url_origin(location) or ("a path on the same server" if location else "no Location")
        msg = (
            f"{self.where}: HTTP {response.status_code} redirect to {target}; redirects are not followed for a model "
            "request (the API key would go to the new address, and after a 301, 302 or 303 the POST would become "
            "a GET whose answer would be taken for the model's). "
            "Fix: set base_url to the address the provider redirects to, if you trust it"
        )
        return HTTPModelError(msg, status=response.status_code)

    def _transport_error(self, exc: BaseException, what: str, *, retryable: bool) -> HTTPModelError:
        detail = str(exc)[:_BODY_EXCERPT] or type(exc).__name__
        return HTTPModelError(f"{self.where}: {what} ({type(exc).__name__}: {detail})", retryable=retryable)

    def _json_object(self, status: int, body: bytes) -> dict[str, Any]:
        try:
            raw = loads(body)  # a lone surrogate escape is read, as U+FFFD
        except orjson.JSONDecodeError:
            head = self._scrub.bytes(body[:ERROR_BODY_BYTES])
            excerpt = redact(head[: _BODY_EXCERPT * 2].decode("utf-8", "replace"))[:_BODY_EXCERPT]
            msg = f"{self.where}: HTTP {status} but the body is not JSON: {excerpt!r}"
            raise HTTPModelError(msg, status=status, body=excerpt) from None
        if not isinstance(raw, dict):
            msg = f"{self.where}: expected a JSON object, got {type(raw).__name__}"
            raise HTTPModelError(msg, status=status)
        return raw

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff_seconds * 2 ** (attempt - 1)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(retry_after[:32]), MAX_RETRY_AFTER))
        if delay > 0:
            time.sleep(delay)

    def _scrubbed(self, error: ModelError) -> ModelError:
        """``error`` with this model's exact credentials taken out of its message, body and code."""
        if self._scrub:
            error.args = tuple(self._scrub.text(a) if isinstance(a, str) else a for a in error.args)
            for name in ("body", "code"):
                value = getattr(error, name, None)
                if isinstance(value, str):
                    setattr(error, name, self._scrub.text(value))
        return error

    def parse_response(self, raw: dict[str, Any]) -> Reply:
        """A chat-completions response as a :class:`Reply` (message, normalised usage)."""
        try:
            return self._parse_response(raw)
        except ModelError as error:
            raise self._scrubbed(error) from None

    def _parse_response(self, raw: dict[str, Any]) -> Reply:
        from ..convert import normalize_usage

        if isinstance(raw.get("error"), (dict, str)):
            # some servers answer 200 with an error object
            error = classify_http_error(400, self._scrub.bytes(orjson.dumps(raw)), url=self.url)
            raise error
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            head = self._scrub.bytes(orjson.dumps(raw)[:ERROR_BODY_BYTES])
            excerpt = redact(head[: _BODY_EXCERPT * 2].decode("utf-8", "replace"))[:_BODY_EXCERPT]
            msg = f"{self.where}: response has no choices: {excerpt}"
            raise HTTPModelError(msg)
        choice = choices[0]
        message_raw = choice.get("message")
        if not isinstance(message_raw, dict):
            msg = f"{self.where}: choices[0] has no message object"
            raise HTTPModelError(msg)
        try:
            parsed = from_openai_message({**message_raw, "role": "assistant"}, where=f"{self.where} reply")
        except ModelError:
            raise
        except Exception as exc:  # an EventError: the server sent a malformed message
            raise HTTPModelError(f"{self.where}: unreadable reply message: {str(exc)[:_BODY_EXCERPT]}") from None
        assert parsed is not None
        # the model name is recorded on the message's source: only a plausible name is taken
        named = raw.get("model")
        model = named if isinstance(named, str) and 0 < len(named) <= 200 else self.model
        message = Message(parsed.role, parsed.content, Source(kind="model", provider=self.provider, model=model))
        try:
            usage = normalize_usage(raw.get("usage"))
        except Exception as exc:  # a provider's malformed usage must not lose the reply
            log.warning(
                "provider usage unreadable; the reply is kept without it",
                provider=self.provider,
                url=self.where,
                error=self._scrub.text(str(exc)[:_BODY_EXCERPT]),
            )
            usage = None
        finish = choice.get("finish_reason")
        return Reply(message, usage, self.provider, model, raw={"finish_reason": finish, "id": raw.get("id")})


def _provider_from_url(base_url: str) -> str:
    host = re.sub(r"^[a-z]+://", "", base_url).split("/")[0].split(":")[0].lower()
    for name in ("openai", "deepseek", "anthropic", "mistral", "groq", "together", "openrouter", "fireworks"):
        if name in host:
            return name
    return "openai-compatible"
