"""Which session a request belongs to.

1. The header ``X-Ctxkernel-Session: <id>`` names it. The id is checked like any session id
   (1-128 letters, digits, ``.``, ``_``, ``-``); a bad one is a 400.
2. Without the header, a fingerprint picks it: ``fp-`` followed by the first 32 hex digits of
   SHA-256 over the API name, the tenant's tag (the keyed hash of the client's credential,
   ``tenants.py``), the system prompt and the first user message. Two tenants (two credentials)
   never share a session; one client that starts a new conversation (another first message)
   gets a new session; one that continues a conversation finds it again. Neither the credential
   nor anything that can be checked against a guessed one without the tenant secret is stored.

The key maps to the session's id in the store (the first session of a key has the key as its
id); a fork or a strategy's switch to a child session moves the mapping (``proxy.py``).

A key belongs to the tenant whose request first used it; another tenant that names it is given
a key of its own (:func:`tenant_key`), so it never reads or appends to the first tenant's session.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import StoreError
from ..messages import Message
from ..store.base import check_session_id
from .wire import WireError

SESSION_HEADER = "x-ctxkernel-session"


@dataclass(frozen=True)
class Identity:
    """Who a request comes from and which session key it asks for."""

    key: str
    #: the tag of the client's credential (tenants.tenant_of)
    tenant: str


def identify(headers: Mapping[str, str], api: str, system: str, messages: list[Message], tenant: str) -> Identity:
    """The request's session key, for the tenant ``tenant`` (a 400 for a malformed session header)."""
    return Identity(session_key(headers, api, system, messages, tenant), tenant)


def tenant_key(secret: bytes, key: str, tenant: str) -> str:
    """The key under which ``tenant`` has its own session of the name ``key`` another tenant
    holds: the name (cut to 90 characters) and 32 hex digits that only the secret's holder can
    compute, so nobody can name it in advance."""
    digest = hmac.new(secret, f"{tenant}\0{key}".encode(), hashlib.sha256).hexdigest()[:32]
    return check_session_id(f"{key[:90]}-t{digest}")


def session_key(headers: Mapping[str, str], api: str, system: str, messages: list[Message], tenant: str) -> str:
    named = headers.get(SESSION_HEADER)
    if named is not None:
        try:
            return check_session_id(named.strip())
        except StoreError as exc:
            raise WireError(400, f"X-Ctxkernel-Session: {exc}", param="X-Ctxkernel-Session") from None
    first_user = next((m.text for m in messages if m.role == "user"), "")
    digest = hashlib.sha256()
    for part in (api, tenant, system, first_user):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return "fp-" + digest.hexdigest()[:32]
