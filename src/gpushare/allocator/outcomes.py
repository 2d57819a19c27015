"""Waiting for the binder's verdict on a reservation, as the fold learns of it.

Bind must not answer kube-scheduler before the Binding exists (protocols.md D.4): an
early success leaves the pod assumed forever if the binder then fails. So each bind
registers a future under its reservation id *before* appending, and the follower's
listener resolves it when ``PodBound``, ``BindFailed`` or ``PodReleased`` arrives.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from gpushare.core.events import AnyEvent, BindFailed, PodBound, PodReleased
from gpushare.core.state import NodeState

log = logging.getLogger(__name__)


class BindOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The binder's verdict on a reservation, as the log tells it."""

    bound: bool
    reason: str = ""


class BindAnswer(msgspec.Struct, frozen=True):
    """What bind tells kube-scheduler (``error``, empty on success) and the metric label."""

    outcome: str
    error: str = ""


BOUND = BindAnswer("bound")


def outcome_of(event: AnyEvent) -> tuple[str, BindOutcome] | None:
    """The reservation an event settles, and how; ``None`` for events that settle nothing."""
    if isinstance(event, PodBound):
        return event.reservation_id, BindOutcome(bound=True)
    if isinstance(event, BindFailed):
        return event.reservation_id, BindOutcome(bound=False, reason=event.reason)
    if isinstance(event, PodReleased):
        detail = f": {event.detail}" if event.detail else ""
        reason = f"the reservation was released before binding ({event.reason}{detail})"
        return event.reservation_id, BindOutcome(bound=False, reason=reason)
    return None


class OutcomeWaiters:
    """Futures keyed by reservation id; several binds may wait on the same reservation."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[asyncio.Future[BindOutcome]]] = {}

    def expect(self, reservation_id: str) -> asyncio.Future[BindOutcome]:
        future: asyncio.Future[BindOutcome] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(reservation_id, []).append(future)
        return future

    def forget(self, reservation_id: str, future: asyncio.Future[BindOutcome]) -> None:
        futures = self._waiting.get(reservation_id, [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self._waiting.pop(reservation_id, None)

    def on_event(self, seq: int, event: AnyEvent, node: NodeState) -> None:
        """A ``LogFollower`` listener: settle whoever waits on this event's reservation."""
        settled = outcome_of(event)
        if settled is None:
            return
        reservation_id, outcome = settled
        for future in self._waiting.pop(reservation_id, []):
            if not future.done():
                future.set_result(outcome)
        log.debug("seq %d settles %s on %s: %s", seq, reservation_id, node.name, outcome)

    async def wait(
        self, reservation_id: str, future: asyncio.Future[BindOutcome], seconds: float
    ) -> BindOutcome | None:
        """The outcome, or ``None`` after ``seconds``."""
        try:
            return await asyncio.wait_for(future, seconds)
        except TimeoutError:
            return None
        finally:
            self.forget(reservation_id, future)

    def __len__(self) -> int:
        return sum(len(futures) for futures in self._waiting.values())
