"""Fuzzing the validating admission webhook over real HTTP (uvicorn, real nats-server).

Like the extender verbs, the webhook reads the raw body into msgspec Structs
(:mod:`gpushare.allocator.admission_wire`), so reviews are generated from those Structs'
JSON Schema, built from pods that ask for GPUs in every dialect, or mutated from the
AdmissionReview a kube-apiserver sends. Properties: a well-formed AdmissionReview is always
answered 200 with its ``uid``, ``allowed`` and, on a denial, a 403 naming the rule broken
(never the 500 of an internal failure); anything else is a 400 saying what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpushare.allocator.admission import ADMISSION_PATH
from gpushare.allocator.admission_wire import AdmissionReviewRequest
from gpushare.core.pods import Pod
from gpushare.core.requests import MULTIPLE_GPU_ANNOTATION
from tests.fuzz.bodies import encode, mutated, names, non_json, pods
from tests.fuzz.checks import check_refusal, check_review
from tests.fuzz.conftest import PREFIX, Served, fuzz
from tests.fuzz.generation import any_json, from_schema
from tests.fuzz.schemas import wire_schema
from tests.unit.allocator.test_admission import UID, admission_review, allowed, stored_pod

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
VALIDATE = f"{PREFIX}{ADMISSION_PATH}"
API_VERSION, KIND = "admission.k8s.io/v1", "AdmissionReview"

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
other_kinds = st.sampled_from(
    [
        POD_KIND,
        {"group": "apps", "version": "v1", "kind": "Deployment"},
        {"group": "", "version": "v1", "kind": "Node"},
    ]
)
any_operation = st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]) | st.text(max_size=6)
any_pod = st.one_of(pods(), pods(), from_schema(wire_schema(Pod)))
"""Mostly pods built to ask for GPUs, a third straight from the Pod schema."""


@st.composite
def reviews(draw: st.DrawFn) -> dict[str, Any]:
    """AdmissionReviews as the kube-apiserver sends them: mostly a CREATE or UPDATE of a pod
    (what the webhook judges), else any operation on any object or subresource."""
    if draw(st.integers(0, 3)):
        kind, sub_resource = POD_KIND, None
        operation = draw(st.sampled_from(["CREATE", "UPDATE"]))
    else:
        kind, operation = draw(other_kinds), draw(any_operation)
        sub_resource = draw(st.sampled_from([None, "", "status", "binding"]))
    review = admission_review(
        draw(any_pod | st.none()),
        operation=operation,
        old=draw(any_pod | st.none()) if operation == "UPDATE" else None,
        kind=kind,
        sub_resource=sub_resource,
    )
    review["request"]["uid"] = draw(st.uuids().map(str) | names)
    return review


@st.composite
def schema_reviews(draw: st.DrawFn) -> dict[str, Any]:
    """Anything the AdmissionReview schema allows, usually with the right apiVersion and kind."""
    review: dict[str, Any] = draw(from_schema(wire_schema(AdmissionReviewRequest)))
    if draw(st.integers(0, 3)):
        review |= {"apiVersion": API_VERSION, "kind": KIND}
    return review


def judged(request: dict[str, Any]) -> bool:
    """Whether the webhook must read ``object`` as a Pod (a CREATE or UPDATE of a pod)."""
    kind = request["kind"]
    return (
        kind.get("group", "") == ""
        and kind.get("kind", "") == "Pod"
        and request["operation"] in ("CREATE", "UPDATE")
        and not request.get("subResource")
    )


def post(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post(VALIDATE, content=body, headers={"Content-Type": "application/json"})


async def still_serving(served: Served) -> None:
    response = await served.http.post(
        VALIDATE, content=encode(admission_review(stored_pod("p", 8138)))
    )
    assert response.status_code == 200
    assert response.json() == allowed(UID)


def lookalike_count() -> dict[str, Any]:
    """Found by this fuzzer: ``"²".isdigit()`` but ``int("²")`` raises (kept as a regression)."""
    pod = stored_pod("p", 1024)
    pod["metadata"]["annotations"] = {MULTIPLE_GPU_ANNOTATION: "²"}
    return admission_review(pod)


async def test_well_formed_reviews_are_allowed_or_denied_with_a_rule(served: Served) -> None:
    @FUZZ
    @example(review=lookalike_count())
    @given(review=reviews())
    def examples(client: httpx.Client, review: dict[str, Any]) -> None:
        check_review(review["request"]["uid"], post(client, encode(review)))

    await fuzz(served, examples)
    await still_serving(served)


async def test_reviews_from_the_wire_schema_are_answered_or_refused(served: Served) -> None:
    @FUZZ
    @given(review=schema_reviews())
    def examples(client: httpx.Client, review: dict[str, Any]) -> None:
        response = post(client, encode(review))
        request = review.get("request")
        if (review["apiVersion"], review["kind"]) != (API_VERSION, KIND) or request is None:
            check_refusal("admission", response)
        elif judged(request) and request.get("object") is not None:
            assert response.status_code in (200, 400), response.status_code  # is it a Pod?
            if response.status_code == 400:
                check_refusal("admission", response)
            else:
                check_review(request["uid"], response)
        else:  # nothing to judge: allowed whatever the object is
            assert check_review(request["uid"], response)["allowed"] is True

    await fuzz(served, examples)
    await still_serving(served)


async def test_mutated_reviews_are_answered_or_refused(served: Served) -> None:
    original = admission_review(stored_pod("p", 8138))

    @FUZZ
    @given(review=mutated(original))
    def examples(client: httpx.Client, review: Any) -> None:
        response = post(client, encode(review))
        assert response.status_code in (200, 400), (response.status_code, response.text)
        if response.status_code == 400:
            check_refusal("admission", response)
        else:
            check_review(review["request"]["uid"], response)

    await fuzz(served, examples)
    await still_serving(served)


async def test_bodies_that_are_not_reviews_are_refused(served: Served) -> None:
    @FUZZ
    @given(body=non_json | any_json.map(encode))
    def examples(client: httpx.Client, body: bytes) -> None:
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        response = post(client, body)
        if not (isinstance(document, dict) and document.get("apiVersion") == API_VERSION):
            check_refusal("admission", response)

    await fuzz(served, examples)
    await still_serving(served)
