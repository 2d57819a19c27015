"""Knowing when the kubelet has taken our device list, not only been sent it.

A plugin that goes away leaves its devices unhealthy in the kubelet's device manager.
After the plugin registers again, the kubelet opens ``ListAndWatch`` and we send the
device list, but until the device manager has processed that message (some 32,000 IDs
per resource: milliseconds on an idle node, seconds on a busy one) it refuses every pod
that needs the resource, for good (``no healthy devices present``, the pod fails with
``UnexpectedAdmissionError``). Sending the list is therefore not yet serving.

The kubelet's pod-resources ``GetAllocatableResources`` answers from the same healthy
set, so a resource's registration counts as *taken* once that lists its devices. A
kubelet that cannot say (its pod-resources API switched off or never there) is trusted
from the first message sent, as the agent did before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

from gpushare.node_agent.doorbell import Doorbell
from gpushare.node_agent.podresources import allocatable_counts

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1
"""How often the kubelet is asked while a list it was sent is not taken yet."""
IDLE_SECONDS = 5.0
"""How often the lists are looked at when none is waiting and no list was sent since."""
ASK_TIMEOUT_SECONDS = 2.0


class KubeletLists:
    """Which registration of each resource the kubelet has taken the device list of."""

    def __init__(self, node: str, socket: Path, poll_seconds: float = POLL_SECONDS) -> None:
        self.node = node
        self.socket = socket
        self.poll_seconds = poll_seconds
        self.taken: dict[str, int] = {}
        """Resource → the registration (the endpoint's count) whose list the kubelet took."""
        self._answered = False
        self._sent = Doorbell()

    def list_sent(self) -> None:
        """A device list went out on ``ListAndWatch``: find out soon whether it was taken."""
        self._sent.ring()

    def has_taken(self, resource: str, registration: int) -> bool:
        return self.taken.get(resource) == registration

    async def run(self, stop: asyncio.Event, sent: Callable[[], Mapping[str, int]]) -> None:
        """Until ``stop``: ask the kubelet about every resource in ``sent()`` (resource →
        the registration whose device list, with healthy devices, went out) that it has
        not taken yet: every ``poll_seconds`` while one waits, else when a list is sent
        (:meth:`list_sent`), or after ``IDLE_SECONDS`` at the latest."""
        while not stop.is_set():
            waiting = {r: n for r, n in sent().items() if not self.has_taken(r, n)}
            if waiting:
                await self.ask(waiting)
            await self._sent.wait(stop, self.poll_seconds if waiting else IDLE_SECONDS)

    async def ask(self, waiting: Mapping[str, int]) -> None:
        """Ask once; mark the resources whose devices the kubelet can allocate now."""
        counts = await self._allocatable()
        for resource, registration in waiting.items():
            if counts is None or counts.get(resource, 0) > 0:
                if counts is not None:
                    log.info("node %s: the kubelet took the device list of %s", self.node, resource)
                self.taken[resource] = registration

    async def _allocatable(self) -> dict[str, int] | None:
        """Resource → allocatable device count; ``None`` when this kubelet cannot say."""
        try:
            counts = await allocatable_counts(self.socket, ASK_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            if not self._answered and not self.socket.exists():
                return None  # no pod-resources on this node
            log.debug("node %s: pod-resources: %s", self.node, error.details())
            return {}
        self._answered = True
        return counts
