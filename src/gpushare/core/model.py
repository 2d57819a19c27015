"""Frozen values shared by events, state and placement."""

from __future__ import annotations

from typing import Literal

import msgspec


class Card(msgspec.Struct, frozen=True, kw_only=True, gc=False):
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


LinkPath = Literal["NVLINK", "PIX", "PXB", "PHB", "NODE", "SYS"]
"""How two cards reach each other, best first, in ``nvidia-smi topo -m``'s words: NVLink;
one PCIe switch (PIX); several switches (PXB); the host bridge (PHB); the NUMA node's
interconnect (NODE); across sockets (SYS)."""

LINK_PATHS: tuple[str, ...] = ("NVLINK", "PIX", "PXB", "PHB", "NODE", "SYS")


class CardLink(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How two cards of one node are connected (one entry per unordered pair)."""

    a: int
    """NVML index of one card."""
    b: int
    """NVML index of the other card (``a < b``)."""
    path: LinkPath
    nvlinks: int = 0
    """Active NVLink lanes joining the two cards (0 when they talk over PCIe)."""


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A namespaced object as Kubernetes names it: a pod or a claim."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodRef(ObjectRef, frozen=True, kw_only=True):
    """A pod as Kubernetes names it. ``uid`` tells apart pods that reuse a name."""


class ClaimRef(ObjectRef, frozen=True, kw_only=True):
    """A DRA ResourceClaim as Kubernetes names it. ``uid`` tells apart reused names."""


class ContainerShare(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The part of one card given to one container."""

    container: str
    card_index: int
    card_uuid: str
    memory_mib: int
    core_percent: int = 0
    """Compute share of the card in percent (100 = the whole card); 0 when only memory was asked."""
    init: bool = False
    """An init container: it runs before the app containers, so its share is not added to theirs."""
    sidecar: bool = False
    """A native sidecar (an init container with ``restartPolicy: Always``): it starts in
    its place among the init containers and runs until the pod ends, so its share adds to
    the app containers' and to every init container started after it. Not ``init``."""

    @property
    def role(self) -> Literal["init", "sidecar", "app"]:
        """How the kubelet runs the container: ``init`` (to completion, before the next),
        ``sidecar`` (beside everything started after it) or ``app``."""
        return "init" if self.init else "sidecar" if self.sidecar else "app"
