"""Each extender call reports how long it waited for the event loop before its verb began
(``gpushare_extender_queue_seconds``), apart from the verb's own time."""

from __future__ import annotations

import asyncio
import time

from gpushare.allocator.extender import create_app
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.runtime import serve_app
from gpushare.allocator.settings import URL_PREFIX, AllocatorSettings
from gpushare.allocator.verbs import ExtenderVerbs
from gpushare.clock import SYSTEM_CLOCK
from tests.fakes import offline_follower
from tests.unit.allocator.builders import gpu_pod, names_args, seed_000_filter_cluster

BLOCKED_SECONDS = 0.05


def post(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: allocator\r\ncontent-type: application/json\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


async def answer_of(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


def observed(metrics: AllocatorMetrics, name: str, verb: str) -> tuple[float, float]:
    """(count, sum) of one histogram's verb."""
    count = metrics.registry.get_sample_value(f"{name}_count", {"verb": verb})
    total = metrics.registry.get_sample_value(f"{name}_sum", {"verb": verb})
    return count or 0.0, total or 0.0


async def test_a_call_that_waits_behind_another_reports_the_wait_not_as_its_own_time() -> None:
    """Two filter calls arrive in one read; the first holds the loop for 50 ms. The second
    waited that long before its verb began: its queue time says so, and the verbs' own
    time is the first call's 50 ms and the second's little."""
    follower = offline_follower(seed_000_filter_cluster())
    app = create_app(follower, AllocatorSettings(policy="binpack"), clock=SYSTEM_CLOCK)
    verbs: ExtenderVerbs = app.state.allocator.verbs
    metrics: AllocatorMetrics = app.state.allocator.metrics
    answer = verbs.filter
    calls = 0

    def slow_first(body: bytes) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            time.sleep(BLOCKED_SECONDS)  # the loop's other work, as the second call sees it
        return answer(body)

    verbs.filter = slow_first  # type: ignore[method-assign]
    body = names_args(gpu_pod("p", 8138), ["N1", "N2", "N3"])
    async with serve_app(app, "127.0.0.1", 0) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        try:
            request = post(f"{URL_PREFIX}/filter", body)
            writer.write(request + request)  # pipelined: both read at once
            await writer.drain()
            answers = [await answer_of(reader) for _ in range(2)]
        finally:
            writer.close()
    assert all(b'"NodeNames":["N3"]' in answer for answer in answers), answers
    queued_count, queued = observed(metrics, "gpushare_extender_queue_seconds", "filter")
    verb_count, verb_time = observed(metrics, "gpushare_extender_request_seconds", "filter")
    assert queued_count == verb_count == 2
    assert queued >= BLOCKED_SECONDS
    assert BLOCKED_SECONDS <= verb_time < queued + BLOCKED_SECONDS
