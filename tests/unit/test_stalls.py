"""The stall watchdog: a loop that stops turning gets every thread's stack written."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gpushare.stalls import dump_stacks_on_stall


def blocking_call_of_the_test(seconds: float) -> None:
    time.sleep(seconds)  # the loop does not turn meanwhile


async def test_a_loop_blocked_past_the_limit_gets_its_stacks_written(tmp_path: Path) -> None:
    stop = asyncio.Event()
    with (tmp_path / "stderr").open("w+") as out:
        watch = asyncio.create_task(dump_stacks_on_stall(stop, 0.2, out))
        await asyncio.sleep(0.05)
        blocking_call_of_the_test(0.6)
        stop.set()
        await watch
        out.seek(0)
        written = out.read()
    assert "most recent call first" in written
    assert "blocking_call_of_the_test" in written


async def test_a_turning_loop_gets_nothing_written(tmp_path: Path) -> None:
    stop = asyncio.Event()
    with (tmp_path / "stderr").open("w+") as out:
        watch = asyncio.create_task(dump_stacks_on_stall(stop, 0.2, out))
        for _ in range(12):
            await asyncio.sleep(0.04)  # 0.48 s, turning
        stop.set()
        await watch
        await asyncio.sleep(0.3)  # past a deadline that was not cancelled
        out.seek(0)
        assert out.read() == ""
