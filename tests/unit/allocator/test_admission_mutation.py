"""The mutating admission webhook in-process: seed 002's kubernetes.io names in, a base64
JSON Patch to gpushare's names out (``admission.k8s.io/v1``, ``patchType: JSONPatch``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.allocator import admission_mutation
from gpushare.allocator.admission_mutation import AdmissionMutator
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.settings import TlsSettings
from gpushare.core.native_names import REWRITTEN_ANNOTATION, Rewrite
from gpushare.core.pods import Pod
from tests.unit.allocator.test_admission import (
    UID,
    admission_review,
    allowed,
    app_with,
    body_of,
    post_review,
    stored_pod,
)
from tests.unit.allocator.test_admission_refusals import (
    BAD_BODIES,
    deep,
    every_bad_body_refused,
    refusal,
)

MUTATE = "/gpushare-scheduler/admission/mutate"
VALIDATE = "/gpushare-scheduler/admission/validate"


def seed_002_pod(name: str = "p", **resources: dict[str, str]) -> dict[str, Any]:
    """A stored pod whose one container asks ``resources`` (``limits=``, ``requests=``)."""
    pod = stored_pod(name)
    pod["spec"]["containers"][0]["resources"] = resources
    return pod


async def post(client: httpx.AsyncClient, review: dict[str, Any]) -> dict[str, Any]:
    return await post_review(client, MUTATE, review)


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with the answer's patch applied, as the kube-apiserver applies it."""
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(operations, list)
    result: dict[str, Any] = jsonpatch.apply_patch(pod, operations)
    return result


async def test_seed_002_names_are_renamed_with_a_json_patch(webhook: httpx.AsyncClient) -> None:
    pod = seed_002_pod(limits={"kubernetes.io/gpu": "50"}, requests={"kubernetes.io/gpu": "50"})
    response = (await post(webhook, admission_review(pod)))["response"]
    assert response["uid"] == UID
    assert response["allowed"] is True
    assert "status" not in response
    result = patched(pod, response)
    assert result["spec"]["containers"][0]["resources"] == {
        "limits": {"gpushare.io/gpu": "50"},
        "requests": {"gpushare.io/gpu": "50"},
    }
    assert result["metadata"]["annotations"] == {REWRITTEN_ANNOTATION: "kubernetes.io/gpu"}
    assert response["warnings"] == [
        "gpushare: renamed seed 002's kubernetes.io names to gpushare's: "
        "container 'main': kubernetes.io/gpu -> gpushare.io/gpu"
    ]


async def test_a_request_without_a_limit_gets_its_limit(webhook: httpx.AsyncClient) -> None:
    """Seed 002's examples ask requests only, which an extended resource may not."""
    pod = seed_002_pod(requests={"kubernetes.io/gpu-core": "50", "cpu": "4"})
    result = patched(pod, (await post(webhook, admission_review(pod)))["response"])
    assert result["spec"]["containers"][0]["resources"] == {
        "requests": {"gpushare.io/gpu-core": "50", "cpu": "4"},
        "limits": {"gpushare.io/gpu-core": "50"},
    }


async def test_the_rewritten_pod_passes_the_validating_webhook(webhook: httpx.AsyncClient) -> None:
    """The kube-apiserver calls the validating webhook on the mutated pod."""
    pod = seed_002_pod(
        requests={"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory-ratio": "60"}
    )
    result = patched(pod, (await post(webhook, admission_review(pod)))["response"])
    validated = await webhook.post(VALIDATE, content=body_of(admission_review(result)))
    assert validated.json() == allowed()


async def test_both_names_are_left_for_the_validating_webhook_to_refuse(
    webhook: httpx.AsyncClient,
) -> None:
    pod = seed_002_pod(limits={"kubernetes.io/gpu": "50", "gpushare.io/gpu": "30"})
    response = (await post(webhook, admission_review(pod)))["response"]
    assert response == {
        "uid": UID,
        "allowed": True,
        "warnings": [
            "gpushare: not renamed, the container asks both names: "
            "container 'main': kubernetes.io/gpu -> gpushare.io/gpu"
        ],
    }
    validated = await webhook.post(VALIDATE, content=body_of(admission_review(pod)))
    status = validated.json()["response"]["status"]
    assert status["message"].startswith('gpushare: rule "duplicate-dimension": ')


@pytest.mark.parametrize(
    "review",
    [
        admission_review(stored_pod("share", 1024)),
        admission_review(stored_pod("plain")),
        admission_review(
            seed_002_pod(limits={"kubernetes.io/gpu": "50"}),
            operation="UPDATE",
            old=seed_002_pod(limits={"kubernetes.io/gpu": "50"}),
        ),
        admission_review(
            seed_002_pod(limits={"kubernetes.io/gpu": "50"}), operation="CREATE", sub_resource="x"
        ),
        admission_review(None, operation="DELETE", old=seed_002_pod()),
        admission_review(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}},
            kind={"group": "apps", "version": "v1", "kind": "Deployment"},
            resource="deployments",
        ),
        admission_review(None),
    ],
    ids=["share", "no-gpu", "update", "subresource", "delete", "not-a-pod", "no-object"],
)
async def test_anything_else_is_allowed_without_a_patch(
    webhook: httpx.AsyncClient, review: dict[str, Any]
) -> None:
    assert await post(webhook, review) == allowed()


@pytest.mark.parametrize(("body", "uid", "reason"), BAD_BODIES)
async def test_a_bad_body_is_denied_with_code_400_and_the_uid(
    body: bytes, uid: str, reason: str
) -> None:
    metrics = AllocatorMetrics()
    response = refusal(await AdmissionMutator(metrics).answer(body))
    assert response["uid"] == uid
    assert (response["status"]["code"], response["status"]["reason"]) == (400, "BadRequest")
    assert response["status"]["message"].startswith("gpushare: malformed admission request: ")
    assert reason in response["status"]["message"]
    assert "patch" not in response
    labels = {"verb": "mutation"}
    assert metrics.registry.get_sample_value("gpushare_extender_bad_requests_total", labels) == 1


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    body=st.binary(max_size=200)
    | st.text(alphabet='[]{}":,1 ', max_size=300).map(str.encode)
    | st.integers(0, 3000).map(deep)
)
async def test_any_body_is_answered_with_a_review(body: bytes) -> None:
    response = refusal(await AdmissionMutator(AllocatorMetrics()).answer(body))
    assert response["status"]["code"] == 400


async def test_over_http_every_bad_body_is_a_200_review() -> None:
    """Over the body limit too: 413 in a review that denies, as the validating path."""
    assert (await every_bad_body_refused(MUTATE))["status"]["code"] == 413


async def test_an_internal_failure_denies_with_code_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(pod: Pod) -> Rewrite:
        raise RuntimeError("boom")

    monkeypatch.setattr(admission_mutation, "rewrite_native_names", broken)
    metrics = AllocatorMetrics()
    pod = seed_002_pod(limits={"kubernetes.io/gpu": "50"})
    answer = json.loads(await AdmissionMutator(metrics).answer(body_of(admission_review(pod))))
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "boom" in response["status"]["message"]
    labels = {"result": "error"}
    assert metrics.registry.get_sample_value("gpushare_admission_mutations_total", labels) == 1


async def test_answers_are_counted_by_result(webhook: httpx.AsyncClient) -> None:
    await post(webhook, admission_review(seed_002_pod(limits={"kubernetes.io/gpu": "50"})))
    await post(webhook, admission_review(stored_pod("p", 1024)))
    await post(webhook, admission_review(stored_pod("q")))
    await webhook.post(MUTATE, content=b"nope")
    text = (await webhook.get("/metrics")).text
    assert 'gpushare_admission_mutations_total{result="renamed"} 1.0' in text
    assert 'gpushare_admission_mutations_total{result="unchanged"} 2.0' in text
    assert 'gpushare_extender_bad_requests_total{verb="mutation"} 1.0' in text
    assert 'gpushare_extender_request_seconds_count{verb="mutation"} 4.0' in text


async def test_with_client_certificates_required_the_webhook_stays_open() -> None:
    """kube-apiserver presents no client certificate: the webhooks answer without one."""
    tls = TlsSettings(cert_file="unused.crt", key_file="unused.key", client_ca_file="ca.crt")
    transport = httpx.ASGITransport(app=app_with(tls=tls))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        review = admission_review(seed_002_pod(limits={"kubernetes.io/gpu": "50"}))
        mutated = await client.post(MUTATE, content=body_of(review))
        filtered = await client.post("/gpushare-scheduler/filter", json={"Pod": {}})
    assert mutated.json()["response"]["patchType"] == "JSONPatch"
    assert filtered.status_code == 403
