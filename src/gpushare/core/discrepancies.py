"""``DiscrepancyFound``, built in one place for every reconciler that appends one.

The binder's reconciler (:mod:`gpushare.core.reconciliation`: ``annotation_mismatch``)
and the node agent's pod-resources check (``card_mismatch``, ``unknown_to_log``,
``missing_from_kubelet``, ``foreign_overlap``) record what they cannot correct
themselves. The id is ``discrepancy-<kind>-<identity>``, the identity derived by the
finder from what it found, so the same finding is the same event (the log drops the
repeat).
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from gpushare.core.events import DiscrepancyFound, DiscrepancyKind
from gpushare.core.model import PodRef


def digest(*parts: object) -> str:
    """16 hex digits naming ``parts`` (their ``repr``), for event ids."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def discrepancy(
    *,
    kind: DiscrepancyKind,
    identity: str,
    node: str,
    at: datetime,
    detail: str,
    reporter: str,
    pod: PodRef | None = None,
    reservation_id: str = "",
) -> DiscrepancyFound:
    """The event recording a ``kind`` discrepancy found on ``node`` by ``reporter``."""
    return DiscrepancyFound(
        id=f"discrepancy-{kind}-{identity}",
        at=at,
        node=node,
        kind=kind,
        detail=detail,
        pod=pod,
        reservation_id=reservation_id,
        reporter=reporter,
    )
