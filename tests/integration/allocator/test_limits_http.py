"""Request limits over real HTTP (uvicorn): body size, nesting depth, quantities a card holds.

The body limit is checked on the wire, with a raw socket where a client library would
hide it: a body declared too large is refused before any of it is sent, a chunked one as
soon as it passes the limit (the rest never sent), and the connection stays usable.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from nats.js import JetStreamContext

from gpushare.allocator.json_limits import MAX_JSON_DEPTH
from gpushare.allocator.settings import DEFAULT_MAX_BODY_BYTES
from gpushare.core.requests import GPU_MEM, MAX_CARD_MEMORY_MIB, NVIDIA_GPU, RULES
from tests.integration.allocator.serving import allocator_settings, extender, publish
from tests.unit.allocator.builders import (
    binding_args,
    card,
    fixture,
    gpu_pod,
    inventory,
    names_args,
    nodes_args,
)
from tests.unit.allocator.test_admission import (
    UID,
    VALIDATE,
    admission_review,
    body_of,
    stored_pod,
)

PREFIX = "/gpushare-scheduler"
VERBS = ("filter", "prioritize", "bind")
LIMIT = 1024 * 1024
"""The limit the tests serve with (the default, 16 MiB, is checked once)."""
NAMES = ["n1", "n2"]
JSON = {"Content-Type": "application/json"}


def cluster() -> list[Any]:
    return [inventory(name, [card(name, 0), card(name, 1)]) for name in NAMES]


def valid_body(verb: str) -> bytes:
    if verb == "bind":
        return binding_args(gpu_pod("p", 1024), "n1")
    return names_args(gpu_pod("p", 1024), NAMES)


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def refused_for_size(response: httpx.Response, declared: int | None) -> None:
    assert response.status_code == 413, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["Error"]
    assert f"limit of {LIMIT} bytes" in error
    assert "--max-body-bytes" in error
    if declared is not None:
        assert f"of {declared} bytes" in error


def review_refusal(response: httpx.Response, uid: str, code: int) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    review = response.json()
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    answer: dict[str, Any] = review["response"]
    assert answer["uid"] == uid
    assert answer["allowed"] is False
    assert answer["status"]["code"] == code
    status: dict[str, Any] = answer["status"]
    return status


@pytest.fixture
async def served(js: JetStreamContext) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    await publish(js, cluster())
    settings = allocator_settings(max_body_bytes=LIMIT, bind_wait_seconds=0.2)
    async with extender(js, settings) as (http, running):
        yield http, running.url


async def raw_exchange(url: str, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send a request's head and these body parts over a raw socket, then read the answer
    (without sending the rest of the body)."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(head)
        for part in body_parts:
            writer.write(part)
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
            headers = b""
            while (line := await reader.readline()) not in (b"\r\n", b""):
                headers += line
            length = next(
                int(line.split(b":")[1])
                for line in headers.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            return status_line + headers + b"\r\n" + await reader.readexactly(length)
    finally:
        writer.close()


def request_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: allocator", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("verb", VERBS)
async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    served: tuple[httpx.AsyncClient, str], verb: str
) -> None:
    """300 MiB announced, 10 bytes sent: the 413 comes back at once."""
    _, url = served
    declared = 300 * 1024 * 1024
    head = request_head(f"{PREFIX}/{verb}", {"Content-Length": str(declared)})
    answer = await raw_exchange(url, head, [b'{"Pod": {}'])
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413 ")
    assert f"of {declared} bytes" in json.loads(body)["Error"]


@pytest.mark.parametrize("verb", VERBS)
async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(
    served: tuple[httpx.AsyncClient, str], verb: str
) -> None:
    """Chunks up to one byte past the limit, and then nothing: the 413 does not wait."""
    _, url = served
    head = request_head(f"{PREFIX}/{verb}", {"Transfer-Encoding": "chunked"})
    piece = b"x" * (64 * 1024)
    parts = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (LIMIT // len(piece))
    parts.append(b"1\r\nx\r\n")
    answer = await raw_exchange(url, head, parts)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413 ")
    assert f"limit of {LIMIT} bytes" in json.loads(body)["Error"]


@pytest.mark.parametrize("verb", VERBS)
async def test_oversized_bodies_are_refused_and_the_connection_serves_on(
    served: tuple[httpx.AsyncClient, str], verb: str
) -> None:
    http, _ = served
    path = f"{PREFIX}/{verb}"
    padded = valid_body(verb)[:-1] + b"," + b" " * LIMIT + b'"x": 1}'
    refused_for_size(await http.post(path, content=padded, headers=JSON), len(padded))
    refused_for_size(await http.post(path, content=chunks(padded), headers=JSON), None)
    after = await http.post(path, content=valid_body(verb), headers=JSON)
    assert after.status_code == 200, after.text
    metrics = (await http.get("/metrics")).text
    assert f'gpushare_extender_bad_requests_total{{verb="{verb}"}} 2.0' in metrics


async def test_a_body_at_the_limit_is_read(served: tuple[httpx.AsyncClient, str]) -> None:
    http, _ = served
    body = names_args(gpu_pod("p", 1024), NAMES)
    at_limit = body[:-1] + b" " * (LIMIT - len(body)) + b"}"
    assert len(at_limit) == LIMIT
    for content in (at_limit, chunks(at_limit)):
        response = await http.post(f"{PREFIX}/filter", content=content, headers=JSON)
        assert response.status_code == 200, response.text
        (chosen,) = response.json()["NodeNames"]  # the node the policy places it best on
        assert chosen in NAMES


async def test_the_default_limit_is_16_mib(js: JetStreamContext) -> None:
    await publish(js, cluster())
    async with extender(js) as (http, _):
        body = names_args(gpu_pod("p", 1024), NAMES)
        at_limit = body[:-1] + b" " * (DEFAULT_MAX_BODY_BYTES - len(body)) + b"}"
        answered = await http.post(f"{PREFIX}/filter", content=at_limit, headers=JSON)
        over = await http.post(f"{PREFIX}/filter", content=at_limit + b" ", headers=JSON)
    assert answered.status_code == 200
    assert over.status_code == 413
    assert f"limit of {DEFAULT_MAX_BODY_BYTES} bytes" in over.json()["Error"]


async def test_a_nodelist_of_many_full_nodes_fits_the_default_limit(js: JetStreamContext) -> None:
    """nodeCacheCapable: false, 1,000 nodes as kube-scheduler sends them (2.4 KiB each here;
    real ones 5-30 KiB): well inside 16 MiB, and answered in full."""
    document = json.loads(fixture("filter.request.json"))
    template = document["Nodes"]["items"][0]
    names = [f"node-{i}" for i in range(1000)]
    document["Nodes"]["items"] = [
        {**template, "metadata": {**template["metadata"], "name": name}} for name in names
    ]
    body = json.dumps(document).encode()
    await publish(js, [inventory(name, [card(name, 0)]) for name in names[:3]])
    async with extender(js) as (http, _):
        response = await http.post(f"{PREFIX}/filter", content=body, headers=JSON)
    assert response.status_code == 200
    answer = response.json()
    passed = [item["metadata"]["name"] for item in answer["Nodes"]["items"]]
    assert passed[0] in names[:3]  # three fit; the one the policy places it best on passes
    failed = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert (len(passed), len(failed)) == (1, len(names) - 3)


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    "depth", [MAX_JSON_DEPTH + 1, 1000, 50_000], ids=["just-over", "1000", "50000"]
)
async def test_a_body_nested_too_deep_is_a_400_with_the_reason(
    served: tuple[httpx.AsyncClient, str], verb: str, depth: int
) -> None:
    http, _ = served
    for body in (deep(depth), b'{"Pod": ' + deep(depth - 1) + b"}"):
        response = await http.post(f"{PREFIX}/{verb}", content=body, headers=JSON)
        assert response.status_code == 400, response.text
        error = response.json()["Error"]
        assert error.startswith(f"malformed {verb} request: ")
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in error
        assert "internal error" not in error


async def test_deep_but_legal_bodies_are_answered(served: tuple[httpx.AsyncClient, str]) -> None:
    """Depth within the limit (and brackets inside strings, which do not count)."""
    http, _ = served
    pod = gpu_pod("p", 1024)
    pod["metadata"]["annotations"] = {"note": "[" * 10_000}
    pod["metadata"]["x-extra"] = json.loads(deep(MAX_JSON_DEPTH - 3))
    body = names_args(pod, NAMES)
    for verb in ("filter", "prioritize"):
        response = await http.post(f"{PREFIX}/{verb}", content=body, headers=JSON)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("body", "uid"),
    [
        pytest.param(deep(50_000), "", id="50k-deep"),
        pytest.param(
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"'
            + UID.encode()
            + b'","object":'
            + deep(1000)
            + b"}}",
            UID,
            id="deep-object",
        ),
        pytest.param(b"[]", "", id="array"),
        pytest.param(b"\x00\xff", "", id="bytes"),
        pytest.param(body_of(admission_review({"spec": 5})), UID, id="object-not-a-pod"),
    ],
)
async def test_the_webhook_answers_bad_input_with_a_denying_review(
    served: tuple[httpx.AsyncClient, str], body: bytes, uid: str
) -> None:
    http, _ = served
    status = review_refusal(await http.post(VALIDATE, content=body, headers=JSON), uid, 400)
    assert status["reason"] == "BadRequest"
    assert status["message"].startswith("gpushare: malformed admission request: ")


async def test_the_webhook_answers_an_oversized_review_with_a_denying_review(
    served: tuple[httpx.AsyncClient, str],
) -> None:
    http, url = served
    review = body_of(admission_review(stored_pod("p", 1024)))
    padded = review[:-1] + b"," + b" " * LIMIT + b'"x": 1}'
    declared = review_refusal(await http.post(VALIDATE, content=padded, headers=JSON), "", 413)
    chunked = review_refusal(
        await http.post(VALIDATE, content=chunks(padded), headers=JSON), UID, 413
    )
    for status in (declared, chunked):
        assert status["reason"] == "RequestEntityTooLarge"
        assert f"limit of {LIMIT} bytes" in status["message"]
    head = request_head(VALIDATE, {"Content-Length": str(300 * 1024 * 1024)})
    answer = await raw_exchange(url, head, [])
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["response"]["status"]["code"] == 413


def limits(resources: dict[str, str]) -> dict[str, Any]:
    pod = stored_pod("p")
    pod["spec"]["containers"] = [
        {"name": "main", "image": "x", "resources": {"limits": resources, "requests": resources}}
    ]
    return pod


@pytest.mark.parametrize(
    ("pod", "unit", "rule"),
    [
        pytest.param(stored_pod("p", "99999999999999999999"), "MiB", "memory-over-card-maximum"),
        pytest.param(stored_pod("p", MAX_CARD_MEMORY_MIB + 1), "MiB", "memory-over-card-maximum"),
        pytest.param(stored_pod("p", 1025), "GiB", "memory-over-card-maximum", id="gib"),
        pytest.param(stored_pod("p", 600_000, 600_000), "MiB", "memory-over-card-maximum"),
        pytest.param(limits({NVIDIA_GPU: "65"}), "MiB", "too-many-cards"),
        pytest.param(limits({"gpushare.io/gpu-core": "1e20"}), "MiB", "too-many-cards"),
        pytest.param(
            limits({GPU_MEM: "1024", "gpushare.io/gpu-core": "300"}),
            "MiB",
            "core-over-100-per-card",
        ),
        pytest.param(stored_pod("p", "1e400"), "MiB", "quantity"),
        pytest.param(stored_pod("p", "9" * 5000), "MiB", "quantity"),
        pytest.param(stored_pod("p", "-1"), "MiB", "quantity"),
    ],
)
async def test_quantities_beyond_what_a_card_holds_are_denied_at_admission(
    js: JetStreamContext, pod: dict[str, Any], unit: str, rule: str
) -> None:
    async with extender(js, allocator_settings(memory_unit=unit)) as (http, _):
        response = await http.post(VALIDATE, content=body_of(admission_review(pod)))
        filtered = await http.post(f"{PREFIX}/filter", content=nodes_args(pod, NAMES))
    assert response.status_code == 200
    answer = response.json()["response"]
    assert answer["uid"] == UID
    assert answer["allowed"] is False
    assert (answer["status"]["code"], answer["status"]["reason"]) == (403, "Forbidden")
    assert answer["status"]["message"].startswith(f'gpushare: rule "{rule}": ')
    assert rule in RULES
    assert len(answer["status"]["message"]) < 400
    # the extender reads the same rule: every node refused with it, no error, no 5xx
    assert filtered.status_code == 200
    verdict = filtered.json()
    assert verdict["Error"] == ""
    reasons = {**verdict["FailedNodes"], **verdict["FailedAndUnresolvableNodes"]}
    assert set(reasons) == set(NAMES)
    assert all(rule in reason for reason in reasons.values())
