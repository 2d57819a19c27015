"""The stand-in's storage: objects, one resourceVersion counter, and the watch history.

Like etcd behind the apiserver, every write bumps one cluster-wide revision, and the
object's ``metadata.resourceVersion`` is the revision of its last write. Writes are kept
in a bounded history so that a watch can resume from a resourceVersion; a watch from a
revision older than the history answers 410 Gone, as upstream.

Stored objects are never mutated: a write stores a new dict. That lets watchers and the
history share them safely. Everything runs on one event loop, so a snapshot and a watch
subscription taken without an ``await`` in between are consistent.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from gpushare.embedded.kube_status import gone, not_found

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Key = tuple[str, str, str]
"""(resource, namespace or ``""`` for cluster-scoped, name)."""


@dataclass(frozen=True)
class Change:
    """One write, as a watch reports it."""

    revision: int
    resource: str
    type: EventType
    obj: dict[str, Any]
    old: dict[str, Any] | None = None
    """The object before a MODIFIED write (for selectors that stop or start matching)."""


@dataclass(eq=False)
class Subscription:
    """A live watch: changes to ``resource`` land on ``queue``; ``None`` means shut down."""

    resource: str
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)


def key_of(resource: str, obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return resource, meta.get("namespace") or "", meta.get("name") or ""


class ObjectStore:
    def __init__(self, history_size: int = 10_000) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.revision = 0
        self.history: deque[Change] = deque(maxlen=history_size)
        self.compacted = 0
        """The newest revision no longer in ``history``: watching from before it is 410."""
        self.subscriptions: set[Subscription] = set()

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((resource, namespace, name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    def find(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((resource, namespace, name))

    def objects_of(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``resource`` (in ``namespace`` unless None), in key order."""
        return [
            obj
            for (kind, ns, _), obj in sorted(self.objects.items(), key=lambda item: item[0])
            if kind == resource and (namespace is None or ns == namespace)
        ]

    def write(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace ``obj``; stamps and returns the stored copy."""
        key = key_of(resource, obj)
        old = self.objects.get(key)
        stored = self._stamp(obj)
        self.objects[key] = stored
        kind: EventType = "ADDED" if old is None else "MODIFIED"
        self._record(Change(self.revision, resource, kind, stored, old))
        return stored

    def delete(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        old = self.objects.pop((resource, namespace, name), None)
        if old is None:
            raise not_found(resource, name)
        stored = self._stamp(old)
        self._record(Change(self.revision, resource, "DELETED", stored, old))
        return stored

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.revision += 1
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        return stored

    def _record(self, change: Change) -> None:
        if len(self.history) == self.history.maxlen and self.history:
            self.compacted = self.history[0].revision
        self.history.append(change)
        for subscription in self.subscriptions:
            if subscription.resource == change.resource:
                subscription.queue.put_nowait(change)

    def changes_since(self, resource: str, revision: int) -> list[Change]:
        """Changes to ``resource`` after ``revision``; 410 when they were compacted away."""
        if revision < self.compacted:
            raise gone(f"too old resource version: {revision} ({self.compacted + 1})")
        return [c for c in self.history if c.resource == resource and c.revision > revision]

    def subscribe(self, resource: str) -> Subscription:
        subscription = Subscription(resource)
        self.subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscriptions.discard(subscription)

    def close_subscriptions(self) -> None:
        """End every watch (server shutdown)."""
        for subscription in self.subscriptions:
            subscription.queue.put_nowait(None)
