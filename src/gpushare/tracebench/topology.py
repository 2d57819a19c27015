"""NVLink topologies to give a trace's 8-card nodes (the trace itself has none).

``dgx1``: the DGX-1's hybrid cube-mesh (two quads of all-to-all NVLink, NV1 or NV2,
joined card to card across; every other pair crosses the sockets), as the synthetic
fixture ``tests/fixtures/nvml/dgx1-v100-sxm2-32gb-x8-synthetic.json`` reports it.
``nvswitch``: every pair NVLinked through the switches (18 lanes, as on an HGX H100).
``none``: no links, the trace as published.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import msgspec

from gpushare.core.model import CardLink
from gpushare.core.view import link_affinity
from gpushare.tracebench.trace import TraceNode

TOPOLOGY_CARDS = 8
"""Only nodes with this many cards get a topology."""

DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip
"""``nvidia-smi topo -m`` of a DGX-1 (V100): the NVLink lanes between each linked pair."""


def dgx1_links() -> tuple[CardLink, ...]:
    return tuple(
        CardLink(a=a, b=b, path="NVLINK", nvlinks=DGX1_NVLINKS[a, b])
        if (a, b) in DGX1_NVLINKS
        else CardLink(a=a, b=b, path="SYS")
        for a, b in combinations(range(TOPOLOGY_CARDS), 2)
    )


def nvswitch_links() -> tuple[CardLink, ...]:
    return tuple(
        CardLink(a=a, b=b, path="NVLINK", nvlinks=18)
        for a, b in combinations(range(TOPOLOGY_CARDS), 2)
    )


TOPOLOGIES = ("none", "dgx1", "nvswitch")


def topology_affinity(name: str) -> tuple[tuple[int, ...], ...]:
    """The affinity matrix (``core.view``) of topology ``name`` for an 8-card node."""
    if name == "none":
        return ()
    links = {"dgx1": dgx1_links, "nvswitch": nvswitch_links}.get(name)
    if links is None:
        raise ValueError(f"unknown topology {name!r} (known: {', '.join(TOPOLOGIES)})")
    matrix = [[0] * TOPOLOGY_CARDS for _ in range(TOPOLOGY_CARDS)]
    for link in links():
        matrix[link.a][link.b] = matrix[link.b][link.a] = link_affinity(link)
    return tuple(tuple(row) for row in matrix)


def with_topology(nodes: Sequence[TraceNode], name: str) -> tuple[TraceNode, ...]:
    """``nodes`` with topology ``name`` on each 8-card node (``none``: unchanged)."""
    affinity = topology_affinity(name)
    return tuple(
        msgspec.structs.replace(node, affinity=affinity) if node.gpus == TOPOLOGY_CARDS else node
        for node in nodes
    )
