"""What placement sees of a node: each card's free core, free memory and tenants.

A :class:`NodeView` holds no names, UUIDs or pods, only what decides a placement, so
two nodes in the same state have equal (and equally hashed) views: policies and the
trace replay memoize on it. The fold builds one per node state (``NodeState.view``), and
equal views it builds are one object (:func:`build_view`), so a memo keyed by views finds
a node's entry by identity, without comparing eight cards held in memory no other lookup
touched (on 5,000 nodes that comparison was most of the allocator's prioritize).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import msgspec

from gpushare.core.model import Card, CardLink

FULL_CORE = 100

PATH_AFFINITY: dict[str, int] = {"NVLINK": 60, "PIX": 30, "PXB": 20, "PHB": 10, "NODE": 5, "SYS": 0}
"""How well two cards are joined, by path (``nvidia-smi topo -m`` names); NVLink adds its
lane count on top, so NV12 beats NV2."""


class CardView(msgspec.Struct, frozen=True, kw_only=True, cache_hash=True, gc=False):
    index: int
    memory_mib: int
    free_mib: int
    free_core: int
    containers: int = 0
    healthy: bool = True
    model: str = ""

    @property
    def untouched(self) -> bool:
        """Nothing placed on it: it can be given away whole."""
        return (
            self.containers == 0
            and self.free_core == FULL_CORE
            and (self.free_mib == self.memory_mib)
        )


class NodeView(msgspec.Struct, frozen=True, kw_only=True, cache_hash=True, weakref=True):
    cards: tuple[CardView, ...] = ()
    affinity: tuple[tuple[int, ...], ...] = ()
    """``affinity[i][j]`` for the cards at positions i and j of ``cards``; empty = unknown."""
    mps: bool = False
    free_cpu_milli: int | None = None
    """Host CPU still free; ``None`` where kube-scheduler keeps that account, not us."""
    free_host_memory_mib: int | None = None

    @property
    def free_core(self) -> int:
        return sum(card.free_core for card in self.cards if card.healthy)

    def models(self) -> frozenset[str]:
        return frozenset(card.model for card in self.cards)


def link_affinity(link: CardLink) -> int:
    return PATH_AFFINITY.get(link.path, 0) + (link.nvlinks if link.path == "NVLINK" else 0)


def affinity_matrix(
    cards: tuple[Card, ...], links: Iterable[CardLink]
) -> tuple[tuple[int, ...], ...]:
    """The pairwise affinity of ``cards`` by position, from the reporter's links."""
    position = {card.index: at for at, card in enumerate(cards)}
    matrix = [[0] * len(cards) for _ in cards]
    known = False
    for link in links:
        a, b = position.get(link.a), position.get(link.b)
        if a is None or b is None or a == b:
            continue
        matrix[a][b] = matrix[b][a] = link_affinity(link)
        known = True
    return tuple(tuple(row) for row in matrix) if known else ()


def build_view(
    cards: tuple[Card, ...],
    used_mib: Mapping[str, int],
    used_core: Mapping[str, int],
    containers: Mapping[str, int],
    *,
    affinity: tuple[tuple[int, ...], ...] = (),
    mps: bool = False,
) -> NodeView:
    """The view of a node with these cards and uses: the live view equal to it where
    there is one (views are immutable, so sharing one changes no result)."""
    views = tuple(
        CardView(
            index=card.index,
            memory_mib=card.memory_mib,
            free_mib=card.memory_mib - used_mib.get(card.uuid, 0),
            free_core=FULL_CORE - used_core.get(card.uuid, 0),
            containers=containers.get(card.uuid, 0),
            healthy=card.healthy,
            model=card.model,
        )
        for card in cards
    )
    key = (views, affinity, mps)
    view = _LIVE_VIEWS.get(key)
    if view is None:
        _LIVE_VIEWS[key] = view = NodeView(cards=views, affinity=affinity, mps=mps)
    return view


_LIVE_VIEWS: weakref.WeakValueDictionary[
    tuple[tuple[CardView, ...], tuple[tuple[int, ...], ...], bool], NodeView
] = weakref.WeakValueDictionary()
"""Every view a node state holds, each once, by its fields (an entry goes when the last
state holding its view does)."""
