"""The doorbell that lets the node agent's background tasks sleep until there is work."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from gpushare.node_agent.doorbell import Doorbell
from gpushare.node_agent.kubelet_lists import KubeletLists
from gpushare.node_agent.local_node import LocalNode
from gpushare.node_agent.podresources import PodResourcesCheck
from gpushare.node_agent.reconciling import Finding


async def waited(bell: Doorbell, stop: asyncio.Event, seconds: float | None) -> float:
    started = time.monotonic()
    await asyncio.wait_for(bell.wait(stop, seconds), 5)
    return time.monotonic() - started


async def test_a_ring_before_the_wait_ends_the_wait_at_once_and_is_used_up() -> None:
    bell, stop = Doorbell(), asyncio.Event()
    bell.ring()
    assert await waited(bell, stop, 10) < 1
    assert await waited(bell, stop, 0.2) >= 0.2  # the ring was spent by the first wait


async def test_a_ring_wakes_a_sleeping_wait() -> None:
    bell, stop = Doorbell(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, bell.ring)
    assert await waited(bell, stop, None) < 1


async def test_stop_ends_the_wait_and_leaves_no_task_behind() -> None:
    bell, stop = Doorbell(), asyncio.Event()
    before = len(asyncio.all_tasks())
    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await waited(bell, stop, None) < 1
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before


async def test_the_kubelet_is_asked_when_a_list_is_sent_not_on_a_timer(tmp_path: Path) -> None:
    """Idle, the lists ask nobody; a list sent is asked about at once (no pod-resources
    socket here: the kubelet cannot say, so the list counts as taken when asked)."""
    lists = KubeletLists("n1", tmp_path / "kubelet.sock")
    sent: dict[str, int] = {}
    stop = asyncio.Event()
    task = asyncio.create_task(lists.run(stop, lambda: sent))
    await asyncio.sleep(0.3)
    assert lists.taken == {}
    sent["aliyun.com/gpu-mem"] = 1
    lists.list_sent()
    for _ in range(50):
        if lists.has_taken("aliyun.com/gpu-mem", 1):
            break
        await asyncio.sleep(0.02)
    assert lists.has_taken("aliyun.com/gpu-mem", 1)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_a_wait_says_whether_the_bell_rang() -> None:
    bell, stop = Doorbell(), asyncio.Event()
    assert await bell.wait(stop, 0.01) is False
    bell.ring()
    assert await bell.wait(stop, 1) is True


class CountingCheck(PodResourcesCheck):
    calls = 0

    async def check(self) -> tuple[Finding, ...]:
        self.calls += 1
        return ()


async def test_the_allocates_of_a_burst_ask_for_one_pod_resources_check(tmp_path: Path) -> None:
    view = cast("LocalNode", SimpleNamespace(name="n1"))
    check = CountingCheck(view, tmp_path / "kubelet.sock", "aliyun.com/gpu-mem", 0)
    check.poke_settle_seconds = 0.2
    stop = asyncio.Event()
    task = asyncio.create_task(check.run(stop))
    for _ in range(5):  # five Allocates within 0.1 s
        check.poke()
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    assert check.calls == 1
    check.poke()  # a later one gets a check of its own
    await asyncio.sleep(0.5)
    assert check.calls == 2
    stop.set()
    await asyncio.wait_for(task, 5)
