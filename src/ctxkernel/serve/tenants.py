"""Tenants: who a request comes from, as far as ``serve`` can tell, and what must never leak.

A *tenant* is a client credential (``Authorization``, else ``x-api-key``, as the client sent
it). ``serve`` never keeps the credential: it keeps a keyed hash of it, HMAC-SHA-256 under the
process's tenant secret (:func:`tenant_secret`), so a store that leaks does not let anyone check
a guessed credential. A named session (``X-Ctxkernel-Session``) belongs to the tenant that
created it; another tenant naming it gets a session of its own (``proxy.py``).

:class:`Scrubber` removes a request's exact credentials (the client's and the server's
``--api-key-env`` key) from any text ``serve`` stores, logs or passes back: a provider that
echoes a key in its error (``Incorrect API key provided: ...``) would otherwise put it in the
session log, where :func:`ctxkernel.redact.redact` only finds keys of known shapes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from ..errors import CtxKernelError
from ..store.base import EventStore

#: the store's key-value namespace and key of the generated tenant secret
SECRET_NAMESPACE = "serve"
SECRET_KEY = "tenant-secret"
#: a credential shorter than this is scrubbed too, but only where it stands alone (see Scrubber)
MIN_SCRUB = 4


def credential_of(headers: Mapping[str, str]) -> str:
    """The client's credential as it sent it: ``Authorization``, else ``x-api-key``, else ''."""
    return headers.get("authorization") or headers.get("x-api-key") or ""


def tenant_of(secret: bytes, credential: str) -> str:
    """The tenant a credential stands for: 32 hex digits of HMAC-SHA-256 under ``secret``."""
    return hmac.new(secret, credential.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]


def tenant_secret(store: EventStore, env: str | None = None) -> bytes:
    """The key of the tenant hashes: the value of ``$env`` when given (the operator's; the same
    for every host that serves one store), else one made at random on first use and kept in the
    store's key-value table, so every worker and every restart hashes alike."""
    if env:
        value = os.environ.get(env)
        if not value:
            msg = f"--tenant-secret-env {env}: the variable is not set or empty"
            raise CtxKernelError(msg)
        return value.encode()
    found = store.kv_get(SECRET_NAMESPACE, SECRET_KEY)
    if isinstance(found, dict) and isinstance(found.get("hex"), str):
        return bytes.fromhex(found["hex"])
    # made once per store: under the store's lease, so two processes starting at once agree
    token = uuid.uuid4().hex
    holder = {"token": token, "host": os.uname().nodename, "pid": os.getpid(), "started": time.time()}
    deadline = time.monotonic() + 30
    while not store.lease_acquire("serve-tenant-secret", holder, 30).acquired:
        if time.monotonic() > deadline:
            msg = "could not take the store's lease serve-tenant-secret within 30 s to make the tenant secret"
            raise CtxKernelError(msg)
        time.sleep(0.05)
    try:
        found = store.kv_get(SECRET_NAMESPACE, SECRET_KEY)
        if not (isinstance(found, dict) and isinstance(found.get("hex"), str)):
            found = {"hex": secrets.token_hex(32)}
            store.kv_put(SECRET_NAMESPACE, SECRET_KEY, found)
    finally:
        store.lease_release("serve-tenant-secret", token)
    return bytes.fromhex(found["hex"])


class Scrubber:
    """Replaces each of a request's exact secrets with ``***`` in text and bytes.

    The secrets are the credential headers' values, their token part (after ``Bearer``), and
    the same in JSON-escaped form (how a provider's JSON error body spells a key holding ``/``).
    Secrets of fewer than :data:`MIN_SCRUB` characters are left: replacing ``ab`` everywhere
    would garble the text without protecting anything."""

    MASK = "***"

    def __init__(self, values: Iterable[str | None]) -> None:
        found: set[str] = set()
        for value in values:
            if not value:
                continue
            value = value.strip()
            for part in (value, value.partition(" ")[2].strip()):
                if len(part) >= MIN_SCRUB:
                    found.add(part)
                    found.add(orjson.dumps(part).decode()[1:-1])
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
