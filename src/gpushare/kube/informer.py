"""Objects kept in step with the API by list and watch: client-go's informer, the small part.

kube-scheduler decides from such caches, never from a GET per pod; the allocator's bind
checks read them the same way (:class:`gpushare.kube.pod_source.KubernetesPodSource`): an
:class:`Informer` lists a collection once (in pages of 500, each decoded on its own, so
that the event loop runs between them), then follows it with a watch from the list's
resourceVersion, keeping the latest object per key. When the watch fails (410 Gone, the
connection lost, a bad line) it is *unsynced* until a fresh list has replaced everything,
and readers fall back to a GET meanwhile; failures in a row make it wait longer and
longer before that list (:mod:`gpushare.kube.backoff`). Both requests go through aiohttp
on the event loop and decode with msgspec (no pydantic models, no worker thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec

from gpushare.kube.backoff import RelistBackoff
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError
from gpushare.kube.listing import LIST_PAGE, list_raw
from gpushare.kube.watching import watch_raw

log = logging.getLogger(__name__)

T = TypeVar("T")


class Informer(Generic[T]):
    """The objects at ``path`` (e.g. ``/api/v1/nodes``) matching ``field_selector``, by
    ``key``; :meth:`run` keeps them in step until cancelled."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        decode: Callable[[msgspec.Raw], T],
        key: Callable[[T], str],
        *,
        field_selector: str | None = None,
        retry_seconds: float = 1.0,
        watch_seconds: int = 300,
        on_change: Callable[[], None] | None = None,
        page: int = LIST_PAGE,
    ) -> None:
        self._kube = kube
        self._path = path
        self._decode = decode
        self._key = key
        self._field_selector = field_selector
        self._retry_seconds = retry_seconds
        self._watch_seconds = watch_seconds
        self._page = page
        self._items: dict[str, T] = {}
        self._synced = asyncio.Event()
        self._on_change = on_change or (lambda: None)
        """Called after every list and every watched change (to wake a reader)."""

    @property
    def synced(self) -> bool:
        """The cache holds what the API held at some moment since the last failure."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def items(self) -> dict[str, T]:
        """Every object by key, as last seen (empty while not synced)."""
        return dict(self._items) if self._synced.is_set() else {}

    def get(self, key: str) -> T | None:
        """The object of ``key`` as last seen; None when absent or not synced."""
        return self._items.get(key) if self._synced.is_set() else None

    async def run(self) -> None:
        backoff = RelistBackoff(self._retry_seconds)
        while True:
            try:
                version = await self._list()
                await self._watch(version)
            except (KubeError, msgspec.MsgspecError) as error:
                log.info("informer %s: %s; listing again", self._path, error)
            self._synced.clear()
            await asyncio.sleep(backoff.after_failure())

    async def _list(self) -> str:
        """A fresh list, decoded page by page: the event loop runs between pages."""
        version, items = "", {}
        pages = list_raw(self._kube, self._path, self._field_selector, page=self._page)
        async with contextlib.aclosing(pages):
            async for listed_at, page in pages:
                version = listed_at
                for raw in page:
                    item = self._decode(raw)
                    items[self._key(item)] = item
        self._items = items
        self._synced.set()
        self._on_change()
        return version

    async def _watch(self, version: str) -> None:
        events = watch_raw(
            self._kube,
            self._path,
            version,
            field_selector=self._field_selector,
            timeout_seconds=self._watch_seconds,
        )
        async with contextlib.aclosing(events):
            async for kind, raw in events:
                item = self._decode(raw)
                if kind == "DELETED":
                    self._items.pop(self._key(item), None)
                else:
                    self._items[self._key(item)] = item
                self._on_change()
