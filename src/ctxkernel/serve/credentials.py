"""Which credential a request came with, as a keyed hash: what ``serve`` binds a tenant's stored
state to, so that another credential cannot read it.

A request's credential is its ``Authorization`` header, else its ``x-api-key`` (empty when it
sent neither: such clients all share one tag). Its *tag* is HMAC-SHA256 of that value under a
32-byte key ``serve`` keeps in the store's key-value table (namespace ``serve``, key
``credential-key``), made once by the first process that needs it (under a store lease, so that
the processes of one store agree on it). The credential itself is never stored; its tag is, and
without the key a tag cannot be tested against a guessed credential.
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

from ..errors import StoreError

#: the headers a client's credential is read from, in order
CREDENTIAL_HEADERS = ("authorization", "x-api-key")
NAMESPACE = "serve"
KEY_NAME = "credential-key"
#: how long a process waits for another that is making the key
MAKE_KEY_SECONDS = 30.0


def client_credential(headers: Mapping[str, str]) -> str:
    """The credential a request carries (``""`` when none)."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return ""


class CredentialTags:
    """Tags of client credentials under one key (:meth:`from_store` finds or makes it)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            msg = "the credential key must have at least 32 bytes"
            raise ValueError(msg)
        self._key = key

    def tag(self, headers: Mapping[str, str]) -> str:
        """The tag of the credential ``headers`` carry: 64 hex digits."""
        credential = client_credential(headers).encode("utf-8", "surrogatepass")
        return hmac.new(self._key, credential, hashlib.sha256).hexdigest()

    @staticmethod
    def same(a: Any, b: str) -> bool:
        """Whether a stored tag ``a`` is ``b`` (compared in constant time)."""
        return isinstance(a, str) and hmac.compare_digest(a, b)

    @classmethod
    def from_store(cls, store: Any) -> CredentialTags:
        """The store's key, made now when it has none."""
        key = _stored_key(store)
        if key is not None:
            return cls(key)
        token = secrets.token_hex(16)
        holder = {"token": token, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        lease = f"{NAMESPACE}/{KEY_NAME}"
        deadline = time.monotonic() + MAKE_KEY_SECONDS
        while True:
            if store.lease_acquire(lease, holder, MAKE_KEY_SECONDS).acquired:
                try:
                    key = _stored_key(store)
                    if key is None:
                        store.kv_put(NAMESPACE, KEY_NAME, {"key": secrets.token_hex(32)})
                        key = _stored_key(store)
                finally:
                    store.lease_release(lease, token)
            else:  # another process is making it
                key = _stored_key(store)
            if key is not None:
                return cls(key)
            if time.monotonic() > deadline:
                msg = f"serve: the credential key ({NAMESPACE}/{KEY_NAME}) could not be made in {MAKE_KEY_SECONDS:g} s"
                raise StoreError(msg)
            time.sleep(0.05)


def _stored_key(store: Any) -> bytes | None:
    found = store.kv_get(NAMESPACE, KEY_NAME)
    value = found.get("key") if isinstance(found, dict) else None
    if found is not None and not (isinstance(value, str) and len(value) == 64):
        msg = f"serve: the stored credential key ({NAMESPACE}/{KEY_NAME}) is damaged; delete it to make a new one"
        raise StoreError(msg)
    if value is None:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        msg = f"serve: the stored credential key ({NAMESPACE}/{KEY_NAME}) is not hex; delete it to make a new one"
        raise StoreError(msg) from None
