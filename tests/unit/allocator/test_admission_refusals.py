"""The webhook answers an AdmissionReview whatever it is sent (never ``[]``, never a 400)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.allocator.admission import AdmissionReviewer, too_large_review
from gpushare.allocator.admission_wire import read_uid
from gpushare.allocator.json_limits import MAX_JSON_DEPTH
from gpushare.allocator.limits import Oversized
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.settings import AllocatorSettings
from tests.unit.allocator.test_admission import (
    UID,
    VALIDATE,
    admission_review,
    app_with,
    body_of,
    stored_pod,
)

REVIEW_START = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"'
"""How the kube-apiserver starts every review it sends (Go's field order)."""


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def refusal(answer: bytes) -> dict[str, Any]:
    """The AdmissionReview's response, checked to deny with a status saying why."""
    review = json.loads(answer)
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response: dict[str, Any] = review["response"]
    assert response["allowed"] is False
    assert isinstance(response["uid"], str)
    assert response["status"]["message"].startswith("gpushare: ")
    return response


@pytest.mark.parametrize(
    ("body", "uid"),
    [
        pytest.param(body_of(admission_review(stored_pod("p", 1))), UID, id="a-review"),
        pytest.param(b'{"request": {"uid": "u-1", "kind": 7}}', "u-1", id="json-no-review"),
        pytest.param(REVIEW_START + b'u-2","object":' + deep(100_000), "u-2", id="too-deep"),
        pytest.param(REVIEW_START + b'u-3","object":{"spec', "u-3", id="cut-short"),
        pytest.param(b'{"request": {"uid": 5}}', "", id="uid-not-a-string"),
        pytest.param(b'{"request": null}', "", id="no-request"),
        pytest.param(b"[]", "", id="array"),
        pytest.param(b"\xff\xfe", "", id="not-utf8"),
        pytest.param(b"", "", id="empty"),
        pytest.param(b" " * 5000 + REVIEW_START + b'u-4"' + deep(99), "", id="uid-too-far"),
    ],
)
def test_read_uid(body: bytes, uid: str) -> None:
    assert read_uid(body) == uid


BAD_BODIES = [
    pytest.param(b"not json", "", "not a valid AdmissionReview", id="not-json"),
    pytest.param(b"[]", "", "not a valid AdmissionReview", id="array"),
    pytest.param(deep(50_000), "", f"deeper than {MAX_JSON_DEPTH} levels", id="50k-deep"),
    pytest.param(
        REVIEW_START + b'u-5","object":' + deep(MAX_JSON_DEPTH) + b"}}",
        "u-5",
        "nested deeper",
        id="deep-object",
    ),
    pytest.param(
        body_of(admission_review({"spec": {"containers": "x"}})),
        UID,
        "request.object is not a Pod",
        id="object-not-a-pod",
    ),
    pytest.param(
        body_of(admission_review(stored_pod("p", 1))).replace(b'"1"', b"1e400"),
        UID,
        "Number out of range",
        id="number-out-of-range",
    ),
]


@pytest.mark.parametrize(("body", "uid", "reason"), BAD_BODIES)
async def test_a_bad_body_is_denied_with_code_400_and_the_uid(
    body: bytes, uid: str, reason: str
) -> None:
    metrics = AllocatorMetrics()
    response = refusal(await AdmissionReviewer(AllocatorSettings(), metrics).answer(body))
    assert response["uid"] == uid
    assert (response["status"]["code"], response["status"]["reason"]) == (400, "BadRequest")
    assert reason in response["status"]["message"]
    labels = {"verb": "admission"}
    assert metrics.registry.get_sample_value("gpushare_extender_bad_requests_total", labels) == 1


@pytest.mark.parametrize(
    ("oversized", "uid", "said"),
    [
        (Oversized(path="/v", limit=100, declared=5000), "", "request body of 5000 bytes is"),
        (
            Oversized(path="/v", limit=100, declared=None, head=REVIEW_START + b'u-6"'),
            "u-6",
            "request body is",
        ),
    ],
    ids=["declared", "chunked"],
)
def test_a_body_over_the_limit_is_denied_with_code_413(
    oversized: Oversized, uid: str, said: str
) -> None:
    answer = too_large_review(oversized)
    assert answer.status == 200
    assert answer.content_type == "application/json"
    response = refusal(answer.body)
    assert response["uid"] == uid
    status = response["status"]
    assert (status["code"], status["reason"]) == (413, "RequestEntityTooLarge")
    assert said in status["message"]
    assert "limit of 100 bytes" in status["message"]


async def every_bad_body_refused(path: str) -> dict[str, Any]:
    """Posts bad bodies to a webhook ``path`` (not JSON, no review, too deep, over the
    allocator's 200,000-byte limit): each a 200 and a review that denies. Returns the
    over-the-limit one's answer."""
    too_large = b"{" * 10 + b"x" * 300_000
    transport = httpx.ASGITransport(app=app_with(max_body_bytes=200_000))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        for body in (b"nope", b"[]", deep(90_000), too_large):
            response = await client.post(path, content=body)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/json"
            answer = refusal(response.content)
    return answer


async def test_over_http_every_bad_body_is_a_200_review() -> None:
    assert (await every_bad_body_refused(VALIDATE))["status"]["code"] == 413


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    body=st.binary(max_size=200)
    | st.text(alphabet='[]{}":,1 ', max_size=300).map(str.encode)
    | st.integers(0, 3000).map(deep)
)
async def test_any_body_is_answered_with_a_review(body: bytes) -> None:
    reviewer = AdmissionReviewer(AllocatorSettings(), AllocatorMetrics())
    response = refusal(await reviewer.answer(body))
    assert response["status"]["code"] == 400
