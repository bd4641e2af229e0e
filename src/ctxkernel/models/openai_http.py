"""An OpenAI-compatible chat-completions client (OpenAI, DeepSeek, vLLM, llama.cpp, Ollama...).

It uses only the standard library (:mod:`urllib.request`): one blocking POST per request is all
the kernel needs, and a required HTTP dependency would be paid by every installation, including
those that never call a model from the kernel. Asyncio harnesses run it in a thread
(:class:`ctxkernel.loop.AsyncAgentLoop` does).

Errors are classified so that strategies can react (HOST-MODEL §3, overflow retry):

- the provider says the prompt does not fit (HTTP 413, or HTTP 400 with a code such as
  ``context_length_exceeded`` or a message like "maximum context length" / "prompt is too
  long") → :class:`ctxkernel.ContextOverflowError`, with the prompt size and limit when the
  message states them;
- anything else (other statuses, network failures, unreadable bodies) → :class:`HTTPModelError`
  (a :class:`ctxkernel.ModelError`) carrying the status and an excerpt of the body.
  Rate limits and transient server errors (429, 500, 502, 503, 504) and connection failures are
  retried ``max_retries`` times first.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import orjson

from ..convert import from_openai_message, to_openai_messages
from ..errors import ConfigError, ContextOverflowError, ModelError
from ..messages import Message, Source
from .base import Reply

if TYPE_CHECKING:
    from ..profile import SummarizerSettings

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: statuses worth retrying unchanged: rate limits and transient server trouble
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: error codes providers use for "the prompt does not fit"
OVERFLOW_CODES = frozenset({"context_length_exceeded", "context_window_exceeded", "prompt_too_long", "request_too_large"})
_OVERFLOW_MESSAGE = re.compile(
    r"maximum context length|context length|context window|prompt is too long|too many tokens|"
    r"input is too long|exceeds? the (?:model's )?(?:maximum|context)|reduce the length",
    re.IGNORECASE,
)
_BODY_EXCERPT = 500


class HTTPModelError(ModelError):
    """A provider call failed for a reason other than context overflow.

    ``status`` is the HTTP status (None for network failures); ``body`` an excerpt of the
    response body; ``code`` the provider's error code when it sent one.
    """

    def __init__(self, message: str, *, status: int | None = None, body: str = "", code: str | None = None) -> None:
        self.status = status
        self.body = body
        self.code = code
        super().__init__(message)


def classify_http_error(status: int, body: bytes, *, url: str = "") -> ModelError:
    """The kernel error for a failed response: :class:`ContextOverflowError` when the provider
    says the prompt does not fit, otherwise :class:`HTTPModelError`."""
    text = body.decode("utf-8", "replace")
    message, code = _error_fields(text)
    excerpt = text[:_BODY_EXCERPT]
    overflow = status == 413 or (
        status == 400 and ((code or "") in OVERFLOW_CODES or bool(_OVERFLOW_MESSAGE.search(message or text)))
    )
    if overflow:
        prompt_tokens, limit = _overflow_numbers(message or text)
        detail = message or excerpt or f"HTTP {status}"
        err: ModelError = ContextOverflowError(
            f"{url or 'provider'}: context overflow (HTTP {status}{f', {code}' if code else ''}): {detail}",
            prompt_tokens=prompt_tokens,
            limit=limit,
        )
        err.status = status  # type: ignore[attr-defined]
        err.body = excerpt  # type: ignore[attr-defined]
        return err
    return HTTPModelError(
        f"{url or 'provider'}: HTTP {status}{f' ({code})' if code else ''}: {excerpt or '(empty body)'}",
        status=status,
        body=excerpt,
        code=code,
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
    """
    m = re.search(r"(\d[\d,]*) tokens? > (\d[\d,]*)", message)
    if m:
        return _int(m.group(1)), _int(m.group(2))
    limit = re.search(r"maximum context length is (\d[\d,]*)", message)
    prompt = re.search(r"(?:resulted in|requested|you have|prompt (?:has|of)) (\d[\d,]*) tokens", message)
    return (_int(prompt.group(1)) if prompt else None, _int(limit.group(1)) if limit else None)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


class OpenAIChatModel:
    """``complete(messages, system=, tools=)`` over ``POST {base_url}/chat/completions``.

    :param model: the model name sent in the request.
    :param base_url: the API root, e.g. ``https://api.deepseek.com/v1`` or ``http://127.0.0.1:8000/v1``.
    :param api_key: sent as a bearer token; None sends no ``Authorization`` header (local servers).
    :param provider: the provider name recorded on replies and used for per-model policies.
    :param max_tokens: the output reservation sent as ``max_tokens`` (None: the server's default).
    :param send_reasoning: send earlier ``reasoning_content`` back (DeepSeek's thinking mode asks
        for it within a tool-calling turn; most providers reject or ignore it).
    :param extra_body: extra top-level request fields (``temperature``, ``tool_choice``...).
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
    ) -> None:
        if not model:
            msg = "OpenAIChatModel needs a model name (e.g. model='gpt-4o-mini')"
            raise ConfigError(msg)
        self.model = model
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.api_key = api_key
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.send_reasoning = send_reasoning
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds

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

    # -- the call -----------------------------------------------------------------------------
    def request_body(self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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

    def complete(self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None) -> Reply:
        """Send one request; raises :class:`ContextOverflowError` or :class:`HTTPModelError`."""
        payload = orjson.dumps(self.request_body(messages, system=system, tools=tools))
        raw = self._post(payload)
        return self.parse_response(raw)

    def _post(self, payload: bytes) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            request = urllib.request.Request(self.url, data=payload, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                    status = response.status
            except urllib.error.HTTPError as exc:
                body = exc.read() or b""
                error = classify_http_error(exc.code, body, url=self.url)
                if exc.code in RETRY_STATUSES and attempt < self.max_retries:
                    attempt += 1
                    self._sleep(attempt, exc.headers.get("Retry-After") if exc.headers else None)
                    continue
                raise error from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt < self.max_retries:
                    attempt += 1
                    self._sleep(attempt, None)
                    continue
                reason = getattr(exc, "reason", exc)
                raise HTTPModelError(f"{self.url}: request failed after {attempt + 1} attempt(s): {reason}") from None
            try:
                raw = orjson.loads(body)
            except orjson.JSONDecodeError:
                excerpt = body[:_BODY_EXCERPT].decode("utf-8", "replace")
                msg = f"{self.url}: HTTP {status} but the body is not JSON: {excerpt!r}"
                raise HTTPModelError(msg, status=status, body=excerpt) from None
            if not isinstance(raw, dict):
                msg = f"{self.url}: expected a JSON object, got {type(raw).__name__}"
                raise HTTPModelError(msg, status=status)
            return raw

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff_seconds * 2 ** (attempt - 1)
        if retry_after:
            try:
                delay = max(delay, min(float(retry_after), 60.0))
            except ValueError:
                pass
        if delay > 0:
            time.sleep(delay)

    def parse_response(self, raw: dict[str, Any]) -> Reply:
        """A chat-completions response as a :class:`Reply` (message, normalised usage)."""
        from ..session import normalize_usage

        if isinstance(raw.get("error"), (dict, str)):
            # some servers answer 200 with an error object
            error = classify_http_error(400, orjson.dumps(raw), url=self.url)
            raise error
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            msg = f"{self.url}: response has no choices: {orjson.dumps(raw)[:_BODY_EXCERPT].decode('utf-8', 'replace')}"
            raise HTTPModelError(msg)
        choice = choices[0]
        message_raw = choice.get("message")
        if not isinstance(message_raw, dict):
            msg = f"{self.url}: choices[0] has no message object"
            raise HTTPModelError(msg)
        try:
            parsed = from_openai_message({**message_raw, "role": "assistant"}, where=f"{self.url} reply")
        except ModelError:
            raise
        except Exception as exc:  # an EventError: the server sent a malformed message
            raise HTTPModelError(f"{self.url}: unreadable reply message: {exc}") from None
        assert parsed is not None
        model = str(raw.get("model") or self.model)
        message = Message(parsed.role, parsed.content, Source(kind="model", provider=self.provider, model=model))
        try:
            usage = normalize_usage(raw.get("usage"))
        except Exception:
            usage = None  # a provider's malformed usage must not lose the reply
        finish = choice.get("finish_reason")
        return Reply(message, usage, self.provider, model, raw={"finish_reason": finish, "id": raw.get("id")})


def _provider_from_url(base_url: str) -> str:
    host = re.sub(r"^[a-z]+://", "", base_url).split("/")[0].split(":")[0].lower()
    for name in ("openai", "deepseek", "anthropic", "mistral", "groq", "together", "openrouter", "fireworks"):
        if name in host:
            return name
    return "openai-compatible"
