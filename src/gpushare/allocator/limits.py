"""A ceiling on request bodies, as pure ASGI middleware in front of the whole app.

Without it a handler's ``await request.body()`` holds whatever a client sends: two
300 MiB bodies at once took the allocator past its 1 GiB memory limit. Here a body is
refused with 413 and a JSON reason

* before a byte of it is read when its ``Content-Length`` is over the limit, and
* as soon as the bytes read pass the limit when it comes chunked (no length given),

so no more than the limit (plus the one chunk that crossed it) is ever held. A body
within the limit is read here and handed to the app as one message. What is left of a
refused body is read and dropped by the server (uvicorn), which keeps the connection.

The refusal is the same for every path unless the app names another for a path: the
admission webhook answers an AdmissionReview instead, since the kube-apiserver reads
anything else as a failed call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpushare.allocator.asgi_reply import JSON, reply

log = logging.getLogger(__name__)

PAYLOAD_TOO_LARGE = 413
HEAD_BYTES = 4096
"""How much of a refused chunked body is kept for its refusal (an AdmissionReview's uid)."""


@dataclass(frozen=True, kw_only=True)
class Oversized:
    """A request refused for its body's size."""

    path: str
    limit: int
    declared: int | None
    """Its ``Content-Length``; ``None`` when it came chunked."""
    head: bytes = b""
    """The first bytes of the body (up to :data:`HEAD_BYTES`); empty when refused on
    ``Content-Length``, before reading any."""


@dataclass(frozen=True)
class Refusal:
    """The answer to an oversized request."""

    status: int
    body: bytes
    content_type: str = JSON


Refuse = Callable[[Oversized], Refusal]


def describe(oversized: Oversized) -> str:
    """Why the request was refused, for the client and the log."""
    size = f" of {oversized.declared} bytes" if oversized.declared is not None else ""
    return (
        f"request body{size} is over the allocator's limit of {oversized.limit} bytes "
        "(--max-body-bytes, GPUSHARE_MAX_BODY_BYTES)"
    )


def too_large(oversized: Oversized) -> Refusal:
    """The default refusal: 413 with ``{"Error": reason}``, as the extender's 400s."""
    return Refusal(PAYLOAD_TOO_LARGE, msgspec.json.encode({"Error": describe(oversized)}))


def content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``; ``None`` when absent or unreadable (the server
    refuses a malformed one before the app sees the request)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.strip()
            return int(text) if text.isdigit() and len(text) < 20 else None
    return None


class BodyLimit:
    """Refuses request bodies over ``max_bytes`` (see the module's docstring).

    ``refusals`` names another answer for some paths; ``observe`` is told the path of
    every refused request (for metrics).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        refusals: Mapping[str, Refuse] | None = None,
        observe: Callable[[str], None] | None = None,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        self.refusals = dict(refusals or {})
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(Oversized(path=path, limit=self.max_bytes, declared=declared), send)
            return
        body = await self._read(path, receive)
        if body is None:
            return  # the client went away: nobody to answer
        if isinstance(body, Oversized):
            await self._refuse(body, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, path: str, receive: Receive) -> bytes | Oversized | None:
        """The whole body, or why not: too large (its head kept), or the client left."""
        chunks: list[bytes] = []
        head = b""
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if len(head) < HEAD_BYTES:
                head += chunk[: HEAD_BYTES - len(head)]
            if size > self.max_bytes:
                return Oversized(path=path, limit=self.max_bytes, declared=None, head=head)
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, oversized: Oversized, send: Send) -> None:
        refusal = self.refusals.get(oversized.path, too_large)(oversized)
        log.info("%s: %d, %s", oversized.path, refusal.status, describe(oversized))
        if self.observe is not None:
            self.observe(oversized.path)
        await reply(send, refusal.status, refusal.body, refusal.content_type)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the body already read, in one message, then the server's
    own ``receive`` (which tells of a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
