"""Tenants: who a request comes from, as far as ``serve`` can tell, and what must never leak.

A *tenant* is a client credential (``Authorization``, else ``x-api-key``, as the client sent
it; clients that send neither are one tenant). ``serve`` never keeps the credential: it keeps its
*tag*, HMAC-SHA-256 under the tenant secret (:func:`tenant_secret`), so a store that leaks does
not let anyone check a guessed credential. The tag is the one thing every binding to a credential
uses: a named session (``X-Ctxkernel-Session``) belongs to the tenant that created it (another
tenant naming it gets a session of its own, ``proxy.py``), a session's fingerprint includes it
(``identity.py``) and a kept Responses API response answers only its tenant (``kept_responses.py``).

The secret is the operator's (``--tenant-secret-env NAME``: the same for every host that serves
one store, never written anywhere), else 32 random bytes made once per store and kept in its
key-value table (namespace ``serve``, key ``tenant-secret``).

:class:`ctxkernel.redact.Scrubber` removes a request's exact credentials (the client's and the server's
``--api-key-env`` key) from any text ``serve`` stores, logs or passes back: a provider that
echoes a key in its error (``Incorrect API key provided: ...``) would otherwise put it in the
session log, where :func:`ctxkernel.redact.redact` only finds keys of known shapes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any

from ..errors import CtxKernelError, StoreError
from ..store.base import EventStore

#: the store's key-value namespace and key of the tenant secret serve makes
SECRET_NAMESPACE = "serve"
SECRET_KEY = "tenant-secret"
#: the fewest characters an operator's secret may have (a shorter one is a usage error)
MIN_SECRET_CHARS = 32
#: how long a process waits for another that is making the store's secret
MAKE_SECRET_SECONDS = 30.0


def credential_of(headers: Mapping[str, str]) -> str:
    """The client's credential as it sent it: ``Authorization``, else ``x-api-key``, else ''."""
    return headers.get("authorization") or headers.get("x-api-key") or ""


def tenant_of(secret: bytes, credential: str) -> str:
    """The tenant a credential stands for, its tag: HMAC-SHA-256 under ``secret``, 64 hex digits."""
    return hmac.new(secret, credential.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def same_tenant(stored: Any, tenant: str) -> bool:
    """Whether a tag read from the store is ``tenant`` (compared in constant time)."""
    return isinstance(stored, str) and hmac.compare_digest(stored, tenant)


def secret_from_env(env: str) -> bytes:
    """The operator's tenant secret, the value of ``$env``: at least :data:`MIN_SECRET_CHARS`
    characters (a short one would let a leaked store's tags be tested against guesses)."""
    value = os.environ.get(env)
    if not value:
        msg = f"--tenant-secret-env {env}: the variable is not set or empty"
        raise CtxKernelError(msg)
    if len(value) < MIN_SECRET_CHARS:
        msg = (
            f"--tenant-secret-env {env}: the secret has {len(value)} characters; it needs at least "
            f"{MIN_SECRET_CHARS} characters (for example the output of `openssl rand -hex 32`)"
        )
        raise CtxKernelError(msg)
    return value.encode("utf-8", "surrogatepass")


def tenant_secret(store: EventStore, env: str | None = None) -> bytes:
    """The key of the tenant tags: the value of ``$env`` when given (never stored), else the
    store's own, made on first use under the store's lease so that every process of one store,
    and every restart, tags alike."""
    if env:
        return secret_from_env(env)
    found = _stored_secret(store)
    if found is not None:
        return found
    token = secrets.token_hex(16)
    holder = {"token": token, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    lease = f"{SECRET_NAMESPACE}/{SECRET_KEY}"
    deadline = time.monotonic() + MAKE_SECRET_SECONDS
    while True:
        if store.lease_acquire(lease, holder, MAKE_SECRET_SECONDS).acquired:
            try:
                found = _stored_secret(store)
                if found is None:
                    store.kv_put(SECRET_NAMESPACE, SECRET_KEY, {"key": secrets.token_hex(32)})
                    found = _stored_secret(store)
            finally:
                store.lease_release(lease, token)
        else:  # another process is making it
            found = _stored_secret(store)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            msg = f"serve: the tenant secret ({lease}) could not be made in {MAKE_SECRET_SECONDS:g} s"
            raise StoreError(msg)
        time.sleep(0.05)


def _stored_secret(store: EventStore) -> bytes | None:
    found = store.kv_get(SECRET_NAMESPACE, SECRET_KEY)
    if found is None:
        return None
    value = found.get("key") if isinstance(found, dict) else None
    try:
        if isinstance(value, str) and len(value) == 64:
            return bytes.fromhex(value)
    except ValueError:
        pass
    msg = (
        f"serve: the stored tenant secret ({SECRET_NAMESPACE}/{SECRET_KEY}) is damaged; delete it to make a new "
        "one (every named session and kept response then starts afresh)"
    )
    raise StoreError(msg)
