"""What a prepared DRA claim gives a container, as a CDI spec (Container Device
Interface): the card by UUID and the same limits the device plugin path sets
(:func:`gpushare.core.environment.container_environment`). The node agent's kubelet
plugin writes it; the runtime applies it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.core.dra import DRIVER
from gpushare.core.environment import container_environment
from gpushare.core.events import ClaimShare
from gpushare.core.model import Card, ContainerShare

CDI_KIND = f"{DRIVER}/gpu"
"""The CDI kind of the devices the kubelet plugin prepares (``vendor/class``)."""
CDI_VERSION = "0.6.0"


def cdi_device_name(claim_uid: str, share: ClaimShare) -> str:
    """The CDI device of one prepared share: unique per claim and request."""
    return f"{claim_uid}-{share.request}-{share.device}"


def cdi_device_id(claim_uid: str, share: ClaimShare) -> str:
    """The fully qualified CDI name the kubelet hands the runtime."""
    return f"{CDI_KIND}={cdi_device_name(claim_uid, share)}"


def cdi_spec(
    claim_uid: str, shares: Sequence[ClaimShare], cards: Mapping[str, Card], *, mps: bool = False
) -> dict[str, Any]:
    """The CDI spec that gives a container each share: the card by UUID and the limits
    the extender path's containers get (:func:`container_environment`). ``cards`` maps
    card UUID to the node's card; raises ``KeyError`` for a share on another card."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": cdi_device_name(claim_uid, share),
                "containerEdits": {
                    "env": [
                        f"{key}={value}"
                        for key, value in sorted(_environment(share, cards, mps).items())
                    ]
                },
            }
            for share in shares
        ],
    }


def _environment(share: ClaimShare, cards: Mapping[str, Card], mps: bool) -> dict[str, str]:
    as_container = ContainerShare(
        container=share.request,
        card_index=share.card_index,
        card_uuid=share.card_uuid,
        memory_mib=share.memory_mib,
        core_percent=share.core_percent,
    )
    return container_environment(
        [as_container],
        cards,
        pod_memory_mib=share.memory_mib,
        memory_unit="MiB",
        mps=mps,
        aliyun=False,
    )
