"""Which session a request belongs to.

1. The header ``X-Ctxkernel-Session: <id>`` names it. The id is checked like any session id
   (1-128 letters, digits, ``.``, ``_``, ``-``); a bad one is a 400.
2. Without the header, a fingerprint picks it: ``fp-`` followed by the first 32 hex digits of
   SHA-256 over the API name, a SHA-256 of the client's credential (``Authorization`` or
   ``x-api-key``), the system prompt and the first user message. Two tenants (two credentials)
   never share a session; one client that starts a new conversation (another first message)
   gets a new session; one that continues a conversation finds it again. The credential itself
   is never stored: only this hash of a hash is.

The key maps to the session's id in the store (the first session of a key has the key as its
id); a fork or a strategy's switch to a child session moves the mapping (``proxy.py``).

A key belongs to the tenant (``tenants.py``) whose request first used it; another tenant that
names it is given a key of its own (:func:`tenant_key`), so it never reads or appends to the
first tenant's session.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import StoreError
from ..messages import Message
from ..store.base import check_session_id
from .tenants import credential_of, tenant_of
from .wire import WireError

SESSION_HEADER = "x-ctxkernel-session"


@dataclass(frozen=True)
class Identity:
    """Who a request comes from and which session key it asks for."""

    key: str
    #: the keyed hash of the client's credential (tenants.tenant_of)
    tenant: str


def identify(headers: Mapping[str, str], api: str, system: str, messages: list[Message], secret: bytes) -> Identity:
    """The request's session key and tenant (a 400 for a malformed session header)."""
    return Identity(session_key(headers, api, system, messages), tenant_of(secret, credential_of(headers)))


def tenant_key(secret: bytes, key: str, tenant: str) -> str:
    """The key under which ``tenant`` has its own session of the name ``key`` another tenant
    holds: the name (cut to 90 characters) and 32 hex digits that only the secret's holder can
    compute, so nobody can name it in advance."""
    digest = hmac.new(secret, f"{tenant}\0{key}".encode(), hashlib.sha256).hexdigest()[:32]
    return check_session_id(f"{key[:90]}-t{digest}")


def session_key(headers: Mapping[str, str], api: str, system: str, messages: list[Message]) -> str:
    named = headers.get(SESSION_HEADER)
    if named is not None:
        try:
            return check_session_id(named.strip())
        except StoreError as exc:
            raise WireError(400, f"X-Ctxkernel-Session: {exc}", param="X-Ctxkernel-Session") from None
    credential = headers.get("authorization") or headers.get("x-api-key") or ""
    first_user = next((m.text for m in messages if m.role == "user"), "")
    digest = hashlib.sha256()
    for part in (api, hashlib.sha256(credential.encode()).hexdigest(), system, first_user):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return "fp-" + digest.hexdigest()[:32]
