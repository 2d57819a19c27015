"""cancel_and_wait stops tasks that lose a cancellation, and leaves no error unretrieved."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gpushare.tasks import cancel_and_wait


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
