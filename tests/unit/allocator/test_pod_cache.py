"""The bounded memory of filtered pods that bind relies on."""

from __future__ import annotations

from gpushare.allocator.pod_cache import PodCache, RememberedPod
from gpushare.core.model import PodRef
from gpushare.core.requests import PodRequest


def pod(uid: str) -> RememberedPod:
    return RememberedPod(
        ref=PodRef(namespace="ns", name=uid, uid=uid), request=PodRequest(containers=())
    )


def test_keeps_at_most_capacity_dropping_the_least_recently_used() -> None:
    cache = PodCache(2)
    cache.remember(pod("a"))
    cache.remember(pod("b"))
    assert cache.get("a") == pod("a")  # a is now the most recently used
    cache.remember(pod("c"))
    assert len(cache) == 2
    assert cache.get("b") is None
    assert cache.get("a") == pod("a")
    assert cache.get("c") == pod("c")


def test_pods_without_a_uid_are_not_remembered() -> None:
    cache = PodCache(10)
    cache.remember(pod(""))
    assert len(cache) == 0
