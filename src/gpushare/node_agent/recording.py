"""Appending what the pod-resources check concluded, each event once while it lasts.

The check runs after every Allocate and periodically; a finding that lasts would
otherwise be appended on every run. A :class:`Recorder` remembers the ids it appended
for as long as the check keeps producing them (their ids are deterministic, so
JetStream's duplicate window also absorbs a restarted agent's repeat), and forgets one
once its finding is gone, so a finding that comes back is recorded again. After
appending it reads the node's newest events, so the next check compares with them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpushare.bus.nats_types import NatsError
from gpushare.core.events import AllocationEvent
from gpushare.core.ports import AllocationLog
from gpushare.node_agent.local_node import LocalNode

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, view: LocalNode, allocation_log: AllocationLog) -> None:
        self.view = view
        self.log = allocation_log
        self._appended: set[str] = set()
        self.appended: list[AllocationEvent] = []
        """Everything this recorder appended, oldest first (for ``inspect`` and tests)."""

    async def record(self, events: Sequence[AllocationEvent]) -> list[AllocationEvent]:
        """Append the events not appended yet; returns those appended now."""
        current = {event.id for event in events}
        self._appended &= current
        done: list[AllocationEvent] = []
        for event in events:
            if event.id in self._appended:
                continue
            try:
                await self.log.append(event)
            except (NatsError, TimeoutError) as error:
                log.warning("node %s: appending %s failed: %s", self.view.name, event.id, error)
                continue
            log.info("node %s: appended %s %s", self.view.name, type(event).__name__, event.id)
            self._appended.add(event.id)
            done.append(event)
        if done:
            self.appended.extend(done)
            await self.view.catch_up()
        return done
