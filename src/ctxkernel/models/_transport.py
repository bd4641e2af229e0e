"""httpx plumbing for the HTTP adapter: a pooled client whose every socket wait obeys a deadline.

httpx's timeouts bound each network operation, not the request (encode/httpx#1450): a server
that sends one byte per second, in the headers or in the body, never trips a 2 s read timeout.
httpcore lets a connection pool take a *network backend* (its public extension point); the one
here wraps the standard backend so that every connect, TLS handshake, read and write waits at most
until the deadline of the request under way in this thread (a :class:`~contextvars.ContextVar`
set by :func:`deadline`). Past it, the wait fails with httpcore's own timeout exception, which
httpx reports as :class:`httpx.TimeoutException` like any other timeout.

This module imports httpx; :mod:`ctxkernel.models.openai_http` imports it only when a model is
built, so the kernel itself does not need httpx (``pip install 'ctxkernel[http]'``).
"""

from __future__ import annotations

import contextlib
import contextvars
import ssl
import time
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

from ..logging import get_logger

log = get_logger(__name__)

#: the monotonic deadline of the request under way in this thread (None: no deadline)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("ctxkernel_http_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Bound every socket wait of this thread's requests to ``seconds`` from now (yields the
    monotonic deadline)."""
    at = time.monotonic() + seconds
    token = _DEADLINE.set(at)
    try:
        yield at
    finally:
        _DEADLINE.reset(token)


def _capped(timeout: float | None, error: type[Exception]) -> float | None:
    at = _DEADLINE.get()
    if at is None:
        return timeout
    remaining = at - time.monotonic()
    if remaining <= 0:
        msg = "the whole-request deadline passed"
        raise error(msg)
    return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _capped(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _capped(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        inner = self._stream.start_tls(ssl_context, server_hostname, _capped(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(
            host, port, _capped(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_unix_socket(path, _capped(timeout, httpcore.ConnectTimeout), socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport (pooling, TLS, proxies, exception mapping) with the deadline backend."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        pool = getattr(self, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None:  # a future httpx moved its pool: the adapter's between-chunk check still applies
            log.warning(
                "httpx transport layout not recognised; the deadline is checked between reads only",
                httpx=httpx.__version__,
            )
            return
        pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``, minus
    ``NO_PROXY``), as urllib and httpx read it. An explicit transport turns httpx's own lookup off."""
    parsed = httpx.URL(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parsed.scheme)
    if not proxy or urllib.request.proxy_bypass(parsed.host):
        return None
    return proxy


def new_client(url: str, *, max_connections: int = 20) -> httpx.Client:
    """A pooled client for one API root: redirects not followed, the
    deadline transport, the environment's proxy and CA settings."""
    transport = DeadlineTransport(
        proxy=environment_proxy(url),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        retries=0,  # the adapter retries, with its own policy and backoff
    )
    return httpx.Client(transport=transport, follow_redirects=False, trust_env=True)
