"""What a pod holds at its peak, as the kubelet runs its containers (KEP-753; pure).

Init containers run one at a time, each to completion, beside the native sidecars
started before it; then the app containers run beside every sidecar, for the pod's life.
So a key (a card) holds the larger of (apps + sidecars) and, for each init container,
(it + the sidecars before it): Kubernetes' own sizing of a pod
(``component-helpers/resource/helpers.go``, ``PodRequests``), per card. The fold
(:func:`gpushare.core.state.memory_by_card`), placement and a request's pod-wide size all
count with :func:`peak_by_key`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def peak_by_key(held: Iterable[tuple[K, bool, int]]) -> dict[K, int]:
    """Per key, the most held at any one moment. ``held`` is ``(key, init, amount)`` per
    container and key, in the pod's order: init containers and sidecars in spec order,
    then the app containers (a sidecar and an app container are not ``init``)."""
    running: dict[K, int] = {}
    """Sidecars and app containers so far: they never stop while the pod runs."""
    peak: dict[K, int] = {}
    for key, init, amount in held:
        if init:
            peak[key] = max(peak.get(key, 0), running.get(key, 0) + amount)
        else:
            running[key] = running.get(key, 0) + amount
    return {key: max(running.get(key, 0), peak.get(key, 0)) for key in running.keys() | peak.keys()}
