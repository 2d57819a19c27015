"""Allocated and free memory and core of every card, read from the fold at scrape time.

Nothing is updated per event: :class:`CardGauges` reads the follower's current
:class:`~gpushare.core.state.ClusterState` when Prometheus asks, so the figures are
exactly the fold's (allocated: what the log reserved; free: what placement sees, with
cards held by other device plugins counted as wholly used).

A scrape is answered on the allocator's event loop, so it must not cost what the cluster
is large: seven gauges a card are 560,000 samples at 10,000 nodes of 8 cards, and building
them as ``prometheus_client`` metric objects took 3.3-3.4 s (48 MB of text), during which
no filter or bind was answered. Each node's lines are therefore kept with what they were
rendered from (its cards, their placement view and what the log reserved on them, all
immutable values), and a scrape renders again only the nodes where one of those changed:
an inventory heartbeat gives a node a new state but equal cards, and renders nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpushare.core.model import Card
from gpushare.core.state import ClusterState, NodeState
from gpushare.core.view import CardView

PREFIX = "gpushare_allocator_card"
LABELS = ("node", "card", "uuid")

Reading = Callable[[NodeState, Card, CardView], int]
"""A gauge's value for one card: every one is a whole number (MiB, percent, a count)."""


@dataclass(frozen=True)
class CardGauge:
    suffix: str
    help: str
    read: Reading

    @property
    def name(self) -> str:
        return f"{PREFIX}_{self.suffix}"

    @property
    def header(self) -> bytes:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} gauge\n".encode()


GAUGES: tuple[CardGauge, ...] = (
    CardGauge("memory_mib", "Memory of the card (MiB), as reported.", lambda n, c, v: c.memory_mib),
    CardGauge(
        "allocated_memory_mib",
        "Memory reserved on the card by the allocation log (MiB).",
        lambda n, c, v: n.used_mib.get(c.uuid, 0),
    ),
    CardGauge(
        "free_memory_mib",
        "Memory placement can still give on the card (MiB).",
        lambda n, c, v: v.free_mib,
    ),
    CardGauge(
        "allocated_core_percent",
        "Compute reserved on the card by the allocation log (percent of the card).",
        lambda n, c, v: n.used_core.get(c.uuid, 0),
    ),
    CardGauge(
        "free_core_percent",
        "Compute placement can still give on the card (percent of the card).",
        lambda n, c, v: v.free_core,
    ),
    CardGauge("containers", "Containers placed on the card.", lambda n, c, v: v.containers),
    CardGauge("healthy", "1 if the card is healthy, else 0.", lambda n, c, v: int(c.healthy)),
)


def _label(value: str) -> str:
    """A label value as the text format escapes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(*values: str) -> str:
    """``{node="...",card="...",uuid="..."} ``: :data:`LABELS` with ``values``."""
    pairs = ",".join(
        f'{name}="{_label(value)}"' for name, value in zip(LABELS, values, strict=True)
    )
    return f"{{{pairs}}} "


def render_node(node: NodeState) -> tuple[bytes, ...]:
    """The node's samples of each of :data:`GAUGES`, in that order."""
    cards = [
        (_labels(node.name, str(card.index), card.uuid), card, view)
        for card, view in zip(node.cards, node.view.cards, strict=False)
    ]
    return tuple(
        "".join(
            f"{gauge.name}{labels}{gauge.read(node, card, view)}\n" for labels, card, view in cards
        ).encode()
        for gauge in GAUGES
    )


def rendered_from(node: NodeState) -> tuple[object, ...]:
    """What :func:`render_node` reads of ``node`` (its name aside)."""
    return (node.cards, node.view, node.used_mib, node.used_core)


class CardGauges:
    """The text exposition of :data:`GAUGES` for every card of the fold, nodes in name order."""

    def __init__(self, state: Callable[[], ClusterState]) -> None:
        self._state = state
        self._rendered: dict[str, tuple[tuple[object, ...], tuple[bytes, ...]]] = {}
        """Per node, what its lines were rendered from (:func:`rendered_from`), and the
        lines."""

    def exposition(self) -> bytes:
        nodes = self._state().nodes
        rendered: dict[str, tuple[tuple[object, ...], tuple[bytes, ...]]] = {}
        for name in sorted(nodes):
            node, kept = nodes[name], self._rendered.get(name)
            source = rendered_from(node)
            # mostly the very same objects, so comparing is mostly checking identity
            if kept is None or kept[0] != source:
                kept = (source, render_node(node))
            rendered[name] = kept
        self._rendered = rendered  # nodes gone from the fold are forgotten
        parts: list[bytes] = []
        for index, gauge in enumerate(GAUGES):
            parts.append(gauge.header)
            parts.extend(lines[index] for _, lines in rendered.values())
        return b"".join(parts)
