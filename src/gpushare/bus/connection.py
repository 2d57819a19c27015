"""Connecting to NATS: services (:func:`connect`, reconnecting forever) and one-shot
commands (:func:`open_client`: bounded in time, failing with the reason in one line)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from dataclasses import dataclass

import nats
from nats import errors as nats_errors
from nats.aio.client import Client

from gpushare.bus.credentials import NatsCredentials

log = logging.getLogger(__name__)


def redact(urls: str) -> str:
    """NATS URLs without their user:password part (secrets never reach the logs)."""
    return ",".join(re.sub(r"//[^@/]*@", "//***@", url) for url in urls.split(","))


async def connect(
    url: str,
    name: str,
    credentials: NatsCredentials | None = None,
    tls_server_name: str = "",
) -> Client:
    """A client that reconnects forever: a service outlives a nats-server restart.

    ``credentials`` (default: :meth:`NatsCredentials.from_env`) authenticate it and turn
    TLS on; they are never logged. ``tls_server_name`` is the name the server's
    certificate is checked against (default: the URL's host).
    """
    shown = redact(url)
    credentials = NatsCredentials.from_env() if credentials is None else credentials

    async def on_error(error: Exception) -> None:
        log.warning("nats: %s", error)

    async def on_disconnect() -> None:
        log.warning("nats: disconnected from %s", shown)

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s", shown)

    return await nats.connect(
        servers=url.split(","),
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        **_tls_name(tls_server_name),
        **credentials.connect_options(url),
    )


DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""How long a command waits for NATS (TCP, TLS handshake, CONNECT) before saying why not."""


@dataclass(frozen=True)
class ConnectOptions:
    """How a command reaches NATS, beyond the URL and who it is."""

    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """The whole first connection's limit (default 10 s)."""
    tls_server_name: str = ""
    """Check the server's certificate against this name instead of the URL's host (the
    SSL context's ``server_hostname``): a port-forward reaches an in-cluster server as
    127.0.0.1, which its certificate does not name (default: the URL's host)."""
    reconnect: bool = False
    """After the first connection, reconnect if it drops (``--follow``); the first
    connection itself is tried once, never retried."""


class NatsUnreachable(ConnectionError):
    """NATS did not answer, or refused: the message says why, in one line, no secret."""


def _tls_name(tls_server_name: str) -> dict[str, str]:
    return {"tls_hostname": tls_server_name} if tls_server_name else {}


def _why(error: BaseException, options: ConnectOptions, host: str) -> str:
    """One line an operator can act on, for what the first connection raised."""
    if isinstance(error, ssl.SSLCertVerificationError):
        said = error.verify_message or str(error)
        if "mismatch" in said or "hostname" in said.lower():
            name = options.tls_server_name or host
            return (
                f"TLS: the server's certificate does not match {name!r} ({said}); pass "
                "--tls-server-name NAME with a name the certificate holds"
            )
        return (
            f"TLS: the server's certificate is not trusted ({said}); set "
            "GPUSHARE_NATS_CA to the CA that signed it"
        )
    if isinstance(error, ssl.SSLError):
        return f"TLS handshake failed ({error.reason or error})"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return f"no answer within {options.timeout_s:g}s (--connect-timeout)"
    if isinstance(error, nats_errors.AuthorizationError):
        return "authorization violation: the user or password was refused"
    if isinstance(error, nats_errors.NoServersError):
        return "no server answered"
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _abandon(nc: Client) -> None:
    """Close the socket of a client whose first connection failed: nats-py leaves it open
    when it gives up without reconnecting (and closing it its own way can hang on TLS)."""
    transport = getattr(nc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


def _host(url: str) -> str:
    first = url.split(",", maxsplit=1)[0]
    return re.sub(r"^[a-z]+://([^@/]*@)?", "", first).rsplit(":", 1)[0].strip("[]")


async def open_client(
    url: str,
    name: str,
    credentials: NatsCredentials | None = None,
    options: ConnectOptions | None = None,
) -> Client:
    """A command's client: one try, within ``options.timeout_s``, or :class:`NatsUnreachable`
    saying why (the certificate does not match, the handshake failed, refused, no answer).

    nats-py left to itself retries a failed TLS handshake forever (and hangs closing it):
    the first connection here is never retried, and the whole of it is bounded in time.
    """
    options = ConnectOptions() if options is None else options
    credentials = NatsCredentials.from_env() if credentials is None else credentials

    connected = False
    failures: list[BaseException] = []

    async def on_error(error: Exception) -> None:
        """The first connection's failures are reported once, by the caller; later ones
        (a ``--follow`` that lost its server) are logged."""
        if connected:
            log.warning("nats: %s", error)
        else:
            failures.append(error)

    nc = Client()
    try:
        await asyncio.wait_for(
            nc.connect(
                servers=url.split(","),
                name=name,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                dont_randomize=True,
                connect_timeout=max(1, round(options.timeout_s)),
                error_cb=on_error,
                tls_hostname=options.tls_server_name or None,
                **credentials.connect_options(url),
            ),
            timeout=options.timeout_s,
        )
    except Exception as error:
        _abandon(nc)
        # nats-py tries each server (of a list) before NoServersError: the last try's
        # own error is the reason.
        cause = (
            failures[-1] if isinstance(error, nats_errors.NoServersError) and failures else error
        )
        why = _why(cause, options, _host(url))
        raise NatsUnreachable(f"cannot reach NATS at {redact(url)}: {why}") from None
    connected = True
    if options.reconnect:
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
    return nc


def _not_eof_note(record: logging.LogRecord) -> bool:
    return "eof_received" not in record.getMessage()


async def close_client(nc: Client) -> None:
    """Close a command's client without asyncio's note that a TLS connection ignores its
    peer's EOF (a client closing on purpose is no news)."""
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addFilter(_not_eof_note)
    try:
        await nc.close()
    finally:
        asyncio_log.removeFilter(_not_eof_note)
