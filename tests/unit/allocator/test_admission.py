"""The validating admission webhook in-process: AdmissionReview in, the core's verdict out."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.allocator import admission
from gpushare.allocator.admission import AdmissionReviewer
from gpushare.allocator.admission_wire import decode_review
from gpushare.allocator.extender import create_app
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.wire import WireError
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.pods import Pod
from gpushare.core.requests import PodRequest
from tests.fakes import offline_follower
from tests.unit.allocator.builders import gpu_pod, seed_000_filter_cluster

VALIDATE = "/gpushare-scheduler/admission/validate"
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}


def stored_pod(name: str, *memory: int | str) -> dict[str, Any]:
    """A pod as the kube-apiserver hands it to admission: typed, defaulted, no status yet."""
    pod = gpu_pod(name, *memory)
    pod["spec"] |= {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
    }
    pod["status"] = {}
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def admission_review(
    pod: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    kind: dict[str, str] = POD_KIND,
    resource: str = "pods",
    sub_resource: str | None = None,
) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview shaped as the kube-apiserver sends it."""
    gvr = {"group": kind["group"], "version": kind["version"], "resource": resource}
    options_kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}.get(
        operation, "DeleteOptions"
    )
    meta = (pod or old or {}).get("metadata", {})
    request: dict[str, Any] = {
        "uid": UID,
        "kind": kind,
        "resource": gvr,
        "requestKind": kind,
        "requestResource": gvr,
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {
            "username": "system:serviceaccount:kube-system:replicaset-controller",
            "uid": "8f6a1d43-5f0c-4a8e-9d1e-2b7c3f7b1c11",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/pod-name": ["kube-controller-manager-cp"]},
        },
        "object": pod,
        "oldObject": old,
        "dryRun": False,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
    }
    if sub_resource is not None:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def body_of(review: dict[str, Any]) -> bytes:
    return json.dumps(review).encode()


def with_gpu_mem(pod: dict[str, Any], *, limit: Any, request: Any) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    resources = changed["spec"]["containers"][0]["resources"]
    resources["limits"]["aliyun.com/gpu-mem"] = limit
    resources["requests"]["aliyun.com/gpu-mem"] = request
    return changed


def allowed(uid: str = UID) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True},
    }


def app_with(**overrides: Any) -> FastAPI:
    follower = offline_follower(seed_000_filter_cluster())
    return create_app(follower, AllocatorSettings(replica_id="t", **overrides), clock=SYSTEM_CLOCK)


async def post_review(
    client: httpx.AsyncClient, path: str, review: dict[str, Any]
) -> dict[str, Any]:
    """A webhook's answer to ``review``: always HTTP 200 with an AdmissionReview."""
    response = await client.post(path, content=body_of(review))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    answer: dict[str, Any] = response.json()
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    return answer


async def post(client: httpx.AsyncClient, review: dict[str, Any]) -> dict[str, Any]:
    return await post_review(client, VALIDATE, review)


async def test_a_valid_gpu_pod_is_allowed(webhook: httpx.AsyncClient) -> None:
    assert await post(webhook, admission_review(stored_pod("p", 8138))) == allowed()


async def test_a_pod_without_gpu_is_allowed(webhook: httpx.AsyncClient) -> None:
    assert await post(webhook, admission_review(stored_pod("plain"))) == allowed()


async def test_an_unparsable_quantity_is_denied_naming_the_rule(
    webhook: httpx.AsyncClient,
) -> None:
    pod = with_gpu_mem(stored_pod("p", 1024), limit="abc", request="abc")
    answer = await post(webhook, admission_review(pod))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == UID
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"].startswith('gpushare: rule "quantity": ')
    assert "'main0'" in response["status"]["message"]


async def test_a_request_unequal_to_its_limit_is_denied(webhook: httpx.AsyncClient) -> None:
    pod = with_gpu_mem(stored_pod("p", 1024), limit="1024", request="2048")
    response = (await post(webhook, admission_review(pod)))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"].startswith('gpushare: rule "requests-equal-limits": ')


async def test_the_uid_is_echoed(webhook: httpx.AsyncClient) -> None:
    review = admission_review(stored_pod("p", 1))
    review["request"]["uid"] = "another-uid"
    assert await post(webhook, review) == allowed("another-uid")


@pytest.mark.parametrize(
    "review",
    [
        admission_review(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}},
            kind={"group": "apps", "version": "v1", "kind": "Deployment"},
            resource="deployments",
        ),
        admission_review(None, operation="DELETE", old={"metadata": {"name": "gone"}}),
        admission_review(None),
    ],
    ids=["not-a-pod", "delete", "no-object"],
)
async def test_what_is_not_a_pod_created_or_updated_is_allowed(
    webhook: httpx.AsyncClient, review: dict[str, Any]
) -> None:
    assert await post(webhook, review) == allowed()


async def test_a_delete_of_an_invalid_pod_is_allowed(webhook: httpx.AsyncClient) -> None:
    invalid = with_gpu_mem(stored_pod("p", 1), limit="abc", request="abc")
    assert await post(webhook, admission_review(None, operation="DELETE", old=invalid)) == allowed()


async def test_an_update_that_breaks_a_rule_is_denied(webhook: httpx.AsyncClient) -> None:
    valid = stored_pod("p", 1024)
    invalid = with_gpu_mem(valid, limit="1024", request="2048")
    review = admission_review(invalid, operation="UPDATE", old=valid)
    assert (await post(webhook, review))["response"]["allowed"] is False


async def test_an_update_of_an_already_invalid_pod_is_allowed(webhook: httpx.AsyncClient) -> None:
    """A pod from before the webhook can still get labels and lose finalizers."""
    invalid = with_gpu_mem(stored_pod("p", 1024), limit="abc", request="abc")
    relabelled = copy.deepcopy(invalid)
    relabelled["metadata"]["labels"] = {"team": "a"}
    review = admission_review(relabelled, operation="UPDATE", old=invalid)
    assert await post(webhook, review) == allowed()


async def test_subresources_are_not_judged(webhook: httpx.AsyncClient) -> None:
    invalid = with_gpu_mem(stored_pod("p", 1024), limit="abc", request="abc")
    review = admission_review(invalid, operation="UPDATE", old=None, sub_resource="status")
    assert await post(webhook, review) == allowed()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not a valid AdmissionReview"),
        (b"[]", "not a valid AdmissionReview"),
        (b"{}", "not a valid AdmissionReview"),
        (body_of({**admission_review(None), "apiVersion": "admission.k8s.io/v2"}), "expected"),
        (body_of({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "no request"),
        (body_of({**admission_review(None), "request": {"uid": UID}}), "not a valid"),
        (body_of(admission_review({"spec": {"containers": "x"}})), "request.object is not a Pod"),
    ],
    ids=["not-json", "array", "empty", "api-version", "no-request", "no-kind", "bad-pod"],
)
async def test_a_malformed_review_is_denied_with_code_400_and_the_reason(
    webhook: httpx.AsyncClient, body: bytes, reason: str
) -> None:
    """Still an AdmissionReview (the kube-apiserver reads anything else as a failed call),
    echoing the uid whenever the body names one."""
    response = await webhook.post(VALIDATE, content=body)
    assert response.status_code == 200
    review = response.json()
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    answer = review["response"]
    assert answer["uid"] == (UID if b'"uid"' in body else "")
    assert answer["allowed"] is False
    assert (answer["status"]["code"], answer["status"]["reason"]) == (400, "BadRequest")
    assert answer["status"]["message"].startswith("gpushare: malformed admission request: ")
    assert reason in answer["status"]["message"]


async def test_decisions_are_counted_by_result_and_rule(webhook: httpx.AsyncClient) -> None:
    invalid = with_gpu_mem(stored_pod("p", 1024), limit="1024", request="2048")
    await post(webhook, admission_review(stored_pod("p", 1)))
    await post(webhook, admission_review(invalid))
    await post(webhook, admission_review(invalid))
    await webhook.post(VALIDATE, content=b"nope")
    text = (await webhook.get("/metrics")).text
    assert 'gpushare_admission_decisions_total{result="allowed",rule="none"} 1.0' in text
    assert (
        'gpushare_admission_decisions_total{result="denied",rule="requests-equal-limits"} 2.0'
    ) in text
    assert 'gpushare_extender_bad_requests_total{verb="admission"} 1.0' in text
    assert 'gpushare_extender_request_seconds_count{verb="admission"} 4.0' in text


def test_the_memory_unit_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def read(
        pod: Pod, memory_unit: str = "MiB", policies: frozenset[str] | None = None
    ) -> PodRequest:
        seen.append(memory_unit)
        return PodRequest(containers=())

    monkeypatch.setattr(admission, "validate_pod", read)
    reviewer = AdmissionReviewer(AllocatorSettings(memory_unit="GiB"), AllocatorMetrics())
    reviewer.decide(decode_review(body_of(admission_review(stored_pod("p", 1)))))
    assert seen == ["GiB"]


async def test_an_internal_failure_denies_with_code_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(
        pod: Pod, memory_unit: str = "MiB", policies: frozenset[str] | None = None
    ) -> PodRequest:
        raise RuntimeError("boom")

    monkeypatch.setattr(admission, "validate_pod", broken)
    metrics = AllocatorMetrics()
    reviewer = AdmissionReviewer(AllocatorSettings(), metrics)
    answer = json.loads(await reviewer.answer(body_of(admission_review(stored_pod("p", 1)))))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 500
    assert "boom" in answer["response"]["status"]["message"]
    labels = {"result": "error", "rule": "internal"}
    assert metrics.registry.get_sample_value("gpushare_admission_decisions_total", labels) == 1.0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
REVIEWER = AdmissionReviewer(AllocatorSettings(), AllocatorMetrics())


@pytest.mark.slow
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    field=st.sampled_from(["kind", "operation", "object", "oldObject", "subResource", "uid"]),
    value=json_values,
    resources=json_values,
)
def test_any_review_is_answered_or_refused(field: str, value: Any, resources: Any) -> None:
    pod = stored_pod("p", 1)
    pod["spec"]["containers"][0]["resources"] = resources
    review = admission_review(pod, operation="UPDATE", old=pod)
    review["request"][field] = value
    with contextlib.suppress(WireError):
        answer = REVIEWER.decide(decode_review(body_of(review)))
        assert answer.status is None or answer.status.code == 403
