"""``?watch=true``: a chunked stream of ``{"type": ..., "object": ...}`` lines.

Semantics follow the apiserver's watch cache closely enough for ``kubernetes.watch``
and for gpushare's own list-then-watch loops:

* no ``resourceVersion`` (or ``"0"``): synthetic ``ADDED`` for every matching object, then
  live changes;
* ``resourceVersion=N``: every change after N, then live changes; N older than the kept
  history: one ``ERROR`` event carrying a 410 Status, then the stream ends;
* selectors apply to both the old and the new object, so an object that stops matching
  is reported ``DELETED`` and one that starts matching ``ADDED``;
* ``timeoutSeconds`` ends the stream cleanly, as does the server shutting down;
* ``allowWatchBookmarks=true``: a ``BOOKMARK`` event (only the kind and the current
  resourceVersion) before a stream ends by its timeout, so a watch over a quiet selection
  resumes from now rather than from where it began. kube-apiserver 1.36 sends one about
  two seconds before the deadline (and about once a minute on a long watch); the
  stand-in sends the one at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpushare.embedded.kube_objects import Resource
from gpushare.embedded.kube_selectors import Predicate
from gpushare.embedded.kube_status import StatusError, bad_request
from gpushare.embedded.kube_store import Change, ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchRequest:
    resource: Resource
    namespace: str
    """``""`` watches every namespace."""
    predicate: Predicate
    resource_version: str
    timeout_seconds: float | None
    bookmarks: bool = False
    """``allowWatchBookmarks``: the watcher takes ``BOOKMARK`` events."""

    def selects(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        return (not self.namespace or namespace == self.namespace) and self.predicate(obj)


def visible_event(request: WatchRequest, change: Change) -> dict[str, Any] | None:
    """The event this watcher sees for ``change``, if any."""
    now = request.selects(change.obj)
    kind = change.type
    if kind == "MODIFIED":
        before = request.selects(change.old)
        if not now and not before:
            return None
        kind = "MODIFIED" if now and before else ("ADDED" if now else "DELETED")
    elif not now:
        return None
    return {"type": kind, "object": change.obj}


def parse_revision(text: str) -> int:
    try:
        revision = int(text)
    except ValueError:
        raise bad_request(f"invalid resource version: {text!r}") from None
    if revision < 0:
        raise bad_request(f"invalid resource version: {text!r}")
    return revision


def initial_changes(store: ObjectStore, request: WatchRequest) -> list[Change]:
    if request.resource_version in ("", "0"):
        plural = request.resource.plural
        return [Change(store.revision, plural, "ADDED", obj) for obj in store.objects_of(plural)]
    return store.changes_since(request.resource.plural, parse_revision(request.resource_version))


def bookmark(request: WatchRequest, revision: int) -> dict[str, Any]:
    """The event that tells a watcher the collection is at ``revision`` (an object
    holding nothing but its kind and that resourceVersion, as kube-apiserver sends it)."""
    resource = request.resource
    return {
        "type": "BOOKMARK",
        "object": {
            "kind": resource.kind,
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(revision)},
        },
    }


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


async def _send(
    response: web.StreamResponse, request: WatchRequest, changes: Iterable[Change]
) -> None:
    for change in changes:
        event = visible_event(request, change)
        if event is not None:
            await response.write(_line(event))


async def serve_watch(
    http: web.Request, store: ObjectStore, request: WatchRequest
) -> web.StreamResponse:
    subscription = store.subscribe(request.resource.plural)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    try:
        try:
            backlog = initial_changes(store, request)
        except StatusError as error:
            if error.code != 410:
                raise
            await response.prepare(http)
            await response.write(_line({"type": "ERROR", "object": error.body()}))
            return response
        await response.prepare(http)
        await _send(response, request, backlog)
        with contextlib.suppress(ConnectionError):
            try:
                async with asyncio.timeout(request.timeout_seconds):
                    while (change := await subscription.queue.get()) is not None:
                        await _send(response, request, (change,))
            except TimeoutError:
                if request.bookmarks:
                    await response.write(_line(bookmark(request, store.revision)))
    finally:
        store.unsubscribe(subscription)
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response
