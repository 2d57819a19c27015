"""``gpushare up`` secures NATS as ``deploy/`` does: TLS, a user per service and node, each
service process with its own; nothing without credentials or without TLS gets in; an
operator reads the log with the auditor's env file; ``--insecure`` runs plain NATS."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout

from gpushare.bus.connection import connect
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.subjects import INVENTORY_STREAM, allocation_subject, inventory_subject
from gpushare.cli import audit
from gpushare.cli.stack import Stack, StackConfig, parse_node
from tests.integration.cli.running import run_main

pytestmark = pytest.mark.e2e

REFUSAL_WAIT_S = 1.0
"""How long a refused publish waits for the acknowledgement the server never sends."""
LEAKED = "from-the-shell-that-started-it"


@pytest.fixture(scope="module")
def secure_stack() -> Iterator[Stack]:
    """Two nodes on the API stand-in, NATS secured (the default); the starting shell has
    credentials of its own, which no service may inherit."""
    with (
        tempfile.TemporaryDirectory(prefix="gs-", dir="/tmp") as directory,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setenv("GPUSHARE_NATS_PASSWORD", LEAKED)
        patch.setenv("GPUSHARE_NATS_USER", "admin")
        config = StackConfig(
            data_dir=Path(directory),
            nodes=[parse_node("node-a=1000"), parse_node("node-b=2000")],
            extender_port=0,
            die_with_parent=True,
        )
        stack = Stack(config).start(timeout=90)
        patch.undo()
        with stack:
            yield stack


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~107 bytes."""
    with tempfile.TemporaryDirectory(prefix="gs-", dir="/tmp") as path:
        yield Path(path)


def environ_of(stack: Stack, name: str) -> dict[str, str]:
    """The environment process ``name`` was started with."""
    raw = Path(f"/proc/{stack.processes[name].pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def credentials_of(stack: Stack, name: str) -> NatsCredentials:
    """What process ``name`` connects with (it reads them from its environment)."""
    return NatsCredentials.from_env(environ_of(stack, name))


async def refused(client: Client, subject: str) -> None:
    """A publish to ``subject`` gets no acknowledgement: a permissions violation."""
    with pytest.raises(NatsTimeout):
        await client.jetstream().publish(subject, b"{}", timeout=REFUSAL_WAIT_S)
    assert "permissions violation" in str(client.last_error).lower()


async def try_connect(url: str, **options: Any) -> Exception | None:
    """The error of one connection attempt (no retries), or None if it got in."""

    async def quiet(_error: Exception) -> None:
        """The error is raised (and asserted) instead."""

    try:
        client = await nats.connect(
            url, allow_reconnect=False, connect_timeout=5, error_cb=quiet, **options
        )
    except Exception as error:
        return error
    await client.close()
    return None


def test_every_service_process_runs_as_its_own_user(secure_stack: Stack) -> None:
    expected = {
        "allocator": "allocator",
        "binder": "binder",
        "reporter-node-a": "node-node-a",
        "reporter-node-b": "node-node-b",
        "node-agent-node-a": "node-node-a",
        "node-agent-node-b": "node-node-b",
    }
    for name, user in expected.items():
        env = environ_of(secure_stack, name)
        assert env["GPUSHARE_NATS_USER"] == user, name
        assert "GPUSHARE_NATS_PASSWORD" not in env, name  # the shell's is not inherited
        assert Path(env["GPUSHARE_NATS_CA"]) == secure_stack.nats_dir / "ca.pem"
        password_file = Path(env["GPUSHARE_NATS_PASSWORD_FILE"])
        assert password_file.stat().st_mode & 0o077 == 0, name
        assert credentials_of(secure_stack, name) == secure_stack.credentials(user)
    assert secure_stack.nats_url.startswith("tls://")
    assert "GPUSHARE_NATS_USER" not in environ_of(secure_stack, "kubelet")


async def test_the_binder_cannot_append_as_a_node_agent_nor_a_node_as_another(
    secure_stack: Stack,
) -> None:
    url = secure_stack.nats_url
    binder = await connect(url, "test-binder", credentials_of(secure_stack, "binder"))
    node_a = await connect(url, "test-node-a", credentials_of(secure_stack, "node-agent-node-a"))
    try:
        await refused(binder, allocation_subject("node-a", "agent"))
        await refused(node_a, allocation_subject("node-b", "agent"))
        await refused(node_a, inventory_subject("node-b"))
        await refused(node_a, allocation_subject("node-a", "allocator"))
    finally:
        await binder.close()
        await node_a.close()


async def test_nobody_gets_in_without_credentials_or_with_a_wrong_password(
    secure_stack: Stack,
) -> None:
    url = secure_stack.nats_url
    trusting = ssl.create_default_context(cafile=str(secure_stack.nats_dir / "ca.pem"))

    anonymous = await try_connect(url, tls=trusting)
    wrong = await try_connect(url, tls=trusting, user="auditor", password="g0123456789abcdef")
    untrusted = await try_connect(url, **NatsCredentials(user="auditor").connect_options(url))

    assert "authorization violation" in str(anonymous).lower()
    assert "authorization violation" in str(wrong).lower()
    assert isinstance(untrusted, ssl.SSLCertVerificationError | OSError)
    auditor = await connect(url, "test-auditor", secure_stack.credentials("auditor"))
    await auditor.close()


def test_a_client_without_tls_is_refused(secure_stack: Stack) -> None:
    """The right user and password in plain text: the server wants a TLS handshake, and
    hangs up (no PONG)."""
    assert secure_stack.nats is not None
    address = ("127.0.0.1", secure_stack.nats.port)
    with socket.create_connection(address, timeout=5) as sock, sock.makefile("rb") as reader:
        info = json.loads(reader.readline().removeprefix(b"INFO "))
        assert info["tls_required"] is True
        password = secure_stack.credentials("auditor").password
        connect_ = json.dumps({"user": "auditor", "pass": password, "verbose": False})
        sock.sendall(f"CONNECT {connect_}\r\nPING\r\n".encode())
        answer = reader.readline()
    assert answer == b"" or answer.startswith(b"-ERR"), answer


async def test_the_auditor_reads_the_log_with_gpushare_audit(
    secure_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in secure_stack.client_env("auditor").items():
        monkeypatch.setenv(name, value)

    ran = await run_main(audit.main, ["--json"], secure_stack.nats_url, capsys)

    assert ran.code == 0, ran.err


# -- gpushare up as an operator runs it -----------------------------------------------------


def up(directory: Path, *flags: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``gpushare up`` on the stand-in with one node, its output going to a file."""
    out = directory / "up.out"
    args = ["--data-dir", str(directory / "up"), "--nats-port", "0", "--port", "0"]
    args += ["--stand-in", "--node", "up-a=1000", *flags]
    with out.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpushare.cli.main", "up", *args],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    return process, out


def wait_up(process: subprocess.Popen[bytes], out: Path, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while "gpushare is up." not in (text := out.read_text()):
        assert process.poll() is None, f"gpushare up exited with {process.returncode}:\n{text}"
        assert time.monotonic() < deadline, f"gpushare up not up after {timeout}s:\n{text}"
        time.sleep(0.2)
    return text


def stop(process: subprocess.Popen[bytes], out: Path) -> None:
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 0, out.read_text()
    assert "gpushare stopped." in out.read_text()


def field(text: str, name: str) -> str:
    match = re.search(rf"^  {name}:\s+(\S+)", text, re.MULTILINE)
    assert match, text
    return match[1]


def test_up_says_how_an_operator_reads_the_log_and_gpushare_audit_does(
    short_tmp: Path,
) -> None:
    process, out = up(short_tmp)
    try:
        text = wait_up(process, out)
        assert field(text, re.escape("NATS (JetStream)")).startswith("tls://")
        env_file = Path(field(text, "auditor"))
        lines = env_file.read_text().splitlines()
        variables = dict(shlex.split(line)[0].split("=", 1) for line in lines)
        assert variables["GPUSHARE_NATS_USER"] == "auditor"
        assert variables["GPUSHARE_NATS_CA"] == field(text, "NATS CA")
        stack_facts = json.loads((short_tmp / "up" / "stack.json").read_text())
        assert stack_facts["auditor_env"] == str(env_file)
        shell_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_NATS")}

        audited = subprocess.run(
            [sys.executable, "-m", "gpushare.cli.main", "audit", "--json"],
            env={**shell_env, **variables},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        no_user = {key: variables[key] for key in ("GPUSHARE_NATS_URL", "GPUSHARE_NATS_CA")}
        anonymous = subprocess.run(
            [sys.executable, "-m", "gpushare.cli.main", "audit", "--json"],
            env={**shell_env, **no_user},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        stop(process, out)
    assert audited.returncode == 0, audited.stderr
    assert anonymous.returncode == 1
    assert "cannot reach NATS" in anonymous.stderr


def test_up_insecure_runs_plain_nats_that_anyone_may_use(short_tmp: Path) -> None:
    process, out = up(short_tmp, "--insecure")
    try:
        text = wait_up(process, out)
        url = field(text, re.escape("NATS (JetStream)"))
        assert url.startswith("nats://")
        assert "--insecure: no TLS, no users" in text
        assert not (short_tmp / "up" / "nats").exists()

        async def look() -> int:
            client = await connect(url, "test-anyone", NatsCredentials())
            try:
                return (await client.jetstream().stream_info(INVENTORY_STREAM)).state.messages
            finally:
                await client.close()

        assert asyncio.run(look()) == 1  # up-a's inventory
    finally:
        stop(process, out)
