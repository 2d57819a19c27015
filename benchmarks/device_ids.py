"""``make bench`` (its last lines): the node agent's advice to the kubelet, in process.

At each container's admission the kubelet calls ``GetPreferredAllocation`` with every
free ID of the resource: with a device per MiB, four 32 GiB cards are 131,072 IDs. The
agent counts them per card, picks a container's IDs from its card, and checks the answer
(:mod:`gpushare.node_agent.matching`), the offer put in a set once for all of them.
Printed: the time of each step for one container of 4,000 MiB, and of the whole advice
(as when the log names no container), p50 and p99 of 50.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from benchmarks.run import percentile
from gpushare.core.model import Card
from gpushare.node_agent.device_table import build_device_table
from gpushare.node_agent.matching import exactly, fallback_ids, offer_of, offered_per_card

CARDS = 4
CARD_MIB = 32768
SIZE = 4000
ROUNDS = 50


def timed(step: Callable[[], object]) -> tuple[float, float]:
    """p50 and p99 of ``step``, in milliseconds."""
    step()  # the table's per-card ID sets are made on first use
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        step()
        samples.append(1000 * (time.perf_counter() - started))
    return percentile(samples, 50), percentile(samples, 99)


def main() -> int:
    cards = [
        Card(
            index=i,
            uuid=f"GPU-{i}0000000-1111-2222-3333-44444444444{i}",
            model="H100",
            memory_mib=CARD_MIB,
        )
        for i in range(CARDS)
    ]
    table = build_device_table(cards, "MiB")
    available = [device for card in table.cards for device in table.ids_of(card)]
    offered = offer_of(available, [])
    chosen = fallback_ids(table, available, [], SIZE, offered=offered)

    def advise() -> object:
        """As ``GetPreferredAllocation`` does when the log names no container."""
        offer = offer_of(available, [])
        picked = fallback_ids(table, available, [], SIZE, offered=offer)
        return exactly(table, SIZE, [], picked, available, offered=offer)

    steps = {
        "put the offer in a set": lambda: offer_of(available, []),
        "count the offer per card": lambda: offered_per_card(table, offered),
        "choose a container's IDs": lambda: fallback_ids(
            table, available, [], SIZE, offered=offered
        ),
        "check the answer": lambda: exactly(table, SIZE, [], chosen, available, offered=offered),
        "the whole advice": advise,
    }
    print(
        f"\nnode agent: advice for one container of {SIZE:,} MiB among {len(available):,} "
        f"free MiB IDs ({CARDS} x {CARD_MIB:,} MiB), in process"
    )
    for name, step in steps.items():
        p50, p99 = timed(step)
        print(f"  {name:<26} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
