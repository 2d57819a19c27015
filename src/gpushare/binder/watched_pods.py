"""The pods a reconcile pass may correct, as the releaser's pod list and watch show them.

A pass decides only about pods that ask a GPU resource, carry gpushare's annotations or
hold an allocation in the log (:func:`gpushare.core.reconciliation.reconcile` finds
nothing to do for any other). The releaser already lists every pod and watches from the
list (:class:`~gpushare.binder.releasing.PodReleaser`), so it keeps those pods here, and
the periodic pass checks them first (:meth:`~gpushare.binder.reconciling.Reconciler.probe`)
instead of listing every pod of the cluster each ``--reconcile-interval``: 100,000 pods
are about 100 MB of JSON for the API server to send and the binder to decode. Only when
that check finds something to correct does the pass list the pods, and it corrects from
the list, read after the fold's snapshot, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpushare.bus.follow import LogFollower
from gpushare.core.annotations import asked_resources
from gpushare.core.pods import Pod
from gpushare.core.reconciliation import carries_claim


class WatchedPods:
    """The last seen version of every pod a pass may correct, by uid."""

    def __init__(self, follower: LogFollower) -> None:
        self._follower = follower
        self._by_uid: dict[str, Pod] = {}
        self.listed = False
        """Whether a complete pod list has been taken in (before it, a pass lists)."""

    def __len__(self) -> int:
        return len(self._by_uid)

    def remember(self, pod: Pod) -> None:
        uid = pod.metadata.uid
        if self._concerns_gpushare(pod):
            self._by_uid[uid] = pod
        else:
            self._by_uid.pop(uid, None)

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def replace(self, pods: Iterable[Pod]) -> None:
        """Start over from a complete pod list."""
        self._by_uid = {}
        for pod in pods:
            self.remember(pod)
        self.listed = True

    def pods(self) -> tuple[Pod, ...]:
        return tuple(self._by_uid.values())

    def _concerns_gpushare(self, pod: Pod) -> bool:
        return (
            carries_claim(pod)
            or self._follower.state.allocation(pod.metadata.uid) is not None
            or bool(asked_resources(pod))
        )
