"""What only a process that ``ctxkernel serve`` owns does: start uvicorn (one process, or worker
processes that build the app from ``$CTXKERNEL_SERVE_CONFIG``) and, when asked
(``--tune-heap``), tune the process's garbage collector and C allocator for serving.

Nothing here runs when a host embeds :func:`ctxkernel.serve.app.create_app` in its own process:
the collector and the allocator are the host's.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from ..kernel import Kernel
from ..logging import get_logger
from ..redact import redact
from .app import create_app
from .config import ServeConfig, upstream_bases
from .gate import LOCAL_HOSTS

log = get_logger("ctxkernel.serve")

CONFIG_ENV = "CTXKERNEL_SERVE_CONFIG"
#: where the CLI puts a generated operator token for its worker processes
UI_TOKEN_ENV = "CTXKERNEL_SERVE_UI_TOKEN"


def startup_lines(
    config: ServeConfig, kernel: Kernel, *, host: str, port: int, workers: int, ui_token: str | None = None
) -> list[str]:
    """What ``ctxkernel serve`` prints on stderr when it starts: where it listens, the profile,
    the upstreams, the store, the inspector and the Host names it answers. ``ui_token`` is
    printed only when serve made it (the operator has no other way to learn it)."""
    shown_host = f"[{host}]" if ":" in host else host
    base = f"http://{shown_host}:{port}"
    profile = kernel.profile
    openai_base, anthropic_base = upstream_bases(config, kernel)
    responses_base = config.responses_upstream or profile.serve.responses_upstream
    responses = f"Responses {redact(responses_base)}" if responses_base else "Responses translated to Chat Completions"
    key_env = config.api_key_env or profile.serve.api_key_env
    credentials = f"the key in ${key_env}" if key_env else "each client's own credentials"
    store = kernel.store
    where = getattr(store, "where", None)  # postgres: its DSN, password masked
    if not isinstance(where, str):
        path = getattr(store, "path", None)  # sqlite: the database file; jsonl: the home folder
        where = path if isinstance(path, Path) else getattr(store, "home", "")
    hosts = [*LOCAL_HOSTS, *config.allowed_hosts]
    lines = [
        f"ctxkernel serve: listening on {base} ({workers} worker{'s' if workers > 1 else ''})",
        f"  profile: {profile.name} ({profile.path or 'built-in defaults'})",
        f"  upstreams: OpenAI-compatible {redact(openai_base)}, Anthropic {redact(anthropic_base)}, {responses}; "
        f"sent {credentials}",
        f"  store: {store.backend} at {redact(str(where))}",
        f"  Host names answered: {'any (--allowed-host *)' if '*' in hosts else ', '.join(hosts)}",
    ]
    if config.ui:
        token = f"; operator token: {ui_token}" if ui_token else f"; operator token in ${config.ui_token_env}"
        lines.append(f"  inspector: {base}/ui/ (HTTP Basic, any user name{token})")
    else:
        lines.append("  inspector: not mounted (--ui mounts it, behind an operator token)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        lines.append(
            f"  warning: listening on {host}: anyone who reaches it can use the credentials serve forwards; "
            "see docs/serve.md, Many tenants"
        )
    return lines


def settle_heap() -> None:
    """Move what the process holds once started (modules, classes, the profile, the tokenizer)
    out of the cyclic collector's reach, as a server that owns its process does before serving.

    A request allocates thousands of containers (the parsed body) that are alive when the
    collector runs mid-request; they reach the oldest generation, and every few requests a full
    collection walks everything the process holds: about 40 ms each at 100k tokens, a fourth of
    ``serve``'s CPU per request (``bench_serve.py``). Frozen objects are still freed by reference
    counting; only a reference cycle among them would never be collected, and what is frozen here
    lives as long as the process anyway. Called by ``ctxkernel serve --tune-heap`` (each worker),
    never by :func:`create_app`: a host that embeds the app owns its process and its collector.

    It also keeps the C heap's freed memory for reuse (:func:`keep_freed_memory`)."""
    gc.collect()
    gc.freeze()
    keep_freed_memory()


#: glibc ``mallopt`` parameters (malloc.h) and the values :func:`keep_freed_memory` sets
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (64-bit): blocks up to 32 MB come from the heap
TRIM_THRESHOLD_BYTES = 128 << 20  # free memory above the heap's top is returned past 128 MB


def keep_freed_memory() -> bool:
    """Let glibc's allocator reuse freed memory instead of mapping fresh pages for each request.

    Every request allocates blocks the size of its body (the body, its upstream form, the memo's
    JSON: 0.6 MB each at 100k tokens). glibc maps a block that large on its own and unmaps it when
    freed, so the next request takes a page fault for each 4 KB it touches: about 180 faults and
    1 ms of system CPU per request at 100k tokens (``bench_serve.py``). With a fixed mmap
    threshold of 32 MB and a trim threshold of 128 MB the blocks come from the heap and stay
    there for the next request; the cost is that the process keeps its peak heap (bounded by
    the body limit times the concurrent requests). False (and logged) where the C library is
    not glibc or refuses a value."""
    import ctypes
    import platform

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        log.info("serve.malloc_untuned", reason="the C library is not glibc")
        return False
    libc = ctypes.CDLL(None)
    ok = True
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        if libc.mallopt(param, value) != 1:
            log.warning("serve.malloc_untuned", reason=f"mallopt({param}, {value}) refused")
            ok = False
    return ok


def app_from_env() -> Starlette:
    """The app factory uvicorn's worker processes call (``--workers N``): the config comes from
    ``$CTXKERNEL_SERVE_CONFIG`` (JSON, written by the CLI; it never holds a key, only the name
    of the variable that does)."""
    config = ServeConfig.from_json(os.environ[CONFIG_ENV])
    app = create_app(config)
    if config.tune_heap:
        settle_heap()
    return app


def run(config: ServeConfig, app: Starlette | None, *, host: str, port: int, workers: int) -> None:
    """Serve until stopped: ``app`` in this process (one worker), or ``workers`` processes that
    each build theirs from the config (:func:`app_from_env`)."""
    if workers == 1:
        assert app is not None
        if config.tune_heap:
            settle_heap()
        uvicorn.run(app, host=host, port=port, log_level="warning")
        return
    os.environ[CONFIG_ENV] = config.to_json()
    uvicorn.run(
        "ctxkernel.serve.process:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
    )
