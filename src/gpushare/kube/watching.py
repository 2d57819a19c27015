"""Following changes: list once, then watch from the list's resourceVersion.

The watch is read with aiohttp on the event loop, through the kube client's own
configuration (host, TLS, bearer token). When the server ends a watch
(``timeoutSeconds``) the next one opens from the last resourceVersion seen; a 410
(history compacted) or a failure ends the iteration with a ``KubeError`` and the caller
lists again. Closing the iterator closes the connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import msgspec

from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import from_status, transport_error

WatchType = Literal["ADDED", "MODIFIED", "DELETED"]
_TYPES: dict[str, WatchType] = {"ADDED": "ADDED", "MODIFIED": "MODIFIED", "DELETED": "DELETED"}

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The longest watch line read (etcd stores objects of at most 1.5 MiB)."""


@dataclass(frozen=True)
class PodEvent:
    type: WatchType
    pod: Pod


class _Versioned(msgspec.Struct, frozen=True):
    metadata: dict[str, Any] = {}


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw


class _ErrorStatus(msgspec.Struct, frozen=True):
    code: int = 0
    message: str = ""


_event = msgspec.json.Decoder(_Event)
_pod = msgspec.json.Decoder(Pod)
_versioned = msgspec.json.Decoder(_Versioned)
_status = msgspec.json.Decoder(_ErrorStatus)


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status < 400:
        return
    body = await response.read()
    try:
        message = _status.decode(body).message
    except msgspec.MsgspecError:
        message = body.decode(errors="replace").strip()[:500]
    raise from_status(response.status, message or response.reason or f"HTTP {response.status}")


async def _lines(response: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
    while not response.content.at_eof():
        line = await response.content.readuntil(b"\n", max_size=MAX_EVENT_BYTES)
        if line.strip():
            yield line


async def watch_pods(
    kube: KubeClient,
    resource_version: str,
    *,
    field_selector: str | None = None,
    timeout_seconds: int = 60,
) -> AsyncGenerator[PodEvent, None]:
    """Pod events after ``resource_version``, until closed or a ``KubeError`` is raised.

    Use it under ``contextlib.aclosing`` so that leaving the loop closes the connection.
    """
    events = watch_raw(
        kube,
        "/api/v1/pods",
        resource_version,
        field_selector=field_selector,
        timeout_seconds=timeout_seconds,
    )
    async with contextlib.aclosing(events):
        async for kind, raw in events:
            yield PodEvent(kind, _pod.decode(raw))


async def watch_raw(
    kube: KubeClient,
    path: str,
    resource_version: str,
    *,
    field_selector: str | None = None,
    timeout_seconds: int = 60,
) -> AsyncGenerator[tuple[WatchType, msgspec.Raw], None]:
    """The events of the collection at ``path`` after ``resource_version`` (type, object
    undecoded), until closed or a ``KubeError`` is raised; the watch is opened again from
    the last resourceVersion seen each time the server ends it (``timeoutSeconds``).

    The watch asks for bookmarks, as client-go's informers do: kube-apiserver then tells
    it the collection's resourceVersion before each round ends, even when nothing it
    selects changed. Without them a quiet selection (the allocator's unscheduled pods, on
    a cluster where every pod is placed) resumed from the version it started at, and once
    that version had left the API server's window of recent changes, the resume was a
    410 Gone and a fresh list."""
    params = {
        "watch": "true",
        "timeoutSeconds": str(timeout_seconds),
        "allowWatchBookmarks": "true",
    }
    if field_selector:
        params["fieldSelector"] = field_selector
    url = kube.base_url + path
    try:
        async with kube.open_session(timeout_seconds + 30) as session:
            while True:  # each round ends when the server ends the watch (timeoutSeconds)
                query = {**params, "resourceVersion": resource_version}
                async with session.get(url, params=query, proxy=kube.proxy) as response:
                    await _raise_for_status(response)
                    async for line in _lines(response):
                        event = _event.decode(line)
                        if event.type == "ERROR":
                            status = _status.decode(event.object)
                            raise from_status(status.code, status.message or "watch error")
                        version = _versioned.decode(event.object).metadata.get("resourceVersion")
                        resource_version = str(version) if version else resource_version
                        if event.type in _TYPES:
                            yield _TYPES[event.type], event.object
    except (aiohttp.ClientError, OSError, TimeoutError, msgspec.MsgspecError) as error:
        raise transport_error(error) from error
