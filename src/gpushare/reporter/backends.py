"""What the reporter needs from a source of GPU inventory, whatever the source is.

Three backends implement it: :class:`gpushare.reporter.nvml.NvmlBackend` (a real node),
:class:`gpushare.reporter.simulated.SimulatedBackend` (cards that exist only in this process)
and :class:`gpushare.reporter.fixture.FixtureBackend` (a replay of what NVML once returned).

The methods are synchronous because NVML is: the reporter calls them from a worker thread,
one call at a time per backend, so a card that hangs NVML stalls only its own node's loop.
"""

from __future__ import annotations

from typing import Literal, Protocol

from gpushare.core.model import Card, CardLink
from gpushare.reporter.health import HealthEvent

InventorySource = Literal["nvml", "simulated", "fixture", "koordinator"]


class GpuBackend(Protocol):
    """One node's cards, their health, and the driver that runs them."""

    @property
    def source(self) -> InventorySource:
        """Where the inventory comes from; published as ``InventoryReported.source``."""
        ...

    def read_cards(self) -> tuple[Card, ...]:
        """Every card now, with health applied. Never raises: a card that cannot be read is
        reported unhealthy, with what went wrong as its reason."""
        ...

    def driver_version(self) -> str:
        """The NVIDIA driver version, or ``""`` when there is none (simulated, or unknown)."""
        ...

    def read_links(self) -> tuple[CardLink, ...]:
        """How each pair of the cards last read is joined (NVLink, else the PCIe path), one
        entry per pair with ``a < b``; pairs nobody could place are left out. Never raises."""
        ...

    def mps_enabled(self) -> bool:
        """Whether an MPS control daemon serves the cards (see :mod:`.mps`). Never raises."""
        ...

    def poll_health_events(self, timeout: float) -> list[HealthEvent]:
        """Block up to ``timeout`` seconds for health events and return them (often none).

        The events have already been applied: the next :meth:`read_cards` shows them.
        """
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML's event set and library); wake a waiting poll."""
        ...
