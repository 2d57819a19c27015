"""One value per pod, kept from the pod releaser's list and watch.

The releaser (:class:`~gpushare.binder.releasing.PodReleaser`) follows every pod of the
cluster and feeds each :class:`PodIndex` the binder keeps: what each GPU pod asked
(:mod:`.asking`), where each pod was last seen (:mod:`.sighting`) and the pods a
reconcile pass may correct (:mod:`.watched_pods`). An index says what it keeps of a pod
(:meth:`PodIndex.value_of`); a pod it keeps nothing of is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from gpushare.core.pods import Pod

V = TypeVar("V")


class PodIndex(Generic[V]):
    """What :meth:`value_of` keeps of each pod, by uid."""

    def __init__(self) -> None:
        self._by_uid: dict[str, V] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def value_of(self, pod: Pod) -> V | None:
        """What to keep of ``pod``; None: nothing."""
        raise NotImplementedError

    def remember(self, pod: Pod) -> None:
        value = self.value_of(pod)
        if value is None:
            self._by_uid.pop(pod.metadata.uid, None)
        else:
            self._by_uid[pod.metadata.uid] = value

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def replace(self, pods: Iterable[Pod]) -> None:
        """Start over from a complete pod list."""
        self._by_uid = {}
        for pod in pods:
            self.remember(pod)
