"""The validating admission webhook over real HTTP, served by a running allocator."""

from __future__ import annotations

import json

from nats.js import JetStreamContext

from tests.integration.allocator.serving import extender
from tests.unit.allocator.test_admission import (
    UID,
    VALIDATE,
    admission_review,
    allowed,
    stored_pod,
    with_gpu_mem,
)


async def test_admission_reviews_are_answered_over_http(js: JetStreamContext) -> None:
    async with extender(js) as (http, _):
        valid = await http.post(VALIDATE, json=admission_review(stored_pod("p", 8138)))
        invalid_pod = with_gpu_mem(stored_pod("p", 1024), limit="abc", request="abc")
        invalid = await http.post(VALIDATE, json=admission_review(invalid_pod))
        malformed = await http.post(VALIDATE, content=b'{"apiVersion": "admission.k8s.io/v1"')
        metrics = (await http.get("/metrics")).text
    assert valid.status_code == 200
    assert valid.headers["content-type"] == "application/json"
    assert valid.json() == allowed()
    assert invalid.status_code == 200
    denial = invalid.json()["response"]
    assert denial["uid"] == UID
    assert denial["allowed"] is False
    assert denial["status"]["code"] == 403
    assert denial["status"]["reason"] == "Forbidden"
    assert denial["status"]["message"].startswith('gpushare: rule "quantity": ')
    # still an AdmissionReview: the kube-apiserver reads anything else as a failed call
    assert malformed.status_code == 200
    refusal = json.loads(malformed.content)
    assert (refusal["apiVersion"], refusal["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert refusal["response"]["allowed"] is False
    assert refusal["response"]["status"]["code"] == 400
    assert "malformed admission request" in refusal["response"]["status"]["message"]
    assert 'gpushare_admission_decisions_total{result="denied",rule="quantity"} 1.0' in metrics
