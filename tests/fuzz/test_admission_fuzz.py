"""Fuzzing the validating admission webhook over real HTTP (uvicorn, real nats-server).

Like the extender verbs, the webhook reads the raw body into msgspec Structs
(:mod:`gpushare.allocator.admission_wire`), so reviews are generated from those Structs'
JSON Schema, built from pods that ask for GPUs in every dialect, or mutated from the
AdmissionReview a kube-apiserver sends; then nested deep, grown around the body limit and
given numbers no encoder writes. Properties: every body is answered 200 with an
``admission.k8s.io/v1`` AdmissionReview (the kube-apiserver reads anything else as a
failed call, which ``failurePolicy: Fail`` turns into a denial nobody can read): a
well-formed review with its ``uid``, ``allowed`` and, on a denial, a 403 naming the rule
broken (never the 500 of an internal failure); anything else denied with 400 saying what
is wrong (413 over the body limit), its ``uid`` echoed whenever it can be read.
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
from gpushare.allocator.json_limits import MAX_JSON_DEPTH
from gpushare.core.pods import Pod
from gpushare.core.requests import (
    GPU_MEM,
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_CONTAINER,
    MULTIPLE_GPU_ANNOTATION,
    NVIDIA_GPU,
    SHARE_RESOURCES,
)
from tests.fuzz.bodies import (
    Nested,
    chunked,
    deep_array,
    depths,
    encode,
    fill,
    mutated,
    names,
    nested,
    nesting,
    non_json,
    padded,
    place,
    pods,
    raw_numbers,
)
from tests.fuzz.checks import (
    check_review,
    check_review_or_refusal,
    check_review_refusal,
    readable_uid,
    review_envelope,
)
from tests.fuzz.conftest import BODY_LIMIT, PREFIX, Served, fuzz
from tests.fuzz.generation import any_json, from_schema
from tests.fuzz.schemas import wire_schema
from tests.unit.allocator.test_admission import UID, admission_review, allowed, stored_pod

pytestmark = pytest.mark.asyncio(loop_scope="module")

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
            check_review_refusal(readable_uid(review), response)
        elif judged(request) and request.get("object") is not None:
            check_review_or_refusal(review, response)  # judged, or refused: not a Pod
        else:  # nothing to judge: allowed whatever the object is
            assert check_review(request["uid"], response)["allowed"] is True

    await fuzz(served, examples)
    await still_serving(served)


async def test_mutated_reviews_are_answered_or_refused(served: Served) -> None:
    original = admission_review(stored_pod("p", 8138))

    @FUZZ
    @given(review=mutated(original))
    def examples(client: httpx.Client, review: Any) -> None:
        check_review_or_refusal(review, post(client, encode(review)))

    await fuzz(served, examples)
    await still_serving(served)


async def test_bodies_that_are_not_reviews_are_refused_with_a_review(served: Served) -> None:
    """Never ``[]``, never a 400: a review that denies, saying why."""

    @FUZZ
    @example(body=b"[]")
    @example(body=b"[" * 50_000 + b"]" * 50_000)
    @given(body=non_json | any_json.map(encode))
    def examples(client: httpx.Client, body: bytes) -> None:
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            document = None
        response = post(client, body)
        if isinstance(document, dict) and document.get("apiVersion") == API_VERSION:
            review_envelope(response)  # it might just be a review
        else:
            check_review_refusal(readable_uid(document), response)

    await fuzz(served, examples)
    await still_serving(served)


def regex_safe(uid: str) -> str:
    """What the webhook can read of a uid from a body it cannot decode (its first bytes):
    the uid if JSON writes it without escapes, else nothing."""
    written = json.dumps(uid, ensure_ascii=False)[1:-1]
    return uid if written == uid and 0 < len(uid.encode()) <= 256 else ""


def deep_places(review: dict[str, Any]) -> list[tuple[str, ...]]:
    """Unknown fields of the request, and of its object when that is a pod (a dict)."""
    places = [("request", "x-deep"), ("x-deep",)]
    if isinstance(review["request"].get("object"), dict):
        places.append(("request", "object", "x-deep"))
        places.append(("request", "object", "metadata", "x-deep"))
    return places


async def test_reviews_nested_too_deep_are_denied_with_their_uid(served: Served) -> None:
    """A deep value in an unknown field: judged as if absent within the depth limit, denied
    with 400 "nested deeper" beyond it (uid echoed), and 413 past the body limit."""

    @FUZZ
    @example(review=admission_review(stored_pod("p", 8138)), deep=deep_array(40_000), at=0)
    @example(review=admission_review(stored_pod("p", 8138)), deep=deep_array(61), at=2)
    @given(review=reviews(), deep=nested(depths), at=st.integers(0, 3))
    def examples(client: httpx.Client, review: dict[str, Any], deep: Nested, at: int) -> None:
        places = deep_places(review)
        where = places[at % len(places)]
        placed = place(review, where)
        body = fill(placed, deep.raw)
        uid = review["request"]["uid"]
        total = max(nesting(placed), len(where) + deep.depth)
        response = post(client, body)
        if len(body) > BODY_LIMIT:
            check_review_refusal("", response, 413)  # sent with a length: refused unread
        elif total > MAX_JSON_DEPTH:
            answer = check_review_refusal(regex_safe(uid), response)
            assert f"nested deeper than {MAX_JSON_DEPTH} levels" in answer["status"]["message"]
        else:
            check_review_or_refusal(placed, response)

    await fuzz(served, examples)
    await still_serving(served)


async def test_reviews_over_the_body_limit_are_denied_with_413(served: Served) -> None:
    """Around the limit, with a Content-Length or chunked: denied with 413 exactly when over
    it (the uid echoed when it came chunked: its first bytes were read), else judged."""
    uid = "705ab4f5-6393-11e8-b7cc-42010a800002"
    body = encode(admission_review(stored_pod("p", 8138)))

    @settings(FUZZ, max_examples=60)
    @given(
        grown=padded(body, BODY_LIMIT),
        sizes=st.none() | st.lists(st.integers(1024, 3 * BODY_LIMIT), min_size=1, max_size=4),
    )
    def examples(client: httpx.Client, grown: tuple[bytes, str], sizes: list[int] | None) -> None:
        big, _ = grown
        content = big if sizes is None else chunked(big, sizes)
        response = client.post(VALIDATE, content=content, headers=JSON_TYPE)
        if len(big) > BODY_LIMIT:
            answer = check_review_refusal("" if sizes is None else uid, response, 413)
            assert f"limit of {BODY_LIMIT} bytes" in answer["status"]["message"]
        else:
            assert check_review(uid, response)["allowed"] is True

    await fuzz(served, examples)
    await still_serving(served)


JSON_TYPE = {"Content-Type": "application/json"}
QUANTITY_PLACES = (
    ("spec", "containers", 0, "resources", "limits"),
    ("spec", "containers", 0, "resources", "requests"),
)


@st.composite
def reviews_with_a_raw_number(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A review of a pod, with a placeholder for a raw number: mostly a GPU quantity of its
    first container, else another field of the request (never its uid)."""
    pod = draw(pods())
    if not pod["spec"]["containers"]:
        pod["spec"]["containers"] = [{"name": "main"}]
    resources = pod["spec"]["containers"][0].setdefault("resources", {})
    review = admission_review(pod, operation=draw(st.sampled_from(["CREATE", "UPDATE"])))
    review["request"]["uid"] = draw(st.uuids().map(str) | names)
    if draw(st.integers(0, 3)):
        which = draw(st.sampled_from(["limits", "requests"]))
        resources.setdefault(which, {})
        resource = draw(st.sampled_from(sorted(SHARE_RESOURCES)))
        return review, ("request", "object", "spec", "containers", 0, "resources", which, resource)
    other = draw(st.sampled_from(["dryRun", "operation", "name", "x-number"]))
    return review, ("request", other)


def limits_only(pod: dict[str, Any]) -> dict[str, Any]:
    for container in pod["spec"]["containers"]:
        container["resources"].pop("requests", None)
    return pod


async def test_numbers_out_of_any_range_are_judged_or_refused(served: Served) -> None:
    """``1e400``, 5000 digits, past int64, in a pod's quantities or the request: allowed,
    denied naming a rule (the quantity bounds among them), or refused with 400."""

    @FUZZ
    @example(
        case=(
            admission_review(limits_only(stored_pod("p", 1))),
            ("request", "object", "spec", "containers", 0, "resources", "limits", GPU_MEM),
        ),
        raw=b"99999999999999999999",
    )
    @given(case=reviews_with_a_raw_number(), raw=raw_numbers)
    def examples(
        client: httpx.Client, case: tuple[dict[str, Any], tuple[Any, ...]], raw: bytes
    ) -> None:
        review, where = case
        placed = place(review, where)
        answer = check_review_or_refusal(placed, post(client, fill(placed, raw)))
        if where[-1] == GPU_MEM and raw == b"99999999999999999999":
            assert answer["allowed"] is False
            assert 'rule "memory-over-card-maximum"' in answer["status"]["message"]

    await fuzz(served, examples)
    await still_serving(served)


@settings(FUZZ, max_examples=100)
@given(
    memory=st.integers(MAX_CARD_MEMORY_MIB + 1, 10**63) | st.sampled_from(["1e20", "2Ti"]),
    cards=st.integers(MAX_CARDS_PER_CONTAINER + 1, 10**18),
    core=st.integers(101, 10**6).filter(lambda n: n % 100),
)
def bounds_examples(client: httpx.Client, memory: int | str, cards: int, core: int) -> None:
    for resources, rule in (
        ({GPU_MEM: str(memory)}, "memory-over-card-maximum"),
        ({NVIDIA_GPU: str(cards)}, "too-many-cards"),
        ({"gpushare.io/gpu-core": str(cards * 100)}, "too-many-cards"),
        ({GPU_MEM: "1024", "gpushare.io/gpu-core": str(core)}, "core-over-100-per-card"),
    ):
        pod = stored_pod("p")
        pod["spec"]["containers"] = [
            {"name": "main", "resources": {"limits": resources, "requests": resources}}
        ]
        answer = check_review(UID, post(client, encode(admission_review(pod))))
        assert answer["allowed"] is False
        assert answer["status"]["message"].startswith(f'gpushare: rule "{rule}": ')


async def test_quantities_beyond_a_card_are_denied_naming_the_bound(served: Served) -> None:
    await fuzz(served, bounds_examples)
    await still_serving(served)
