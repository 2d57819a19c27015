"""Issue 14: a bad combination gets the same answer from the webhook, filter and bind;
and bind searches for a placement once.

Each pod below breaks one rule of ``core.requests.validate_pod``: the admission webhook
denies it (403, the rule), filter fails every node with the same words
(FailedAndUnresolvableNodes), and bind, reading the same pod from the API, answers the
same words as its ``Error`` (kube-scheduler turns that into the pod's FailedScheduling
event).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest

from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core import placement
from gpushare.core.events import PodBound, PodReserved
from gpushare.core.requests import MULTIPLE_GPU_ANNOTATION, POLICY_ANNOTATION
from tests.fakes import memory_log, offline_follower
from tests.unit.allocator.builders import (
    binding_args,
    gpu_pod,
    names_args,
    node_events,
    now,
)
from tests.unit.allocator.fakes import DictPodSource

PREFIX = "/gpushare-scheduler"
NODES = ["n1", "n2"]


def annotated(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    changed["metadata"]["annotations"] = dict(annotations)
    return changed


def with_limits(name: str, limits: dict[str, str]) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["containers"][0]["resources"] = {"limits": limits, "requests": dict(limits)}
    return pod


BAD = [
    pytest.param(
        annotated(gpu_pod("a", 1024), **{POLICY_ANNOTATION: "no-such-policy"}),
        "unknown-policy",
        id="a-unknown-policy",
    ),
    pytest.param(
        with_limits("b", {"gpushare.io/gpu-core": "200", "gpushare.io/gpu-memory-ratio": "100"}),
        "core-ratio-mismatch",
        id="b-core-200-ratio-100",
    ),
    pytest.param(
        annotated(gpu_pod("c", 1024), **{MULTIPLE_GPU_ANNOTATION: "2"}),
        "multiple-gpu-with-aliyun",
        id="c-volcano-on-aliyun",
    ),
]


def review(pod: dict[str, Any]) -> bytes:
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    request = {
        "uid": "u-1",
        "kind": kind,
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"],
        "namespace": pod["metadata"]["namespace"],
        "operation": "CREATE",
        "userInfo": {"username": "tester"},
        "object": {"apiVersion": "v1", "kind": "Pod", **pod},
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body).encode()


@pytest.fixture
def events() -> list[Any]:
    return [*node_events("n1", [0, 0]), *node_events("n2", [0, 0])]


async def client_over(events: list[Any], *pods: dict[str, Any]) -> httpx.AsyncClient:
    follower = offline_follower(events)
    settings = AllocatorSettings(replica_id="t", bind_wait_seconds=2.0)
    app = create_app(follower, settings, clock=SYSTEM_CLOCK, pod_source=DictPodSource(*pods))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x")


@pytest.mark.parametrize(("pod", "rule"), BAD)
async def test_webhook_filter_and_bind_give_the_same_answer(
    events: list[Any], pod: dict[str, Any], rule: str
) -> None:
    async with await client_over(events, pod) as http:
        denial = (await http.post(f"{PREFIX}/admission/validate", content=review(pod))).json()
        filtered = await http.post(f"{PREFIX}/filter", content=names_args(pod, NODES))
        bound = await http.post(f"{PREFIX}/bind", content=binding_args(pod, "n1"))
    answer = denial["response"]
    assert answer["allowed"] is False
    assert (answer["status"]["code"], answer["status"]["reason"]) == (403, "Forbidden")
    message = answer["status"]["message"]
    assert message.startswith(f'gpushare: rule "{rule}": ')

    assert filtered.status_code == 200
    body = filtered.json()
    assert body["NodeNames"] == []
    assert body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, message)

    assert bound.status_code == 200  # kube-scheduler reads Error only from a 200
    assert bound.json() == {"Error": message}


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every placement search (a ``core.placement._Search``, whether ``plan_pod`` or
    ``can_place`` starts it, or ``plan_pod``'s one-card shortcut), by its policy."""
    ran: list[str] = []
    original = placement._Search.__init__
    one_card = placement._plan_one_card

    def spy(search: Any, *args: Any, **kwargs: Any) -> None:
        original(search, *args, **kwargs)
        ran.append(search.policy.name)

    def spy_one_card(view: Any, request: Any, policy: Any, *args: Any) -> Any:
        ran.append(policy.name)
        return one_card(view, request, policy, *args)

    monkeypatch.setattr(placement._Search, "__init__", spy)
    monkeypatch.setattr(placement, "_plan_one_card", spy_one_card)
    return ran


@pytest.mark.parametrize("filtered", [True, False])
async def test_bind_searches_once_and_not_at_all_for_a_pod_filter_planned(
    events: list[Any], searches: list[str], filtered: bool
) -> None:
    """A pod filter placed keeps the cards filter planned it on (no search); one that
    filter never saw (another replica's) is planned once."""
    pod = gpu_pod("p", 1024)
    follower = offline_follower(events)
    log = memory_log(follower)

    def bind_now(seq: int, event: Any, node: Any) -> None:
        if isinstance(event, PodReserved):
            bound = PodBound(
                id="b", at=now(), node=event.node, pod=event.pod, reservation_id=event.id
            )
            log.write(bound, deliver=True)

    follower.listen(bind_now)
    settings = AllocatorSettings(replica_id="t", policy="binpack")
    app = create_app(follower, settings, clock=SYSTEM_CLOCK, pod_source=DictPodSource(pod))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        if filtered:
            filter_answer = await c.post(f"{PREFIX}/filter", content=names_args(pod, NODES))
            assert filter_answer.json()["NodeNames"] == ["n1"]
        searches.clear()  # filter's own searches are not bind's
        response = await c.post(f"{PREFIX}/bind", content=binding_args(pod, "n1"))
    assert response.json() == {"Error": ""}
    assert searches == ([] if filtered else ["binpack"])


async def test_bind_that_fits_nowhere_still_searches_once(searches: list[str]) -> None:
    pod = gpu_pod("p", 1024)
    full = node_events("n1", [16276, 16276])
    async with await client_over(full, pod) as http:
        response = await http.post(f"{PREFIX}/bind", content=binding_args(pod, "n1"))
    error = response.json()["Error"]
    assert error.startswith("cannot reserve a GPU on n1: needs 1024 MiB of GPU memory")
    assert len(searches) == 1
