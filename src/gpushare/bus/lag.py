"""How far :class:`LogFollower`\\ s are behind the allocation log, as Prometheus gauges.

The stream's last sequence needs a JetStream request, and a Prometheus collector is
called synchronously, so a scrape first awaits :meth:`LogLag.refresh` (the metrics
endpoints do) and the collector then reports what that read found against each
follower's ``applied_seq`` at that moment. A follower of one node (the node agent's)
compares with the last message on that node's subject, the only ones it folds, and its
gauges carry a ``node`` label.

Seconds since the last applied event count from the last allocation event the follower
folded live, or from when the gauge was set up if none was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.bus.follow import LogFollower
from gpushare.bus.subjects import ALLOCATION_STREAM, node_allocations
from gpushare.core.events import AnyEvent
from gpushare.core.state import NodeState

log = logging.getLogger(__name__)


class _Followed:
    """One follower, the last sequence it should reach, and when it last folded."""

    def __init__(self, follower: LogFollower, monotonic: Callable[[], float]) -> None:
        self.follower = follower
        self.last_seq: int | None = None
        self.last_applied = monotonic()
        self._monotonic = monotonic
        follower.listen(self._on_event)

    def _on_event(self, seq: int, event: AnyEvent, node: NodeState) -> None:
        if seq:
            self.last_applied = self._monotonic()


class LogLag(Collector):
    """``gpushare_<service>_log_lag_events``, ``..._log_applied_seq`` and
    ``..._log_idle_seconds`` of a service's followers.

    ``js`` is needed only for followers of one node (the whole log's last sequence is
    read through the follower's own :class:`~gpushare.bus.log.AllocationLog`).
    """

    def __init__(
        self,
        service: str,
        followers: Sequence[LogFollower],
        js: JetStreamContext | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.by_node = any(follower.node is not None for follower in followers)
        if self.by_node and js is None:
            raise ValueError("followers of one node need js to read that node's last sequence")
        self.prefix = f"gpushare_{service}_log"
        self._js = js
        self._monotonic = monotonic
        self._followed = [_Followed(follower, monotonic) for follower in followers]

    async def refresh(self) -> None:
        """Read each follower's last sequence to reach; unknown when that read fails."""
        for followed in self._followed:
            followed.last_seq = await self._last_seq(followed.follower)

    async def _last_seq(self, follower: LogFollower) -> int | None:
        try:
            if self._js is None or follower.node is None:
                return await follower.log.last_seq()
            subject = node_allocations(follower.node)
            last = await self._js.get_last_msg(ALLOCATION_STREAM, subject)
            return int(last.seq or 0)
        except NotFoundError:
            return 0
        except Exception as error:
            log.warning("reading the allocation stream's last sequence failed: %s", error)
            return None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node"] if self.by_node else []
        applied = GaugeMetricFamily(
            f"{self.prefix}_applied_seq",
            "The allocation log sequence folded up to.",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            f"{self.prefix}_lag_events",
            "Allocation log events not folded yet: the stream's last sequence (for one "
            "node's follower, that node's last) minus the applied one.",
            labels=labels,
        )
        idle = GaugeMetricFamily(
            f"{self.prefix}_idle_seconds",
            "Seconds since an allocation event was last folded live.",
            labels=labels,
        )
        now = self._monotonic()
        for followed in self._followed:
            follower = followed.follower
            values = [follower.node or ""] if self.by_node else []
            applied.add_metric(values, follower.applied_seq)
            if followed.last_seq is not None:
                lag.add_metric(values, max(0, followed.last_seq - follower.applied_seq))
            idle.add_metric(values, now - followed.last_applied)
        yield from (applied, lag, idle)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())
