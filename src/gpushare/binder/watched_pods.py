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

import asyncio
from collections.abc import Iterable

from gpushare.binder.pod_index import PodIndex
from gpushare.bus.follow import LogFollower
from gpushare.core.annotations import asked_resources
from gpushare.core.pods import Pod
from gpushare.core.reconciliation import carries_claim


class WatchedPods(PodIndex[Pod]):
    """The last seen version of every pod a pass may correct, by uid."""

    def __init__(self, follower: LogFollower) -> None:
        super().__init__()
        self._follower = follower
        self._listed = asyncio.Event()

    def value_of(self, pod: Pod) -> Pod | None:
        concerns_gpushare = (
            carries_claim(pod)
            or self._follower.state.allocation(pod.metadata.uid) is not None
            or bool(asked_resources(pod))
        )
        return pod if concerns_gpushare else None

    @property
    def listed(self) -> bool:
        """Whether a complete pod list has been taken in."""
        return self._listed.is_set()

    async def wait_listed(self) -> None:
        await self._listed.wait()

    def replace(self, pods: Iterable[Pod]) -> None:
        super().replace(pods)
        self._listed.set()

    def pods(self) -> tuple[Pod, ...]:
        return tuple(self._by_uid.values())

    def get(self, uid: str) -> Pod | None:
        return self._by_uid.get(uid)
