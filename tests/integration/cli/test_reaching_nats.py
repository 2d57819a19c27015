"""How the operator commands find NATS and say when they cannot: ``--data-dir`` (a running
``gpushare up``'s ``stack.json``), a TLS certificate that lacks the address used (the
port-forward path), ``--tls-server-name``, ``--connect-timeout``, a refused connection."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme
from nats.js import JetStreamContext

from gpushare.bus.connection import ConnectOptions, connect, open_client
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.streams import ensure_streams
from gpushare.cli import audit, explain, inspect
from gpushare.cli.target import write_stack_file
from gpushare.embedded.nats_server import NatsServer, free_port
from gpushare.embedded.secure_bus import create_streams, write_secure_bus
from tests.integration.cli.running import Ran, web_lifecycle

pytestmark = pytest.mark.integration

SERVER_NAME = "nats.gpushare.svc"
"""The only name the TLS server's certificate holds (an in-cluster service's)."""


@pytest.fixture(autouse=True)
def no_nats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPUSHARE_NATS"):
            monkeypatch.delenv(name)


async def run(
    main: Callable[[list[str]], int], args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[Ran, float]:
    """``main(args)`` as from a shell (no ``--nats`` added), and how long it took."""
    capsys.readouterr()
    started = time.monotonic()
    code = await asyncio.to_thread(main, args)
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err), time.monotonic() - started


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    """nats-server on 127.0.0.1 whose certificate names only :data:`SERVER_NAME`."""
    ca = trustme.CA()
    issued = ca.issue_cert(SERVER_NAME)
    ca_file, pem = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    issued.private_key_and_cert_chain_pem.write_to_path(str(pem))
    config = tmp_path / "nats.conf"
    config.write_text(f'tls {{\n  cert_file: "{pem}"\n  key_file: "{pem}"\n}}\n')
    server = NatsServer(tmp_path / "jetstream", config=config, tls=True).start()
    try:
        yield server, ca_file
    finally:
        server.stop()


async def test_a_certificate_without_the_address_fails_fast_and_a_server_name_connects(
    tls_nats: tuple[NatsServer, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, ca_file = tls_nats
    monkeypatch.setenv("GPUSHARE_NATS_CA", str(ca_file))
    nc = await connect(server.url, "setup", tls_server_name=SERVER_NAME)
    await ensure_streams(nc.jetstream())
    await web_lifecycle(nc.jetstream())
    await nc.close()
    for main in (inspect.main, audit.main, explain.main):
        args = ["default/web"] if main is explain.main else []
        ran, took = await run(main, [*args, "--nats", server.url], capsys)
        assert (ran.code, ran.out) == (1, "")
        assert took < 10
        assert len(ran.err.splitlines()) == 1
        assert f"cannot reach NATS at {server.url}: TLS: the server's certificate" in ran.err
        assert "does not match '127.0.0.1'" in ran.err
        assert "--tls-server-name" in ran.err
        named = [*args, "--nats", server.url, "--tls-server-name", SERVER_NAME]
        ran, _ = await run(main, named, capsys)
        assert (ran.code, ran.err) == (0, "")
        assert "N3" in ran.out


async def test_the_hang_is_gone_for_the_command_as_run_from_a_shell(
    tls_nats: tuple[NatsServer, Path],
) -> None:
    """The reported case: ``gpushare inspect --nats tls://127.0.0.1:PORT`` hung (killed
    after 200 s); an untrusted CA is said as plainly."""
    server, ca_file = tls_nats
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_NATS")}
    for ca, said in ((str(ca_file), "does not match"), ("", "is not trusted")):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gpushare.cli.main", "inspect", "--nats", server.url],
            env={**env, "GPUSHARE_NATS_CA": ca},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.startswith("gpushare inspect: cannot reach NATS at tls://")
        assert said in done.stderr
        assert "Traceback" not in done.stderr


async def test_a_refused_connection_and_a_silent_server_are_said_within_the_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    ran, took = await run(inspect.main, ["--nats", f"nats://127.0.0.1:{port}"], capsys)
    assert ran.code == 1
    assert ran.err == (
        f"gpushare inspect: cannot reach NATS at nats://127.0.0.1:{port}: "
        "connection refused (nothing listens there)\n"
    )
    assert took < 5
    # something that accepts (its backlog does) and never says INFO: the timeout ends it
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent_url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConnectionError, match=r"no answer within 1s \(--connect-timeout\)"):
            await asyncio.wait_for(
                open_client(silent_url, "t", NatsCredentials(), ConnectOptions(1)), timeout=5
            )
    with pytest.raises(SystemExit):
        audit.parse_args(["--connect-timeout", "0"])
    assert "'0' is not a positive number of seconds" in capsys.readouterr().err


async def test_a_data_dir_names_a_running_stack(
    js: JetStreamContext,
    nats_server: NatsServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await web_lifecycle(js)
    data_dir = tmp_path / "stack"
    data_dir.mkdir()
    write_stack_file(data_dir, nats_url=nats_server.url)
    for main, args in ((inspect.main, []), (audit.main, []), (explain.main, ["default/web"])):
        ran, _ = await run(main, [*args, "--data-dir", str(data_dir)], capsys)
        assert (ran.code, ran.err) == (0, "")
        assert "N3" in ran.out


async def test_a_data_dir_where_no_stack_runs_is_said_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    ran, took = await run(inspect.main, ["--data-dir", str(empty)], capsys)
    assert (ran.code, ran.out) == (1, "")
    assert ran.err == (
        f"gpushare inspect: no gpushare stack is running in {empty}: no stack.json there "
        f"(`gpushare up --data-dir {empty}` starts one)\n"
    )
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    write_stack_file(stopped, nats_url=f"nats://127.0.0.1:{free_port()}")
    ran, took = await run(audit.main, ["--data-dir", str(stopped)], capsys)
    assert ran.code == 1
    assert ran.err.startswith(f"gpushare audit: no gpushare stack is running in {stopped}: ")
    assert "connection refused" in ran.err
    assert len(ran.err.splitlines()) == 1
    assert took < 5
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    write_stack_file(stopped, nats_url="nats://127.0.0.1:1", pid=str(gone.pid))
    ran, _ = await run(explain.main, ["web", "--data-dir", str(stopped)], capsys)
    assert ran.code == 1
    assert f"its process {gone.pid} is gone" in ran.err


async def test_a_data_dir_gives_the_secure_stacks_url_ca_and_auditor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``gpushare up`` leaves: TLS with its own CA, and the auditor's env file."""
    data_dir = tmp_path / "up"
    port = free_port()
    url = f"tls://127.0.0.1:{port}"
    bus = write_secure_bus(data_dir / "nats", ["N3"], url)
    server = NatsServer(
        data_dir / "jetstream", port, config=bus.config, tls=True, env=bus.server_env()
    ).start()
    try:
        await asyncio.to_thread(create_streams, url, bus.credentials("admin"))
        nc = await connect(url, "admin", bus.credentials("admin"))
        await web_lifecycle(nc.jetstream())
        await nc.close()
        write_stack_file(
            data_dir,
            nats_url=url,
            nats_ca=str(bus.ca_file),
            auditor_env=str(bus.env_file("auditor")),
        )
        ran, _ = await run(audit.main, ["--data-dir", str(data_dir), "--json"], capsys)
        assert (ran.code, ran.err) == (0, "")
        assert [json.loads(line)["event"]["pod"]["name"] for line in ran.lines] == ["web"] * 3
    finally:
        server.stop()
