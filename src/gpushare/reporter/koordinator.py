"""A node whose cards are read from its Koordinator ``Device`` (``--source koordinator-device``).

On a cluster where koordlet already reports every GPU (``scheduling.koordinator.sh/v1alpha1``
``Device``, named after the node), the reporter can publish that instead of asking NVML
itself: same cards (minor as index, UUID, memory, health), the driver version and model
from the Device's labels, PCIe/NUMA links from its topology
(:func:`gpushare.core.koordinator.read_device`).

The Device is polled: read again at most every ``refresh_seconds`` (the heartbeat), and a
change is published on the read that sees it. While the API cannot be read the last good
inventory is kept (the cards are still there; only the news of them is late); with none
yet, :meth:`read_cards` raises and the reporter skips the round, so no heartbeat claims
a node it knows nothing of. A Device that is missing (or that Koordinator has not
created yet) reports no cards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpushare.core.koordinator import (
    KoordinatorDeviceError,
    KoordinatorInventory,
    read_device,
)
from gpushare.core.model import Card, CardLink
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError
from gpushare.kube.koordinator_devices import read_koordinator_device
from gpushare.reporter.backends import InventorySource
from gpushare.reporter.health import HealthEvent

log = logging.getLogger(__name__)

ReadDevice = Callable[[str], Any | None]
"""The node's Device as decoded JSON, ``None`` when it has none; raises when unreadable."""


class KoordinatorDeviceUnavailable(RuntimeError):
    """The node's Device could not be read, and nothing was read before."""


class KoordinatorDeviceBackend:
    """One node's cards as its Koordinator Device lists them."""

    def __init__(
        self,
        node: str,
        read: ReadDevice,
        *,
        refresh_seconds: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.node = node
        self._read = read
        self.refresh_seconds = refresh_seconds
        self._monotonic = monotonic
        self._on_close = on_close
        self._inventory: KoordinatorInventory | None = None
        self._read_at: float | None = None
        self._problems: tuple[str, ...] = ()
        self._closed = threading.Event()
        self._log = logging.LoggerAdapter(log, {"node": node})

    @classmethod
    def connect(
        cls, node: str, kubeconfig: str | None, *, refresh_seconds: float = 5.0
    ) -> KoordinatorDeviceBackend:
        """Reading through the Kubernetes API (kubeconfig, or in-cluster when None)."""
        kube = KubeClient.connect(kubeconfig)
        return cls(
            node,
            lambda name: read_koordinator_device(kube, name),
            refresh_seconds=refresh_seconds,
            on_close=kube.close,
        )

    @property
    def source(self) -> InventorySource:
        return "koordinator"

    def read_cards(self) -> tuple[Card, ...]:
        """The cards as last read; reads the Device again when ``refresh_seconds`` passed."""
        return self._current().cards

    def driver_version(self) -> str:
        return self._current().driver_version

    def read_links(self) -> tuple[CardLink, ...]:
        return self._current().links

    def mps_enabled(self) -> bool:
        return False  # the Device does not say; koordlet's isolation is HAMi-core's, not MPS

    def poll_health_events(self, timeout: float) -> list[HealthEvent]:
        """No events to wait for: health changes arrive with the next read of the Device."""
        self._closed.wait(timeout)
        return []

    def close(self) -> None:
        self._closed.set()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def _current(self) -> KoordinatorInventory:
        now = self._monotonic()
        due = self._read_at is None or now - self._read_at >= self.refresh_seconds
        if due or self._inventory is None:
            self._refresh(now)
        if self._inventory is None:
            raise KoordinatorDeviceUnavailable(f"cannot read the Koordinator Device {self.node}")
        return self._inventory

    def _refresh(self, now: float) -> None:
        try:
            obj = self._read(self.node)
            inventory = (
                KoordinatorInventory(node=self.node, cards=()) if obj is None else read_device(obj)
            )
        except (KubeError, KoordinatorDeviceError, ValueError) as error:
            self._log.warning(
                "%s: reading the Koordinator Device failed (%s); %s",
                self.node,
                error,
                "keeping the last inventory" if self._inventory else "nothing to report yet",
            )
            return
        finally:
            self._read_at = now
        if obj is None and (self._inventory is None or self._inventory.cards):
            self._log.warning("%s: there is no Koordinator Device for this node", self.node)
        if inventory.node != self.node:
            self._log.warning(
                "%s: the Device read is named %s; not this node's", self.node, inventory.node
            )
            return
        self._note_problems(inventory.problems)
        self._inventory = inventory

    def _note_problems(self, problems: tuple[str, ...]) -> None:
        if problems != self._problems:
            for problem in problems:
                self._log.warning("%s: Koordinator Device %s", self.node, problem)
        self._problems = problems
