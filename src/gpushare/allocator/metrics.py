"""The allocator's Prometheus metrics, in a registry of its own.

One registry per app (not the process-global one) so that several allocators can run
in one process, as the tests and benchmarks do.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpushare.allocator.card_gauges import CardGauges
from gpushare.bus.follow import LogFollower
from gpushare.bus.lag import LogLag

VERBS = ("filter", "prioritize", "bind")
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

CONTENT_TYPE = CONTENT_TYPE_LATEST


class AllocatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram(
            "gpushare_extender_request_seconds",
            "Time to answer one kube-scheduler extender call, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queued = Histogram(
            "gpushare_extender_queue_seconds",
            "Time from the first bytes of one kube-scheduler extender call to its verb "
            "starting, by verb: its wait for the allocator's event loop.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "gpushare_extender_bad_requests",
            "Calls refused for their body: not extender/v1 (or AdmissionReview) JSON, nested too "
            "deep (400), or too large (413).",
            ["verb"],
            registry=self.registry,
        )
        self.filter_failures = Counter(
            "gpushare_filter_failed_nodes",
            "Nodes the filter rejected, by kind of reason.",
            ["kind"],
            registry=self.registry,
        )
        self.append_conflicts = Counter(
            "gpushare_append_conflicts",
            "Reservations refused by compare-and-set because the node changed; re-decided.",
            registry=self.registry,
        )
        self.bind_outcomes = Counter(
            "gpushare_bind_outcomes",
            "Answers to bind, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        for verb in VERBS:
            self.latency.labels(verb)
            self.queued.labels(verb)
        self.lag: LogLag | None = None
        self.cards: CardGauges | None = None

    def watch(self, follower: LogFollower, *, cards: bool = True) -> None:
        """Report the follower's log lag and, with ``cards``, its per-card state (computed
        at each scrape)."""
        if self.lag is not None:
            return
        self.lag = LogLag("allocator", [follower])
        self.registry.register(self.lag)
        if cards:
            self.cards = CardGauges(lambda: follower.state)

    async def refresh(self) -> None:
        """What a scrape must read first (the stream's last sequence)."""
        if self.lag is not None:
            await self.lag.refresh()

    def count_filter_failures(self, kinds: Mapping[str, int]) -> None:
        """Add a whole filter call's rejections at once (one increment per kind, not per node)."""
        for kind, count in kinds.items():
            self.filter_failures.labels(kind).inc(count)

    def exposition(self) -> bytes:
        cards = b"" if self.cards is None else self.cards.exposition()
        return generate_latest(self.registry) + cards
