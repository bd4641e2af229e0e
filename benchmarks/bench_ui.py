"""The web inspector on long sessions: its pages' data cost a page, not the log.

    python benchmarks/run.py -k ui

Sessions: the ``handoff`` profile's realistic mix (``_profiles.py``) at the smallest and largest
size of the preset (1,000 and 100,000 events; quick: 500 and 5,000). Each is served by
``ctxkernel.ui.create_app`` through Starlette's test client (the ASGI stack without a socket;
``ui_first_view`` through httpx's ASGI transport, below).

``ui_log_page_flat``: one log page (100 events from the middle) of the large session against the
same page of the small one; target <= 1.5 (a page reads only its events).

``ui_poll_flat``: one live-update cycle of the session page with the session already open and no
new event (head, view, timeline, surface, compactions, the last log page) on the large session
against the small one. The timeline carries one point per request, so it grows with the log;
target <= 3.

``ui_update_after_turn``: the update cycle right after a harness appended a turn (the open session
folds only the new events) against the same cycle with nothing new, on the large session;
target <= 1.5.

``ui_first_view``: the first view of the session page on a large session (a fresh app answering
the five requests the page makes when it loads: the view, the timeline, the surface and the
compaction transactions at once, as ``ui.js`` sends them, then the last log page) against
``Kernel.open_session`` alone; target <= 1.3 (the page adds little to the open, which starts from
the session's snapshot). Both sides build their kernel from the profile. The requests go through
httpx's ASGI transport on one event loop that outlives the rounds, as a server's loop does: the app
runs as uvicorn runs it (middleware, routing, the worker thread, the encoded answer), with an
in-process client. Until the fourth round they went one by one through Starlette's test client,
whose own cost (a portal thread started and stopped per view, each request handed across threads:
~15-20 ms for five requests, a fifth of the open) counted as the inspector's while the open it is
compared with pays no client at all; and one at a time they hid that the page's four simultaneous
requests each opened the session (fixed: they wait for one open). The line's ``parts_s`` gives the
CPU seconds of each request of a first view sent one at a time, in the page's order (the first
one opens the session). Until the ninth round each view's requests ran in a
``run_until_complete`` of their own, and anyio stops its worker threads when the task it takes
for the root ends, so every view started its worker threads anew (1.8-3.0 ms a view, measured by
``ui9``), which a server, whose serving task outlives its requests, does not: the rounds now run
in a thread beside the loop, whose one task lasts the whole comparison.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from typing import Any

from _bench import Bench, cpu_seconds
from _profiles import built, open_kernel, sizes, turn

PROFILE = "handoff"
#: what the session page fetches when it loads (ui.js, loadAll): four requests at once, then the
#: last log page
FIRST_VIEW = (("", "/timeline", "/surface", "/transactions"), ("/log",))


def run(bench: Bench) -> None:
    try:
        import httpx
        from starlette.testclient import TestClient

        from ctxkernel.ui import create_app
    except ImportError:
        print(json.dumps({"name": "ui", "skipped": "needs the 'ui' extra: pip install 'ctxkernel[ui]'"}), flush=True)
        return
    preset = sizes(bench)
    small, large = preset[0], preset[-1]
    sessions = built(bench, PROFILE)
    repeat = 3 if bench.quick else 5
    base = "http://127.0.0.1"

    clients: dict[int, Any] = {}
    for size in (small, large):
        b = sessions[size]
        client = TestClient(create_app(open_kernel(PROFILE, b.home)), base_url=base)
        client.__enter__()
        clients[size] = (client, b.session_id, b.events)
    try:

        def page(size: int) -> None:
            client, sid, events = clients[size]
            r = client.get(f"/api/sessions/{sid}/log", params={"start": events // 2, "limit": 100})
            assert r.status_code == 200 and len(r.json()["rows"]) == 100

        bench.compare(
            "ui_log_page_flat",
            lambda: page(large),
            lambda: page(small),
            target=("<=", 1.5),
            repeat=repeat * 4,
            unit="s",
            events=sessions[large].events,
            small_events=sessions[small].events,
        )

        def poll(size: int) -> None:
            client, sid, _ = clients[size]
            for path in ("/head", "", "/timeline", "/surface", "/transactions", "/log"):
                r = client.get(f"/api/sessions/{sid}{path}")
                assert r.status_code == 200, r.text

        poll(small), poll(large)  # open both sessions before timing
        bench.compare(
            "ui_poll_flat",
            lambda: poll(large),
            lambda: poll(small),
            target=("<=", 3),
            repeat=repeat,
            unit="s",
            events=sessions[large].events,
            small_events=sessions[small].events,
        )

        # a harness appends a turn; the page's next update folds only it (no replay)
        writer = open_kernel(PROFILE, sessions[large].home).open_session(sessions[large].session_id)
        ratios, after, idle = [], [], []
        for k in range(repeat):
            turn(writer, 10**6 + k)
            after.append(cpu_seconds(lambda: poll(large)))
            idle.append(cpu_seconds(lambda: poll(large)))
            ratios.append(after[-1] / idle[-1])
        ratio = statistics.median(ratios)
        bench.report(
            "ui_update_after_turn",
            ratio,
            ("<=", 1.5),
            "s",
            statistics.median(after),
            (max(ratios) - min(ratios)) / ratio,
            baseline_median=round(statistics.median(idle), 6),
            repeat=repeat,
            events=sessions[large].events,
        )

        b = sessions[large]
        # The server's event loop outlives the requests, as uvicorn's does (a fresh app each round),
        # and so do anyio's worker threads: anyio keeps them while the task it takes for the root
        # (the one `run_until_complete` runs) lives, so that task lasts the whole comparison, as
        # uvicorn's serving task does, and the rounds run in another thread that hands each view
        # to the loop.
        loop = asyncio.new_event_loop()

        def on_loop(coroutine: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

        def first_view(parts: dict[str, list[float]] | None = None) -> None:
            app = create_app(open_kernel(PROFILE, b.home))
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)

            async def get(paths: tuple[str, ...]) -> None:
                answers = await asyncio.gather(*(client.get(f"/api/sessions/{b.session_id}{p}") for p in paths))
                for r in answers:
                    assert r.status_code == 200, r.text

            try:
                if parts is None:  # as the page does: four requests at once, then the log page
                    for paths in FIRST_VIEW:
                        on_loop(get(paths))
                    return
                for path in (p for paths in FIRST_VIEW for p in paths):  # one at a time, for parts_s
                    parts.setdefault(path or "/", []).append(cpu_seconds(lambda path=path: on_loop(get((path,)))))
            finally:
                on_loop(client.aclose())

        def open_only() -> None:
            open_kernel(PROFILE, b.home).open_session(b.session_id, repair=False)

        def compare_first_view() -> None:
            parts: dict[str, list[float]] = {}
            for _ in range(3):
                first_view(parts)
            bench.compare(
                "ui_first_view",
                first_view,
                open_only,
                target=("<=", 1.3),
                repeat=repeat + 4,  # a view is ~0.1 s: more rounds steady the median on a loaded machine
                unit="s",
                events=b.events,
                parts_s={path: round(statistics.median(times), 4) for path, times in parts.items()},
            )

        async def serving() -> None:
            await asyncio.to_thread(compare_first_view)

        try:
            loop.run_until_complete(serving())
        finally:
            loop.close()
    finally:
        for client, _, _ in clients.values():
            client.__exit__(None, None, None)
