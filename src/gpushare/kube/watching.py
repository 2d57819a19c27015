"""Following pod changes: list once, then watch from the list's resourceVersion.

The official client's watch is a blocking read of a chunked HTTP answer, so it runs in
its own thread and hands events to the event loop. When the server ends a watch
(``timeoutSeconds``) the thread opens the next one from the last resourceVersion seen;
a 410 (history compacted) or a failure ends the iteration with a ``KubeError`` and the
caller lists again. Closing the iterator unblocks the thread by shutting its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from kubernetes.watch.watch import iter_resp_lines

from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError, TemporaryError, classify, from_status

log = logging.getLogger(__name__)

WatchType = Literal["ADDED", "MODIFIED", "DELETED"]


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


_lines: Any = iter_resp_lines  # untyped upstream
_event = msgspec.json.Decoder(_Event)
_pod = msgspec.json.Decoder(Pod)
_versioned = msgspec.json.Decoder(_Versioned)
_status = msgspec.json.Decoder(_ErrorStatus)

Item = PodEvent | KubeError | None


class _WatchThread(threading.Thread):
    """Reads watch answers one after another; puts events (or the final error) on ``queue``."""

    def __init__(
        self,
        kube: KubeClient,
        resource_version: str,
        field_selector: str | None,
        timeout_seconds: int,
        queue: asyncio.Queue[Item],
    ) -> None:
        super().__init__(name="pod-watch", daemon=True)
        self.kube = kube
        self.resource_version = resource_version
        self.field_selector = field_selector
        self.timeout_seconds = timeout_seconds
        self.queue = queue
        self.loop = asyncio.get_running_loop()
        self.stopping = threading.Event()
        self.response: Any = None

    def put(self, item: Item) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.watch_once()
            self.put(None)
        except Exception as error:
            if self.stopping.is_set():
                self.put(None)
                return
            mapped = classify(error) or TemporaryError(f"{type(error).__name__}: {error}")
            self.put(mapped)

    def watch_once(self) -> None:
        kwargs: dict[str, Any] = (
            {"field_selector": self.field_selector} if self.field_selector else {}
        )
        self.response = self.kube.core.list_pod_for_all_namespaces(
            watch=True,
            resource_version=self.resource_version,
            timeout_seconds=self.timeout_seconds,
            _preload_content=False,
            _request_timeout=(self.kube.timeout[0], self.timeout_seconds + 30),
            **kwargs,
        )
        try:
            if self.stopping.is_set():  # stop() came while the request was being opened
                return
            for line in _lines(self.response):
                if self.stopping.is_set():
                    return
                if line:
                    self.handle(line)
        finally:
            self.response.close()
            self.response.release_conn()

    def handle(self, line: str) -> None:
        event = _event.decode(line)
        if event.type == "ERROR":
            status = _status.decode(event.object)
            raise from_status(status.code, status.message or "watch error")
        version = _versioned.decode(event.object).metadata.get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if event.type in ("ADDED", "MODIFIED", "DELETED"):
            self.put(PodEvent(event.type, _pod.decode(event.object)))  # type: ignore[arg-type]

    def stop(self) -> None:
        """Unblock a read in progress (the way ``kubernetes.watch.Watch.stop`` does)."""
        self.stopping.set()
        connection = getattr(self.response, "connection", None)
        sock = getattr(connection, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


async def watch_pods(
    kube: KubeClient,
    resource_version: str,
    *,
    field_selector: str | None = None,
    timeout_seconds: int = 60,
) -> AsyncGenerator[PodEvent, None]:
    """Pod events after ``resource_version``, until closed or a ``KubeError`` is raised.

    Use it under ``contextlib.aclosing`` so that leaving the loop stops the thread.
    """
    queue: asyncio.Queue[Item] = asyncio.Queue()
    thread = _WatchThread(kube, resource_version, field_selector, timeout_seconds, queue)
    thread.start()
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, KubeError):
                raise item
            yield item
    finally:
        thread.stop()
        await asyncio.to_thread(thread.join, 5.0)
