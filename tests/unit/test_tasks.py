"""cancel_and_wait stops tasks that lose a cancellation, and leaves no error unretrieved;
unless_stopped gives up on work that way; supervised runs a crashed loop again."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import pytest

from gpushare.tasks import cancel_and_wait, log_if_it_fails, supervised, unless_stopped


async def test_a_task_that_loses_its_first_cancellation_is_cancelled_again() -> None:
    rounds = 0

    async def loses_one_cancellation() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if rounds > 1:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # as wait_for does

    task = asyncio.create_task(loses_one_cancellation())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, retry_seconds=0.01), timeout=5)
    assert task.cancelled()
    assert rounds == 2


async def test_a_task_that_failed_has_its_error_retrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    with warnings.catch_warnings():  # what earlier tests left unclosed is not this test's
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.done()
    del task  # asyncio reports an error nobody retrieved when its task is collected
    gc.collect()
    assert "never retrieved" not in caplog.text


async def test_finished_tasks_are_left_alone() -> None:
    async def done() -> int:
        return 7

    task = asyncio.create_task(done())
    await task
    await cancel_and_wait(task)
    assert task.result() == 7


async def test_unless_stopped_gives_the_work_s_result_when_it_finishes_first() -> None:
    async def work() -> str:
        return "connected"

    assert await unless_stopped(work(), asyncio.Event()) == "connected"


async def test_unless_stopped_gives_up_on_work_that_loses_a_cancellation_when_stopped() -> None:
    stop = asyncio.Event()
    cancels = 0

    async def stubborn() -> str:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels += 1
                if cancels > 1:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # as wait_for does

    asyncio.get_running_loop().call_soon(stop.set)
    assert await asyncio.wait_for(unless_stopped(stubborn(), stop), timeout=5) is None
    assert cancels == 2


async def test_a_task_that_fails_is_logged_the_moment_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise ConnectionResetError("reset by peer")

    async def sleeps() -> None:
        await asyncio.sleep(10)

    failing, cancelled = asyncio.create_task(fails()), asyncio.create_task(sleeps())
    for task, what in ((failing, "the watcher"), (cancelled, "the sleeper")):
        log_if_it_fails(task, what, logging.getLogger("test.tasks"))
    with caplog.at_level(logging.ERROR, logger="test.tasks"):
        await asyncio.wait({failing})
        await cancel_and_wait(cancelled)
        await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    assert [record.getMessage() for record in caplog.records] == [
        "the watcher ended: reset by peer"
    ]
    assert caplog.records[0].exc_info is not None  # with its traceback


async def test_a_supervised_loop_that_crashes_is_logged_and_run_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0

    async def crashes_twice() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise RuntimeError(f"crash {runs}")

    logger = logging.getLogger("test.supervised")
    with caplog.at_level(logging.ERROR, logger="test.supervised"):
        await asyncio.wait_for(
            supervised("the loop", crashes_twice, logger, restart_seconds=0.01), timeout=5
        )
    assert runs == 3
    crashes = [record for record in caplog.records if record.name == "test.supervised"]
    assert [record.getMessage() for record in crashes] == ["the loop crashed; restarting it"] * 2
    assert all(record.exc_info is not None for record in crashes)


async def test_a_supervised_loop_ends_quietly_on_the_errors_it_is_told_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0

    async def connection_closed() -> None:
        nonlocal runs
        runs += 1
        raise ConnectionAbortedError("closed for good")

    logger = logging.getLogger("test.supervised")
    with caplog.at_level(logging.INFO, logger="test.supervised"):
        await supervised(
            "the loop", connection_closed, logger, ends_quietly=(ConnectionAbortedError,)
        )
    assert runs == 1
    assert [record.getMessage() for record in caplog.records] == ["the loop stops: closed for good"]


async def test_a_supervised_loop_is_cancelled_even_while_it_waits_to_restart() -> None:
    async def crashes() -> None:
        raise RuntimeError("crash")

    task = asyncio.create_task(
        supervised("the loop", crashes, logging.getLogger("test.supervised"), restart_seconds=60)
    )
    await asyncio.sleep(0.01)
    await asyncio.wait_for(cancel_and_wait(task), timeout=5)
    assert task.cancelled()
