"""serve's worker threads (``serve/workers.py``): anyio.to_thread.run_sync's contract."""

from __future__ import annotations

import contextvars
import threading
import time

import anyio
import pytest

from ctxkernel.serve.workers import Workers, run_sync

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def test_a_call_runs_in_another_thread_with_the_callers_context_and_gives_its_result():
    async def main() -> tuple[str, int, int]:
        request_id.set("r1")
        return await run_sync(lambda a, b: (request_id.get(), threading.get_ident(), a + b), 2, 3)

    seen, ident, total = anyio.run(main)
    assert (seen, total) == ("r1", 5)
    assert ident != threading.get_ident()


def test_what_the_call_raises_is_raised_to_the_caller():
    def fail() -> None:
        raise KeyError("boom")

    def stop() -> None:
        raise StopIteration

    async def main() -> None:
        with pytest.raises(KeyError, match="boom"):
            await run_sync(fail)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await run_sync(stop)

    anyio.run(main)


def test_a_cancelled_caller_waits_for_its_call_to_finish():
    # never abandoned: a session's turn must not be released while its worker still writes
    finished: list[bool] = []

    def slow() -> None:
        time.sleep(0.2)
        finished.append(True)

    async def main() -> None:
        after: list[str] = []
        with anyio.move_on_after(0.05) as scope:
            await run_sync(slow)
            after.append("returned")  # as with anyio: the call returns, the cancellation comes
            await anyio.sleep(1)  # at the next checkpoint
            after.append("not reached")
        assert scope.cancel_called
        assert finished == [True]
        assert after == ["returned"]

    anyio.run(main)


@pytest.mark.parametrize("uvloop", [False, True])
def test_calls_that_wait_for_each_other_each_get_a_thread(uvloop):
    # a job that waits (a lock another session's request holds) never holds up the others
    pool = Workers(max_threads=4)
    gate = threading.Event()

    async def main() -> list[str]:
        out: list[str] = []

        async def waiter() -> None:
            out.append(await pool.run_sync(lambda: "waited" if gate.wait(5) else "timed out"))

        async def opener() -> None:
            await anyio.sleep(0.05)
            out.append(await pool.run_sync(lambda: (gate.set(), "opened")[1]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(opener)
        return out

    assert anyio.run(main, backend_options={"use_uvloop": uvloop}) == ["opened", "waited"]


def test_beyond_the_thread_limit_jobs_wait_their_turn_and_all_run():
    pool = Workers(max_threads=2)
    running = 0
    most = 0
    lock = threading.Lock()

    def job(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return i

    async def main() -> list[int]:
        results: list[int] = []

        async def one(i: int) -> None:
            results.append(await pool.run_sync(job, i))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        return results

    assert sorted(anyio.run(main)) == list(range(12))
    assert most <= 2
    assert pool._threads == 2


def test_a_forked_child_runs_its_calls_on_threads_of_its_own():
    # the parent's threads are not in the child: a pool that counted them idle would hang
    import os
    import signal

    assert anyio.run(run_sync, lambda: 1) == 1  # the parent has a thread now
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only when its call ran
        try:
            signal.alarm(10)  # a hung call ends the child (and fails the test) instead of the run
            os._exit(0 if anyio.run(run_sync, lambda: 7) == 7 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
