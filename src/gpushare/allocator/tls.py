"""HTTPS for the extender and the webhook: the server's TLS context, reloaded in place.

cert-manager rotates a certificate by rewriting its Secret; the kubelet then swaps the
mounted files. :class:`ServerCertificates` builds one :class:`ssl.SSLContext` that
uvicorn serves with, and :meth:`~ServerCertificates.reload_if_changed` loads the new
files into that same context, so connections accepted afterwards present the new
certificate while open ones keep theirs: no restart, no dropped request. A rotation that
cannot be loaded (a key that does not match its certificate, a half-written file) is
tried on a scratch context first and leaves the serving one untouched.

Client certificates (``--tls-client-ca-file``) are checked in two steps, because one port
serves callers that hold one (kube-scheduler) and callers that cannot present one (the
kubelet's probes, kube-apiserver calling the webhook, Prometheus):

1. the TLS handshake asks every client for a certificate and refuses one the client CA
   did not sign (:func:`server_context`, ``CERT_OPTIONAL``); a client may present none;
2. :class:`ClientCertificateProtocol` records, per connection, whether a verified
   certificate was presented, in each request's ASGI ``state``
   (:func:`client_verified`), and :class:`ClientCertificateGate` answers 403 to every
   request without one, except on the paths it is told are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpushare.allocator.asgi_reply import reply
from gpushare.allocator.coalescing import CoalescingTransport
from gpushare.allocator.settings import TlsSettings

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[int, int, int], ...]


def _fingerprint(paths: tuple[str, ...]) -> Fingerprint:
    """What changes when a file is rewritten or its Secret symlink is swapped."""
    stats = [os.stat(path) for path in paths]
    return tuple((stat.st_ino, stat.st_size, stat.st_mtime_ns) for stat in stats)


def _load(context: ssl.SSLContext, tls: TlsSettings) -> None:
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        context.load_verify_locations(cafile=tls.client_ca_file)


def server_context(tls: TlsSettings) -> ssl.SSLContext:
    """TLS 1.2 or later. With a client CA, every client is asked for a certificate and one
    the CA did not sign fails the handshake; which requests need one is the gate's call."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.client_ca_file:
        context.verify_mode = ssl.CERT_OPTIONAL
    _load(context, tls)
    return context


class ServerCertificates:
    """The serving :class:`ssl.SSLContext` and the files it was loaded from."""

    def __init__(self, tls: TlsSettings) -> None:
        self.tls = tls
        self._paths = tuple(
            path for path in (tls.cert_file, tls.key_file, tls.client_ca_file) if path
        )
        self._seen = _fingerprint(self._paths)
        self._refused: Fingerprint | None = None
        self.context = server_context(tls)

    def uvicorn_factory(self, _config: Any, _default: Any) -> ssl.SSLContext:
        """uvicorn's ``ssl_context_factory``: serve with this (reloadable) context."""
        return self.context

    def reload_if_changed(self) -> bool:
        """Load the files into the serving context if they changed; whether it did."""
        try:
            seen = _fingerprint(self._paths)
        except OSError as error:  # a Secret's symlinks are being swapped: next time
            log.debug("tls: certificate files unreadable for now: %s", error)
            return False
        if seen == self._seen:
            return False
        try:
            server_context(self.tls)  # refuses a broken rotation before it can hurt
            _load(self.context, self.tls)
        except (OSError, ssl.SSLError) as error:
            if seen != self._refused:  # once per version of the files, not every check
                log.warning("tls: certificate files changed but cannot be loaded yet: %s", error)
                self._refused = seen
            return False
        self._seen = seen
        log.info("tls: reloaded the serving certificate from %s", self.tls.cert_file)
        return True

    async def watch(self) -> None:
        """Check the files every ``reload_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(self.tls.reload_seconds)
            self.reload_if_changed()


@contextlib.asynccontextmanager
async def watching(certificates: ServerCertificates | None) -> AsyncIterator[None]:
    """Reload ``certificates`` on rotation for as long as the block runs."""
    if certificates is None or certificates.tls.reload_seconds <= 0:
        yield
        return
    task = asyncio.create_task(certificates.watch(), name="tls certificate reload")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- which requests came with a verified client certificate ---------------------------

CLIENT_VERIFIED = "gpushare.client_certificate_verified"
"""Key of each request's ASGI ``state``: whether its connection presented a client
certificate that the client CA verified."""
ARRIVED = "gpushare.request_arrived"
"""Key of each request's ASGI ``state``: when (``time.perf_counter``) its first bytes were
read, so that a verb can tell how long it waited for the event loop before it started."""


def _presented_certificate(transport: asyncio.BaseTransport) -> bool:
    """A verified peer certificate: with ``CERT_OPTIONAL`` the handshake already refused
    any other, so a certificate that is there is one the client CA signed."""
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return False
    return bool(ssl_object.getpeercert())


class ClientCertificateProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (``http=`` of its Config; httptools, the C parser: at
    three calls per pod, h11's pure-Python parsing was a tenth of the allocator's CPU), one
    per connection, that puts :data:`CLIENT_VERIFIED` into the state every request of the
    connection gets, and :data:`ARRIVED` into each request's, and whose answers each leave
    in one send (:mod:`.coalescing`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        verified = _presented_certificate(transport)
        self.app_state = {**self.app_state, CLIENT_VERIFIED: verified}
        loop = asyncio.get_running_loop()
        wrapped = CoalescingTransport(cast(asyncio.Transport, transport), loop)
        super().connection_made(wrapped)  # (uvloop's transports are not asyncio.Transport's)

    def data_received(self, data: bytes) -> None:
        # uvicorn copies the connection's state into the scope of each request that
        # begins in these bytes
        self.app_state[ARRIVED] = time.perf_counter()
        super().data_received(data)


def client_verified(scope: Mapping[str, Any]) -> bool:
    """Whether the request's connection presented a verified client certificate (false
    over plain HTTP, and for an app not served through :class:`ClientCertificateProtocol`)."""
    state = scope.get("state") or {}
    return state.get(CLIENT_VERIFIED) is True


ASGIApp = Any
"""An ASGI application (``scope, receive, send``); Starlette's type, kept loose here."""

FORBIDDEN = 403


class ClientCertificateGate:
    """ASGI middleware: a request without a verified client certificate gets 403 unless its
    path is one of ``open_paths`` or lies under one of ``open_prefixes``.

    Answers before the app reads a byte of the body. Lifespan and other non-HTTP scopes
    pass through.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        open_paths: Collection[str] = (),
        open_prefixes: Collection[str] = (),
    ) -> None:
        self.app = app
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = tuple(prefix.rstrip("/") for prefix in open_prefixes)

    def is_open(self, path: str) -> bool:
        if path in self.open_paths:
            return True
        return any(path == p or path.startswith(f"{p}/") for p in self.open_prefixes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or client_verified(scope) or self.is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        log.info(
            "tls: refused %s %s from %s: no client certificate",
            scope.get("method", "?"),
            scope["path"],
            (scope.get("client") or ("?",))[0],
        )
        body = json.dumps(
            {"error": "a client certificate signed by the allocator's client CA is required"}
        ).encode()
        await reply(send, FORBIDDEN, body)
