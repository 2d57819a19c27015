"""Fuzzing filter, prioritize and bind over real HTTP (uvicorn, real nats-server).

The handlers read the raw body and decode it with msgspec (no Pydantic model, and the app
serves no ``/openapi.json``: ``openapi_url=None``), so there is no OpenAPI document to fuzz
from; the bodies are generated from the JSON Schema of the wire Structs themselves
(:mod:`tests.fuzz.schemas`), from mutations of the calls a real kube-scheduler made, and
from bytes that are not JSON. Properties: never a 5xx; a malformed body is a 400 saying
what is wrong; a well-formed one is a 200 with every node passed or given a reason; and
the allocator still answers a valid call when the fuzzing is over.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpushare.allocator.wire import ExtenderArgs, ExtenderBindingArgs, NodeHeader
from gpushare.core.pods import Pod
from gpushare.core.requests import MULTIPLE_GPU_ANNOTATION
from tests.fuzz.bodies import encode, mutated, names, non_json, pods, sample
from tests.fuzz.checks import (
    asked_nodes,
    check_bind,
    check_filter,
    check_prioritize,
    check_refusal,
    json_answer,
    passed_nodes,
)
from tests.fuzz.conftest import KNOWN_NODES, PREFIX, Served, fuzz
from tests.fuzz.generation import from_schema
from tests.fuzz.schemas import wire_schema

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
VERBS = ("filter", "prioritize", "bind")

known_nodes = st.sampled_from(KNOWN_NODES)
node_names = st.lists(st.one_of(known_nodes, known_nodes, names), max_size=6)
schema_pods = from_schema(wire_schema(Pod))
any_pod = st.one_of(pods(plausible=True), pods(), schema_pods)
"""Pods built to ask for GPUs in every dialect (some likely to fit), or straight from the
Pod schema."""
node_items = st.lists(
    st.builds(
        lambda name, extra: {**extra, "metadata": {**extra.get("metadata", {}), "name": name}},
        st.one_of(known_nodes, known_nodes, names),
        from_schema(wire_schema(NodeHeader)),
    ),
    max_size=6,
)


@st.composite
def well_formed_args(draw: st.DrawFn) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends them, in either nodeCacheCapable mode."""
    pod = draw(any_pod)
    if draw(st.booleans()):
        return {"Pod": pod, "Nodes": None, "NodeNames": draw(node_names)}
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": draw(node_items)}, "NodeNames": None}


def post(client: httpx.Client, verb: str, body: bytes) -> httpx.Response:
    return client.post(
        f"{PREFIX}/{verb}", content=body, headers={"Content-Type": "application/json"}
    )


def bind_args(document: dict[str, Any], node: str) -> dict[str, str]:
    meta = document["Pod"].get("metadata", {})
    return {
        "PodName": meta.get("name", ""),
        "PodNamespace": meta.get("namespace", "default"),
        "PodUID": meta.get("uid", ""),
        "Node": node,
    }


def filter_and_prioritize(client: httpx.Client, document: Any) -> None:
    """Both verbs on one body: answered in full if it names its nodes, else refused."""
    body = encode(document)
    names = asked_nodes(document)
    for verb in ("filter", "prioritize"):
        response = post(client, verb, body)
        if names is None:
            check_refusal(verb, response)
        elif verb == "filter":
            check_filter(names, document, response)
        else:
            check_prioritize(names, response)


async def still_serving(served: Served) -> None:
    """After the fuzzing: healthy, ready, and the recorded kube-scheduler calls answered."""
    assert (await served.http.get("/healthz")).status_code == 200
    assert (await served.http.get("/readyz")).json()["ready"] is True
    for name in ("filter.request.json", "filter.nodecache.request.json"):
        document = sample(name)
        response = await served.http.post(f"{PREFIX}/filter", content=encode(document))
        check_filter(["gpu-node-1", "gpu-node-2"], document, response)
    fresh = {"metadata": {"name": "after", "uid": str(uuid.uuid4())}, "spec": {"containers": []}}
    args = {"Pod": fresh, "Nodes": None, "NodeNames": list(KNOWN_NODES)}
    answer = json_answer(await served.http.post(f"{PREFIX}/filter", content=encode(args)))
    assert answer["NodeNames"] == list(KNOWN_NODES)  # a pod without GPUs fits everywhere


LOOKALIKE_COUNT = {
    "Pod": {
        "metadata": {"name": "p", "uid": "u-1", "annotations": {MULTIPLE_GPU_ANNOTATION: "²"}},
        "spec": {"containers": [{"name": "main"}]},
    },
    "Nodes": None,
    "NodeNames": ["gpu-node-1"],
}
"""Found by this fuzzer: ``"²".isdigit()`` but ``int("²")`` raises (kept as a regression)."""


async def test_well_formed_args_get_a_verdict_for_every_node(served: Served) -> None:
    @FUZZ
    @example(document=LOOKALIKE_COUNT, then_bind=False)
    @given(document=well_formed_args(), then_bind=st.booleans())
    def examples(client: httpx.Client, document: dict[str, Any], then_bind: bool) -> None:
        names = asked_nodes(document)
        assert names is not None
        body = encode(document)
        filtered = post(client, "filter", body)
        check_filter(names, document, filtered)
        check_prioritize(names, post(client, "prioritize", body))
        passed = passed_nodes(document, json_answer(filtered))
        if then_bind and passed:  # the reservation path, on whatever the filter let through
            check_bind(post(client, "bind", encode(bind_args(document, passed[0]))))

    await fuzz(served, examples)
    await still_serving(served)


async def test_args_from_the_wire_schema_are_answered_or_refused(served: Served) -> None:
    """Anything the schema allows, nulls included: 200 when it names a pod and its nodes."""

    @FUZZ
    @given(document=from_schema(wire_schema(ExtenderArgs)))
    def examples(client: httpx.Client, document: dict[str, Any]) -> None:
        filter_and_prioritize(client, document)

    await fuzz(served, examples)
    await still_serving(served)


@pytest.mark.parametrize("recorded", ["filter", "filter.nodecache"])
async def test_mutated_kube_scheduler_calls_are_answered_or_refused(
    served: Served, recorded: str
) -> None:
    """Fields dropped, recased, nulled, of the wrong type, huge, odd quantities, unicode."""
    original = sample(f"{recorded}.request.json")

    @FUZZ
    @given(document=mutated(original))
    def examples(client: httpx.Client, document: Any) -> None:
        body = encode(document)
        names = asked_nodes(document)
        for verb in ("filter", "prioritize"):
            response = post(client, verb, body)
            assert response.status_code in (200, 400), (response.status_code, response.text)
            if response.status_code == 400:
                check_refusal(verb, response)
            elif verb == "filter":
                assert names is not None, "accepted a body that names no pod or nodes"
                check_filter(names, document, response)
            else:
                assert names is not None
                check_prioritize(names, response)

    await fuzz(served, examples)
    await still_serving(served)


async def test_mutated_binds_are_answered_or_refused(served: Served) -> None:
    original = sample("bind.request.json")

    @FUZZ
    @given(document=mutated(original) | from_schema(wire_schema(ExtenderBindingArgs)))
    def examples(client: httpx.Client, document: Any) -> None:
        response = post(client, "bind", encode(document))
        assert response.status_code in (200, 400), (response.status_code, response.text)
        if response.status_code == 400:
            check_refusal("bind", response)
        else:
            check_bind(response)

    await fuzz(served, examples)
    await still_serving(served)


async def test_bodies_that_are_not_json_objects_are_refused(served: Served) -> None:
    @FUZZ
    @given(body=non_json)
    def examples(client: httpx.Client, body: bytes) -> None:
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        for verb in VERBS:
            response = post(client, verb, body)
            if not isinstance(document, dict):
                check_refusal(verb, response)
            else:  # bytes that happen to be a JSON object: answered or refused, never a 5xx
                assert response.status_code in (200, 400), response.status_code

    await fuzz(served, examples)
    await still_serving(served)
