"""HTTPS for the extender and the webhook: the server's TLS context, reloaded in place.

cert-manager rotates a certificate by rewriting its Secret; the kubelet then swaps the
mounted files. :class:`ServerCertificates` builds one :class:`ssl.SSLContext` that
uvicorn serves with, and :meth:`~ServerCertificates.reload_if_changed` loads the new
files into that same context, so connections accepted afterwards present the new
certificate while open ones keep theirs: no restart, no dropped request. A rotation that
cannot be loaded (a key that does not match its certificate, a half-written file) is
tried on a scratch context first and leaves the serving one untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any

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
    """TLS 1.2 or later; client certificates required when a client CA is configured."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.client_ca_file:
        context.verify_mode = ssl.CERT_REQUIRED
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
