"""``gpushare up`` as an operator runs it (issue 14): the cluster's choices reach the
services, each service its own metrics port, a killed service is restarted and ``gpushare
status`` says so, a crash loop stops the stack with the reason, start-up failures are said
at once, a long data directory works, and Ctrl-C stops everything cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.embedded.k8s_ports import port_free

pytestmark = pytest.mark.e2e

START_S = 90
"""How long a stack may take to come up on a busy machine."""
FAIL_FAST_S = 20
"""A start-up failure is said within this, not after a readiness timeout (60 s)."""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-", dir="/tmp") as path:
        yield Path(path)


def gpushare(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


class Up:
    """One ``gpushare up`` on the API stand-in, its output going to a file."""

    def __init__(self, data_dir: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.out = data_dir.parent / f"{data_dir.name}.out"
        self.out.parent.mkdir(parents=True, exist_ok=True)
        args = ["--data-dir", str(data_dir), "--nats-port", "0", "--port", "0", "--stand-in"]
        with self.out.open("wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpushare.cli.main", "up", *args, *flags],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, as in a terminal
            )

    @property
    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_up(self) -> str:
        self.wait_for(lambda: "gpushare is up." in self.text, START_S, "up")
        return self.text

    def wait_for(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            code = self.process.poll()
            assert code is None, f"gpushare up exited with {code} before {what}:\n{self.text}"
            assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{self.text}"
            time.sleep(0.1)

    def status(self) -> dict[str, Any]:
        ran = gpushare("status", "--data-dir", str(self.data_dir), "--json")
        assert ran.returncode in (0, 1), ran.stderr
        facts: dict[str, Any] = json.loads(ran.stdout)
        return facts

    def service(self, name: str) -> dict[str, Any]:
        state: dict[str, Any] = self.status()["services"][name]
        return state

    def interrupt(self) -> int:
        """Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(60)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            first = int(sock.getsockname()[1])
        if first + count < 65535 and all(port_free(first + i) for i in range(count)):
            return first
    raise AssertionError("no free consecutive ports")


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def tracebacks(logs: Path) -> dict[str, str]:
    return {
        path.name: path.read_text(errors="replace")
        for path in logs.glob("*.log")
        if "Traceback" in path.read_text(errors="replace")
    }


def test_the_choices_reach_the_services_a_killed_binder_is_restarted_and_ctrl_c_is_clean(
    short_tmp: Path,
) -> None:
    """One stack, several behaviours (each stack costs a start): flags, distinct metrics
    ports (an inherited GPUSHARE_METRICS_PORT is the base, never handed on), SIGKILL of the
    binder (restarted; status shows it), then SIGINT (exit 0, no traceback in any log)."""
    base = free_ports(4)
    env = {**os.environ, "GPUSHARE_METRICS_PORT": str(base)}
    flags = ["--node", "op-a=1000,1000", "--policy", "spread", "--topology", "nvlink-pairs"]
    flags += ["--mps", "--dialect", "aliyun", "--dialect", "nvidia", "--restart-backoff", "0.2"]
    up = Up(short_tmp / "up", *flags, env=env)
    try:
        up.wait_up()
        services = up.status()["services"]
        assert {s["state"] for s in services.values()} == {"running"}, services

        allocator = cmdline(services["allocator"]["pid"])
        reporter = cmdline(services["reporter"]["pid"])
        agent = cmdline(services["node-agent"]["pid"])
        assert flag_values(allocator, "--policy") == ["spread"]
        assert flag_values(reporter, "--topology") == ["nvlink-pairs"]
        assert flag_values(reporter, "--mps") == ["on"]
        assert flag_values(agent, "--dialect") == ["aliyun", "nvidia"]

        ports = {name: services[name]["metrics_port"] for name in ("reporter", "binder")}
        ports["node-agent"] = services["node-agent"]["metrics_port"]
        assert sorted(ports.values()) == [base, base + 1, base + 2], ports
        for name, port in ports.items():
            environ = Path(f"/proc/{services[name]['pid']}/environ").read_bytes()
            assert b"GPUSHARE_METRICS_PORT=" not in environ, name
            assert flag_values(cmdline(services[name]["pid"]), "--metrics-port") == [str(port)]
            assert "# TYPE" in metrics(port), name

        old = services["binder"]["pid"]
        os.kill(old, signal.SIGKILL)
        up.wait_for(
            lambda: (
                up.service("binder")["restarts"] == 1 and up.service("binder")["state"] == "running"
            ),
            30,
            "binder restart",
        )
        binder = up.service("binder")
        assert binder["pid"] != old
        assert binder["last_exit"] == "killed by SIGKILL"
        assert "binder killed by SIGKILL; restarting it in" in up.text
        shown = gpushare("status", "--data-dir", str(up.data_dir))
        line = next(row for row in shown.stdout.splitlines() if row.startswith("binder "))
        assert "running" in line
        assert "killed by SIGKILL" in line

        assert up.interrupt() == 0, up.text
    finally:
        up.close()
    assert "gpushare stopped." in up.text
    assert "Traceback" not in up.text
    assert tracebacks(up.data_dir / "logs") == {}
    assert gpushare("status", "--data-dir", str(up.data_dir)).returncode == 3


def test_a_crash_loop_stops_the_stack_with_the_reason_and_a_long_data_dir_works(
    short_tmp: Path,
) -> None:
    """A data directory whose sockets would pass 107 bytes: they go to a short directory
    of their own (stack.json says where), removed at the end."""
    long_dir = short_tmp / ("d" * 40) / ("e" * 20)
    assert len(str(long_dir / "kubelet/op-b/device-plugins/gpushare-memory-ratio.sock")) > 107
    flags = ["--node", "op-b=1000", "--restart-backoff", "0.1", "--crash-limit", "3"]
    up = Up(long_dir, *flags)
    try:
        up.wait_up()
        stack = json.loads((long_dir / "stack.json").read_text())
        sockets = Path(stack["socket_dir"])
        assert len(str(sockets)) < 40
        assert (sockets / "op-b" / "device-plugins" / "gpushare-gpu-mem.sock").is_socket()
        agent_log = (long_dir / "logs" / "node-agent.log").read_text()
        assert "Failed to add" not in agent_log

        for crash in range(3):
            pid = up.service("binder")["pid"]
            os.kill(pid, signal.SIGKILL)
            if crash < 2:
                up.wait_for(
                    lambda pid=pid: up.service("binder")["pid"] not in (None, pid),
                    30,
                    f"restart {crash + 1}",
                )
        assert up.process.wait(30) == 1, up.text
    finally:
        up.close()
    assert "binder is crash-looping: 3 crashes within 60s (last: killed by SIGKILL)" in up.text
    assert not sockets.exists()


def test_a_taken_nats_port_is_said_at_once(short_tmp: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        up = Up(short_tmp / "up", "--nats-port", str(port), "--node", "op-c=1000")
        try:
            code = up.process.wait(FAIL_FAST_S)
        finally:
            up.close()
    assert code == 1, up.text
    assert time.monotonic() - started < FAIL_FAST_S
    expected = f"nats-server could not listen on 127.0.0.1:{port}: address already in use"
    assert expected in up.text
    assert "allocator" not in up.text


def test_a_service_that_exits_while_the_stack_starts_is_said_at_once(short_tmp: Path) -> None:
    """The reporter refuses ``GPUSHARE_MPS=bogus``: up says so, with its log, not after
    waiting for readiness."""
    env = {**os.environ, "GPUSHARE_MPS": "bogus"}
    started = time.monotonic()
    up = Up(short_tmp / "up", "--node", "op-d=1000", "--insecure", env=env)
    try:
        code = up.process.wait(START_S)
    finally:
        up.close()
    assert code == 1, up.text
    assert time.monotonic() - started < START_S - 30
    assert "reporter exited with 2; its log ends:" in up.text
    assert "bogus" in up.text
    assert "not ready after" not in up.text


def test_the_node_agent_refuses_a_socket_path_over_the_limit(short_tmp: Path) -> None:
    plugin_dir = short_tmp / ("p" * 90) / "device-plugins"
    ran = gpushare("node-agent", "--nats", "nats://127.0.0.1:1", "--node", f"n={plugin_dir}")
    assert ran.returncode == 2, ran.stderr
    assert "over the 107-byte limit of unix sockets" in ran.stderr
    assert str(plugin_dir / "gpushare-gpu-mem.sock") in ran.stderr
