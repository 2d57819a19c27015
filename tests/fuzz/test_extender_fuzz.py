"""Fuzzing filter, prioritize and bind over real HTTP (uvicorn, real nats-server).

The handlers read the raw body and decode it with msgspec (no Pydantic model, and the app
serves no ``/openapi.json``: ``openapi_url=None``), so there is no OpenAPI document to fuzz
from; the bodies are generated from the JSON Schema of the wire Structs themselves
(:mod:`tests.fuzz.schemas`), from mutations of the calls a real kube-scheduler made, and
from bytes that are not JSON; then nested deep, grown around the body limit, and given
numbers no encoder writes (``1e400``, 5000 digits). Properties: never a 5xx; a malformed
body is a 400 saying what is wrong (nested too deep included), one over the limit a 413;
a well-formed one is a 200 with every node passed or given a reason; and the allocator
still answers a valid call when the fuzzing is over.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpushare.allocator.json_limits import MAX_JSON_DEPTH
from gpushare.allocator.wire import ExtenderArgs, ExtenderBindingArgs, NodeHeader
from gpushare.core.pods import Pod
from gpushare.core.requests import MULTIPLE_GPU_ANNOTATION, SHARE_RESOURCES
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
    paths,
    place,
    pods,
    raw_numbers,
    sample,
)
from tests.fuzz.checks import (
    asked_nodes,
    check_bind,
    check_filter,
    check_prioritize,
    check_refusal,
    check_too_deep,
    check_too_large,
    json_answer,
    passed_nodes,
)
from tests.fuzz.conftest import BODY_LIMIT, KNOWN_NODES, PREFIX, Served, fuzz
from tests.fuzz.generation import from_schema
from tests.fuzz.schemas import wire_schema

pytestmark = pytest.mark.asyncio(loop_scope="module")

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


def deep_or_refused(verb: str, response: httpx.Response, body: bytes, depth: int) -> None:
    """413 when over the body limit, else 400: "nested deeper" when it is, else another
    reason (the body is no call at all)."""
    if len(body) > BODY_LIMIT:
        check_too_large(verb, response, BODY_LIMIT)
    elif depth > MAX_JSON_DEPTH:
        check_too_deep(verb, response)
    else:
        check_refusal(verb, response)


DEEP_PLACES = (
    ("X-Deep",),
    ("Pod", "x-deep"),
    ("Pod", "metadata", "x-deep"),
    ("Pod", "spec", "x-deep"),
)
"""Unknown fields (ignored by the decoders, as by Go) where a deep value is put."""


async def test_bodies_nested_too_deep_are_refused_with_the_reason(served: Served) -> None:
    """A deep value in an unknown field: answered as if absent while the body stays within
    the limit, refused with 400 "nested deeper" beyond it, at any depth (50,000 levels
    made the decoder raise RecursionError: a 200 "internal error")."""

    @FUZZ
    @example(document=LOOKALIKE_COUNT, where=("Pod", "x-deep"), deep=deep_array(40_000), whole=0)
    @example(document=LOOKALIKE_COUNT, where=("Pod", "x-deep"), deep=deep_array(62), whole=0)
    @given(
        document=well_formed_args(),
        where=st.sampled_from(DEEP_PLACES),
        deep=nested(depths),
        whole=st.integers(0, 5),
    )
    def examples(
        client: httpx.Client,
        document: dict[str, Any],
        where: tuple[str, ...],
        deep: Nested,
        whole: int,
    ) -> None:
        if whole == 5:  # the body is the deep value itself: no ExtenderArgs at all
            for verb in VERBS:
                deep_or_refused(verb, post(client, verb, deep.raw), deep.raw, deep.depth)
            return
        placed = place(document, where)
        body = fill(placed, deep.raw)
        total = max(nesting(placed), len(where) + deep.depth)
        names = asked_nodes(placed)
        assert names is not None
        for verb in ("filter", "prioritize"):
            response = post(client, verb, body)
            if len(body) > BODY_LIMIT or total > MAX_JSON_DEPTH:
                deep_or_refused(verb, response, body, total)
            elif verb == "filter":
                check_filter(names, placed, response)
            else:
                check_prioritize(names, response)
        bind = fill(place(bind_args(document, "gpu-node-1"), ("X-Deep",)), deep.raw)
        response = post(client, "bind", bind)
        if len(bind) > BODY_LIMIT or 1 + deep.depth > MAX_JSON_DEPTH:
            deep_or_refused("bind", response, bind, 1 + deep.depth)
        else:
            check_bind(response)

    await fuzz(served, examples)
    await still_serving(served)


SIZE_FUZZ = settings(FUZZ, max_examples=60)
"""Fewer examples: each sends up to ten times the (fuzzing) body limit."""


@pytest.mark.parametrize("verb", VERBS)
async def test_bodies_over_the_limit_are_413_and_bodies_within_it_are_read(
    served: Served, verb: str
) -> None:
    """Around the limit, sent with a Content-Length or chunked in any sizes: 413 exactly
    when the body is over it, else answered as the same call without the padding."""
    recorded = "bind.request.json" if verb == "bind" else "filter.request.json"
    document = sample(recorded)
    body = encode(document)

    @SIZE_FUZZ
    @given(
        grown=padded(body, BODY_LIMIT),
        sizes=st.none() | st.lists(st.integers(1024, 3 * BODY_LIMIT), min_size=1, max_size=4),
    )
    def examples(client: httpx.Client, grown: tuple[bytes, str], sizes: list[int] | None) -> None:
        big, _ = grown
        content = big if sizes is None else chunked(big, sizes)
        response = client.post(f"{PREFIX}/{verb}", content=content, headers=JSON_TYPE)
        if len(big) > BODY_LIMIT:
            check_too_large(verb, response, BODY_LIMIT)
        elif verb == "filter":
            check_filter(["gpu-node-1", "gpu-node-2"], document, response)
        elif verb == "prioritize":
            check_prioritize(["gpu-node-1", "gpu-node-2"], response)
        else:
            check_bind(response)

    await fuzz(served, examples)
    await still_serving(served)


JSON_TYPE = {"Content-Type": "application/json"}


def number_places(document: dict[str, Any]) -> st.SearchStrategy[tuple[str | int, ...]]:
    """Mostly a GPU resource of the pod's first container; else any value of the call."""
    resource = st.sampled_from(sorted(SHARE_RESOURCES))
    in_limits = st.tuples(
        st.just("Pod"), st.just("spec"), st.just("containers"), st.just(0),
        st.just("resources"), st.sampled_from(["limits", "requests"]), resource,
    )  # fmt: skip
    anywhere = st.sampled_from(paths(document) or [("X",)])
    return st.one_of(in_limits, in_limits, anywhere)


def with_container(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` whose pod has a first container with ``limits`` and ``requests`` maps
    (a pod from the schema may have ``null`` anywhere on the way)."""
    pod = document["Pod"]
    if not isinstance(pod.get("spec"), dict):
        pod["spec"] = {}
    if not isinstance(pod["spec"].get("containers"), list) or not pod["spec"]["containers"]:
        pod["spec"]["containers"] = [{"name": "main"}]
    container = pod["spec"]["containers"][0]
    if not isinstance(container.get("resources"), dict):
        container["resources"] = {}
    for which in ("limits", "requests"):
        if not isinstance(container["resources"].get(which), dict):
            container["resources"][which] = {}
    return document


async def test_numbers_out_of_any_range_are_answered_or_refused(served: Served) -> None:
    """``1e400``, 5000 digits, past int64, negative zero, in the quantities of the pod or
    anywhere in the call: a verdict for every node, or a 400; never an internal error."""

    @FUZZ
    @given(data=st.data(), document=well_formed_args().map(with_container), raw=raw_numbers)
    def examples(
        client: httpx.Client, data: st.DataObject, document: dict[str, Any], raw: bytes
    ) -> None:
        where = data.draw(number_places(document))
        placed = place(document, where)
        body = fill(placed, raw)
        names = asked_nodes(placed)
        for verb in ("filter", "prioritize"):
            response = post(client, verb, body)
            assert response.status_code in (200, 400), (response.status_code, response.text)
            if response.status_code == 400:
                check_refusal(verb, response)
                continue
            assert names is not None, "accepted a body that names no pod or nodes"
            if verb == "filter":
                check_filter(names, placed, response)
            else:
                check_prioritize(names, response)

    await fuzz(served, examples)
    await still_serving(served)
