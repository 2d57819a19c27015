"""Test doubles for the allocator's neighbours on the real bus.

:class:`BinderDouble` stands in for the binder service: it follows the allocation log
and answers every new reservation with ``PodBound`` (or ``BindFailed``, as told).
:class:`RacingLog` lets another writer append to a node between the allocator's fold
and its own append, which is exactly the race compare-and-set exists for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from nats.js import JetStreamContext

from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog
from gpushare.core.events import AllocationEvent, AnyEvent, BindFailed, PodBound, PodReserved
from gpushare.core.state import NodeState, PodAllocation
from gpushare.tasks import cancel_and_wait
from tests.unit.allocator.builders import now

Verdict = Callable[[PodReserved], str | None]
"""``None`` binds the pod; a string fails the binding with that reason."""


def reservation_of(node: str, allocation: PodAllocation) -> PodReserved:
    return PodReserved(
        id=allocation.reservation_id,
        at=allocation.reserved_at,
        node=node,
        pod=allocation.pod,
        shares=allocation.shares,
        reserved_by="folded",
    )


def always_bind(_: PodReserved) -> str | None:
    return None


class BinderDouble:
    def __init__(self, js: JetStreamContext, verdict: Verdict = always_bind) -> None:
        self._follower = LogFollower(js)
        self._log = AllocationLog(js)
        self._verdict = verdict
        self._queue: asyncio.Queue[PodReserved] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.answered: list[AllocationEvent] = []

    def _on_event(self, seq: int, event: AnyEvent, node: NodeState) -> None:
        if isinstance(event, PodReserved) and event.reserved_by:
            self._queue.put_nowait(event)

    async def _run(self) -> None:
        while True:
            reservation = await self._queue.get()
            reason = self._verdict(reservation)
            common = {
                "at": now(),
                "node": reservation.node,
                "pod": reservation.pod,
                "reservation_id": reservation.id,
            }
            answer: AllocationEvent = (
                PodBound(id=f"bound:{reservation.id}", **common)
                if reason is None
                else BindFailed(id=f"failed:{reservation.id}", reason=reason, **common)
            )
            await self._log.append(answer)
            self.answered.append(answer)

    async def __aenter__(self) -> BinderDouble:
        self._follower.listen(self._on_event)
        await self._follower.start()
        for node in self._follower.state.nodes.values():  # reserved before we started
            for allocation in node.pods.values():
                if not allocation.bound:
                    self._queue.put_nowait(reservation_of(node.name, allocation))
        self._task = asyncio.create_task(self._run(), name="binder double")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)  # a plain cancel can be lost inside an append
        await self._follower.stop()


class RacingLog(AllocationLog):
    """Appends ``rival`` (as another allocator would) just before our first reservation."""

    def __init__(self, js: JetStreamContext, rival: PodReserved) -> None:
        super().__init__(js)
        self._other_writer = AllocationLog(js)
        self._rival: PodReserved | None = rival

    async def append(self, event: AllocationEvent, expected_last_seq: int | None = None) -> int:
        if self._rival is not None and isinstance(event, PodReserved):
            rival, self._rival = self._rival, None
            await self._other_writer.append(rival)
        return await super().append(event, expected_last_seq)
