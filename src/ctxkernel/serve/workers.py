"""The worker threads ``serve`` runs Session calls in (they fsync and tokenise: never on the loop).

:func:`run_sync` is ``anyio.to_thread.run_sync`` with the same contract and less machinery: the
call runs in a worker thread with the caller's context variables, and is never abandoned: a
caller cancelled meanwhile still waits for it to finish (a shielded :class:`anyio.CancelScope`, as
anyio does), so a session's turn is never released while its worker still writes; the
cancellation is delivered after. What it leaves out is what ``serve`` does not use: anyio's
per-loop capacity limiter (an ``async with`` and its bookkeeping), the checkpoint before the hop
(one more pass of the event loop), a ``queue.Queue`` per thread (a Python ``Condition``: two locks
and a notify per job) and the thread-local state for ``anyio.from_thread``. A hop costs about half
the CPU: 22-24 µs against 44-46 µs with uvloop, two hops per request (``bench_serve.py``).

The pool is one per process, shared by every event loop (each job carries its loop), at most
:data:`MAX_THREADS` threads, started when a job finds none idle; jobs beyond that wait in the
queue, as anyio's callers wait for a token of its limiter (whose default is also 40); below
that, every job gets a thread of its own at once. The threads are daemons blocked on the queue
while idle.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from ..logging import get_logger

log = get_logger("ctxkernel.serve")

T = TypeVar("T")

#: at most this many worker threads (anyio's default thread limiter has 40 tokens)
MAX_THREADS = 40

_Job = tuple[contextvars.Context, Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class Workers:
    """A pool of worker threads fed by one C queue (:class:`queue.SimpleQueue`)."""

    def __init__(self, max_threads: int = MAX_THREADS) -> None:
        self.max_threads = max_threads
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting on the queue for a job not yet given to any
        self._backlog = 0  # jobs queued while every thread was busy

    async def run_sync(self, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` in a worker thread; its result, or what it raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with anyio.CancelScope(shield=True):  # never abandoned: see the module's docstring
            # every job has a thread of its own (an idle one, taken now, or a new one), so a job
            # that waits (a lock held by another session's request) never holds up the others
            with self._lock:
                start = False
                if self._idle:
                    self._idle -= 1
                elif self._threads < self.max_threads:
                    self._threads += 1
                    start = True
                else:
                    self._backlog += 1  # the next thread to finish a job takes it
            if start:
                try:
                    threading.Thread(target=self._work, name="ctxkernel serve worker", daemon=True).start()
                except BaseException:
                    with self._lock:
                        self._threads -= 1
                    raise
            self._jobs.put((contextvars.copy_context(), func, args, loop, future))
            result = await future
        return result

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            context, func, args, loop, future = jobs.get()
            result: Any = None
            error: BaseException | None = None
            try:
                result = context.run(func, *args)
            except BaseException as exc:  # handed to the waiting caller, raised there
                error = exc
            try:
                loop.call_soon_threadsafe(_deliver, future, result, error)
            except RuntimeError:
                if not loop.is_closed():  # else the loop was closed meanwhile: nobody waits for it
                    log.exception("serve: a worker's answer could not be handed to its event loop")
            del result, error, context, func, args, future
            with lock:
                if self._backlog:
                    self._backlog -= 1
                else:
                    self._idle += 1


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, StopIteration):  # a future cannot hold one (as anyio does)
        wrapped = RuntimeError("the worker call raised StopIteration")
        wrapped.__cause__ = error
        future.set_exception(wrapped)
    else:
        future.set_exception(error)


_pool = Workers()


def _fresh_pool_in_child() -> None:
    # a forked child has none of the parent's threads: its jobs must not wait for them
    global _pool  # the process's one pool, replaced only here
    _pool = Workers(_pool.max_threads)


os.register_at_fork(after_in_child=_fresh_pool_in_child)


async def run_sync(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in one of the process's worker threads (:class:`Workers`)."""
    return await _pool.run_sync(func, *args)
