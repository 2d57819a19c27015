"""Frozen values shared by events, state and placement."""

from __future__ import annotations

import msgspec


class Card(msgspec.Struct, frozen=True, kw_only=True):
    """One physical GPU as the reporter saw it."""

    index: int
    """NVML index on its node (may shift when cards are hidden; ``uuid`` is the stable key)."""
    uuid: str
    """NVML UUID, e.g. ``GPU-5f1c...``; the key every allocation refers to."""
    model: str
    """Product name, e.g. ``Tesla V100-SXM2-16GB``."""
    memory_mib: int
    """Total memory in MiB."""
    healthy: bool = True
    health_reason: str = ""
    """Why the card is unhealthy (e.g. ``XID 79``); empty when healthy."""


class PodRef(msgspec.Struct, frozen=True, kw_only=True):
    """A pod as Kubernetes names it. ``uid`` tells apart pods that reuse a name."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ContainerShare(msgspec.Struct, frozen=True, kw_only=True):
    """The part of one card given to one container."""

    container: str
    card_index: int
    card_uuid: str
    memory_mib: int
    init: bool = False
    """An init container: it runs before the app containers, so its share is not added to theirs."""
