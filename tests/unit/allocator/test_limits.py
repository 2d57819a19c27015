"""The body-limit middleware, driven as ASGI: what it reads, what it answers, what it passes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.allocator.limits import (
    HEAD_BYTES,
    BodyLimit,
    Oversized,
    Refusal,
    content_length,
)

LIMIT = 1000


class Client:
    """The server's side of one request: its messages, and what was read and answered."""

    def __init__(self, chunks: Iterable[bytes], *, disconnect: bool = False) -> None:
        parts = list(chunks)
        self.messages: list[dict[str, Any]] = [
            {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
            for i, part in enumerate(parts)
        ]
        if disconnect:
            self.messages = [*self.messages[:1], {"type": "http.disconnect"}]
        self.received = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.received < len(self.messages):
            self.received += 1
            return self.messages[self.received - 1]
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


class Echo:
    """An app that reads the whole body, as FastAPI's ``request.body()`` does."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def scope(path: str = "/x", length: int | str | None = None) -> dict[str, Any]:
    headers = [(b"host", b"x")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": "POST", "path": path, "headers": headers}


async def run(client: Client, request: dict[str, Any], **options: Any) -> tuple[Echo, list[str]]:
    app, observed = Echo(), []
    limited = BodyLimit(app, max_bytes=LIMIT, observe=observed.append, **options)
    await limited(request, client.receive, client.send)
    return app, observed


@pytest.mark.parametrize(
    "chunks",
    [[b""], [b"x" * LIMIT], [b"a" * 400, b"", b"b" * 600], [b"1"] * LIMIT],
    ids=["empty", "exactly-the-limit", "chunked-to-the-limit", "byte-by-byte"],
)
async def test_a_body_within_the_limit_reaches_the_app_whole(chunks: list[bytes]) -> None:
    client = Client(chunks)
    app, observed = await run(client, scope())
    assert app.bodies == [b"".join(chunks)]
    assert (client.status, client.body) == (200, b"ok")
    assert observed == []


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    client = Client([b"x" * (LIMIT + 1)])
    app, observed = await run(client, scope("/gpushare-scheduler/filter", LIMIT + 1))
    assert client.received == 0
    assert app.calls == 0
    assert client.status == 413
    assert client.headers[b"content-type"] == b"application/json"
    assert int(client.headers[b"content-length"]) == len(client.body)
    error = json.loads(client.body)["Error"]
    assert f"of {LIMIT + 1} bytes" in error
    assert f"limit of {LIMIT} bytes" in error
    assert "--max-body-bytes" in error
    assert observed == ["/gpushare-scheduler/filter"]


async def test_a_chunked_body_is_refused_at_the_chunk_that_passes_the_limit() -> None:
    chunks = [b"y" * 300] * 10  # 3000 bytes, the limit is passed in the fourth chunk
    client = Client(chunks)
    app, observed = await run(client, scope())
    assert client.received == 4
    assert app.calls == 0
    assert client.status == 413
    assert f"limit of {LIMIT} bytes" in json.loads(client.body)["Error"]
    assert observed == ["/x"]


async def test_a_path_may_answer_otherwise_and_gets_the_head_of_the_body() -> None:
    seen: list[Oversized] = []

    def review(oversized: Oversized) -> Refusal:
        seen.append(oversized)
        return Refusal(200, b'{"kind":"AdmissionReview"}')

    chunks = [b"h" * 600, b"i" * 600, b"j" * 600]
    client = Client(chunks)
    await run(client, scope("/validate"), refusals={"/validate": review})
    assert (client.status, client.body) == (200, b'{"kind":"AdmissionReview"}')
    (oversized,) = seen
    assert (oversized.path, oversized.limit, oversized.declared) == ("/validate", LIMIT, None)
    assert oversized.head == b"h" * 600 + b"i" * 600  # what was read, up to HEAD_BYTES

    other = Client(chunks)
    await run(other, scope("/filter"), refusals={"/validate": review})
    assert other.status == 413


async def test_the_head_kept_is_at_most_head_bytes() -> None:
    seen: list[Oversized] = []

    def keep(oversized: Oversized) -> Refusal:
        seen.append(oversized)
        return Refusal(413, b"{}")

    client = Client([b"k"] * (LIMIT + 1))
    app = Echo()
    await BodyLimit(app, max_bytes=LIMIT, refusals={"/x": keep})(
        scope(), client.receive, client.send
    )
    big = Client([b"z" * (HEAD_BYTES * 3)])
    await BodyLimit(app, max_bytes=LIMIT, refusals={"/x": keep})(scope(), big.receive, big.send)
    assert [len(oversized.head) for oversized in seen] == [LIMIT + 1, HEAD_BYTES]


async def test_a_client_that_leaves_mid_body_gets_no_answer() -> None:
    client = Client([b"a" * 10, b"b" * 10], disconnect=True)
    app, _ = await run(client, scope())
    assert app.calls == 0
    assert client.sent == []


async def test_after_the_body_the_app_still_hears_of_a_disconnect() -> None:
    messages: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        messages.append(await receive())
        messages.append(await receive())

    client = Client([b"body"])
    await BodyLimit(app, max_bytes=LIMIT)(scope(), client.receive, client.send)
    assert messages == [
        {"type": "http.request", "body": b"body", "more_body": False},
        {"type": "http.disconnect"},
    ]


async def test_other_scopes_pass_untouched() -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    client = Client([b"x" * (LIMIT * 2)])
    await BodyLimit(app, max_bytes=LIMIT)({"type": "lifespan"}, client.receive, client.send)
    assert reached == ["lifespan"]
    assert client.received == 0


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        BodyLimit(Echo(), max_bytes=0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("0", 0), ("1234", 1234), (" 12 ", 12), ("-1", None), ("1e3", None)],
)
def test_content_length(value: str | None, expected: int | None) -> None:
    assert content_length(scope(length=value)) == expected


def test_a_content_length_too_long_to_be_true_is_not_read() -> None:
    assert content_length(scope(length="9" * 40)) is None


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 400), max_size=8), declare=st.booleans())
async def test_any_body_is_passed_whole_or_refused_by_its_size(
    sizes: list[int], declare: bool
) -> None:
    chunks = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)] or [b""]
    total = sum(map(len, chunks))
    client = Client(chunks)
    app, observed = await run(client, scope(length=total if declare else None))
    if total > LIMIT:
        assert client.status == 413
        assert app.calls == 0
        assert observed == ["/x"]
        read = sum(len(m["body"]) for m in client.messages[: client.received])
        assert read <= LIMIT + max(map(len, chunks))
    else:
        assert app.bodies == [b"".join(chunks)]
        assert observed == []
