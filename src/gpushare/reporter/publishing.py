"""The reporter loop for one node: read the cards, publish what changed, and keep a heartbeat.

``InventoryReported`` goes out at once when the inventory changes (a card appeared, a
health event marked one unhealthy, an MPS daemon started) and otherwise every
``heartbeat_seconds``: consumers take three silent periods to mean the node is gone
(``core.fit.STALE_AFTER_HEARTBEATS``).

Each event's ``id`` (its ``Nats-Msg-Id``) is derived from the node, a digest of what is
reported, and the heartbeat period the report falls in. A retried publish, or two reporter
pods for one node during a rolling update, therefore send the same id and the stream keeps
one copy. Within one process an id is never reused inside the stream's duplicate window
(the content flapping back, the wall clock stepping back), or that report would be dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import msgspec

from gpushare.bus.nats_types import NatsError
from gpushare.bus.streams import DUPLICATE_WINDOW_SECONDS
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.events import FrontDoor, InventoryReported
from gpushare.core.model import Card, CardLink
from gpushare.core.ports import Clock
from gpushare.reporter import metrics
from gpushare.reporter.backends import GpuBackend, InventorySource
from gpushare.reporter.health import HealthEvent

log = logging.getLogger(__name__)

PublishInventory = Callable[[InventoryReported], Awaitable[int]]
"""Appends one inventory event (``bus.log.publish_inventory`` bound to a JetStream context)."""

PUBLISH_ERRORS = (NatsError, OSError, TimeoutError)
"""What a publish raises while NATS is away; the reporter retries on its next round."""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What the backend reported in one read, and a digest that changes when any of it does."""

    cards: tuple[Card, ...]
    driver_version: str
    links: tuple[CardLink, ...] = ()
    mps: bool = False
    digest: str


class Published(msgspec.Struct, frozen=True, kw_only=True):
    digest: str
    monotonic: float


def inventory_digest(
    source: InventorySource,
    driver_version: str,
    cards: tuple[Card, ...],
    links: tuple[CardLink, ...] = (),
    mps: bool = False,
    *,
    front_door: FrontDoor = "extender",
) -> str:
    """Changes when anything reported does. Without links, MPS or DRA it is what reporters
    that knew none of them computed, so their ids and ours agree during a rolling update."""
    reported: tuple[object, ...] = (source, driver_version, cards)
    if links or mps:
        reported = (*reported, links, mps)
    if front_door != "extender":
        reported = (*reported, front_door)
    return hashlib.sha256(msgspec.json.encode(reported)).hexdigest()[:16]


def heartbeat_tick(at: datetime, heartbeat_seconds: float) -> int:
    """The number of the heartbeat period ``at`` falls in, counted from the epoch."""
    return int(at.timestamp() // heartbeat_seconds)


def inventory_event_id(node: str, digest: str, tick: int, attempt: int = 0) -> str:
    """Same node, content and period: same id. ``attempt`` > 0 only to avoid reusing one."""
    base = f"inventory:{node}:{digest}:{tick}"
    return base if attempt == 0 else f"{base}:{attempt}"


class NodeReporter:
    """Publishes one node's inventory: on change, and as a heartbeat."""

    def __init__(
        self,
        node: str,
        backend: GpuBackend,
        publish: PublishInventory,
        *,
        clock: Clock | None = None,
        heartbeat_seconds: float = 5.0,
        poll_seconds: float = 1.0,
        front_door: FrontDoor = "extender",
    ) -> None:
        self.node = node
        self.front_door = front_door
        self.backend = backend
        self._publish = publish
        self._clock = clock or SYSTEM_CLOCK
        self.heartbeat_seconds = heartbeat_seconds
        self.poll_seconds = poll_seconds
        self._last: Published | None = None
        self._recent_ids: dict[str, float] = {}
        self._log = logging.LoggerAdapter(log, {"node": node})

    async def run(self, stopping: asyncio.Event) -> None:
        """Report until ``stopping`` is set; returns within ``poll_seconds`` of that."""
        self._log.info(
            "%s: reporting %s inventory, heartbeat every %ss",
            self.node,
            self.backend.source,
            self.heartbeat_seconds,
        )
        while not stopping.is_set():
            await self.report_once()
            if stopping.is_set():
                break
            await self.wait_for_health_events()
        self._log.info("%s: reporter stopped", self.node)

    async def report_once(self) -> InventoryReported | None:
        """Read the cards; publish if they changed or a heartbeat is due. The event, if sent."""
        snapshot = await self._read()
        if snapshot is None or not self._due(snapshot):
            return None
        event = self._event_for(snapshot)
        changed = self._last is None or self._last.digest != snapshot.digest
        try:
            await self._publish(event)
        except PUBLISH_ERRORS as error:
            self._log.warning(
                "%s: publishing the inventory failed (%s); will retry", self.node, error
            )
            metrics.PUBLISHES.labels(self.node, "failed").inc()
            return None
        metrics.PUBLISHES.labels(self.node, "changed" if changed else "heartbeat").inc()
        self._remember(snapshot, event)
        return event

    async def wait_for_health_events(self) -> list[HealthEvent]:
        """Let the backend wait for health events until the next heartbeat (or poll) is due."""
        timeout = self._wait_timeout()
        try:
            events = await asyncio.to_thread(self.backend.poll_health_events, timeout)
        except Exception:
            self._log.exception("%s: polling health events failed", self.node)
            metrics.BACKEND_ERRORS.labels(self.node, "health_poll").inc()
            await asyncio.sleep(timeout)
            return []
        for event in events:
            what = event.card_uuid or "every card"
            state = "healthy again" if event.healthy else f"unhealthy: {event.reason}"
            self._log.warning("%s: %s is %s", self.node, what, state)
        return events

    async def _read(self) -> Snapshot | None:
        try:
            snapshot = await asyncio.to_thread(self._read_backend)
        except Exception:
            # A backend must not raise; if one does, skip this round rather than die. Its
            # heartbeats stop, so consumers stop trusting the node: the honest outcome.
            self._log.exception("%s: reading the GPU inventory failed", self.node)
            metrics.BACKEND_ERRORS.labels(self.node, "read").inc()
            return None
        metrics.count_cards(self.node, snapshot.cards)
        return snapshot

    def _read_backend(self) -> Snapshot:
        """One read of everything reported: the cards first, since links are theirs."""
        backend = self.backend
        cards = backend.read_cards()
        driver, links, mps = backend.driver_version(), backend.read_links(), backend.mps_enabled()
        digest = inventory_digest(
            backend.source, driver, cards, links, mps, front_door=self.front_door
        )
        return Snapshot(cards=cards, driver_version=driver, links=links, mps=mps, digest=digest)

    def _due(self, snapshot: Snapshot) -> bool:
        if self._last is None or snapshot.digest != self._last.digest:
            return True
        return self._clock.monotonic() - self._last.monotonic >= self.heartbeat_seconds

    def _wait_timeout(self) -> float:
        """Until the next heartbeat, at most ``poll_seconds``; a full poll after a failure."""
        if self._last is None:
            return self.poll_seconds
        until_heartbeat = self._last.monotonic + self.heartbeat_seconds - self._clock.monotonic()
        return min(self.poll_seconds, until_heartbeat) if until_heartbeat > 0 else self.poll_seconds

    def _event_for(self, snapshot: Snapshot) -> InventoryReported:
        at = self._clock.now()
        return InventoryReported(
            id=self._unused_id(snapshot.digest, heartbeat_tick(at, self.heartbeat_seconds)),
            at=at,
            node=self.node,
            cards=snapshot.cards,
            source=self.backend.source,
            heartbeat_seconds=self.heartbeat_seconds,
            driver_version=snapshot.driver_version,
            links=snapshot.links,
            mps=snapshot.mps,
            front_door=self.front_door,
        )

    def _unused_id(self, digest: str, tick: int) -> str:
        """The first id for (node, digest, tick) this process has not sent within the window."""
        now = self._clock.monotonic()
        self._recent_ids = {
            sent: at for sent, at in self._recent_ids.items() if now - at < DUPLICATE_WINDOW_SECONDS
        }
        attempt = 0
        while inventory_event_id(self.node, digest, tick, attempt) in self._recent_ids:
            attempt += 1
        return inventory_event_id(self.node, digest, tick, attempt)

    def _remember(self, snapshot: Snapshot, event: InventoryReported) -> None:
        now = self._clock.monotonic()
        self._recent_ids[event.id] = now
        changed = self._last is None or self._last.digest != snapshot.digest
        self._last = Published(digest=snapshot.digest, monotonic=now)
        if changed:
            healthy = sum(card.healthy for card in snapshot.cards)
            self._log.info(
                "%s: published inventory %s: %d cards (%d healthy), %d links, MPS %s",
                self.node,
                event.id,
                len(snapshot.cards),
                healthy,
                len(snapshot.links),
                "on" if snapshot.mps else "off",
            )
        else:
            self._log.debug("%s: heartbeat %s", self.node, event.id)
