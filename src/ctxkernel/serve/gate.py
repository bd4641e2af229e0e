"""What ``serve`` refuses before any route sees a request: a foreign ``Host`` and cross-site
requests.

A web page the operator's browser opens must not use ``serve`` (and the credentials it forwards,
or the server key of ``--api-key-env``) on its behalf:

- **Host**: only the names the operator lists are answered (loopback names, the ``--host``
  address and every ``--allowed-host``), so a page on another site cannot reach ``serve``
  through DNS rebinding (its requests carry that site's name as ``Host``). ``*`` turns the
  check off, for a deployment whose own proxy checks the name.
- **Cross-site requests** (every route but the inspector's, which checks its own): a request
  whose ``Origin`` is not this server, or whose ``Sec-Fetch-Site`` says another site sent it,
  is refused, and so is a body a browser may send to another site without asking first
  (``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``): the APIs
  take JSON, which no cross-site form or simple request can send.
"""

from __future__ import annotations

from collections.abc import Iterable

#: the names every ``serve`` answers to (the loopback interface)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: what a browser may send to another site without a preflight (the Fetch standard's list)
SIMPLE_TYPES = frozenset({b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"})
#: Sec-Fetch-Site values of a request this server's own pages or the user made
SAME_SITE = frozenset({b"same-origin", b"none"})


def host_name(value: str) -> str:
    """The name of a ``Host`` value or of an origin's authority, without port, lower case."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8787
        return value[: value.find("]") + 1] if "]" in value else value
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


class Gate:
    """The checks of the module docstring, over an ASGI scope (no parsing of its own beyond
    one pass over the headers: it runs on every request)."""

    def __init__(self, allowed_hosts: Iterable[str]) -> None:
        names = {host_name(h) for h in allowed_hosts if h}
        self.any_host = "*" in names
        self.hosts = frozenset(n.encode() for n in names) | frozenset(
            n.strip("[]").encode() for n in names if n.startswith("[")
        )

    def refusal(self, scope: dict[str, object], *, cross_site: bool = True) -> tuple[int, str] | None:
        """``(status, why)`` when the request must be refused, else None."""
        host = origin = site = ctype = None
        for name, value in scope["headers"]:  # type: ignore[attr-defined]
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                site = value
            elif name == b"content-type":
                ctype = value
        if not self.any_host and (host is None or host_name(host.decode("latin-1")).encode() not in self.hosts):
            shown = "none" if host is None else repr(host.decode("latin-1")[:100])
            return 403, (
                f"Host {shown} is not one this server answers to; start serve with --allowed-host NAME for each "
                "name clients use (the loopback names and the --host address are always answered)"
            )
        if not cross_site:
            return None
        if origin is not None:
            authority = origin.decode("latin-1").partition("://")[2]
            if not authority or host is None or authority.lower() != host.decode("latin-1").lower():
                return 403, f"cross-site request refused (Origin {origin.decode('latin-1')[:100]!r})"
        if site is not None and site.lower() not in SAME_SITE:
            return 403, f"cross-site request refused (Sec-Fetch-Site {site.decode('latin-1')[:40]!r})"
        if ctype is not None and ctype.partition(b";")[0].strip().lower() in SIMPLE_TYPES:
            return 415, (
                f"Content-Type {ctype.decode('latin-1')[:100]!r} is refused (a browser sends it to any site "
                "unasked); send the body as application/json"
            )
        return None
