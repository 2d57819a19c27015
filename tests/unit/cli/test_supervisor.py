"""``gpushare up``'s supervision, flags and start-up checks, without starting a stack: a
dead process is restarted after a doubling backoff and recorded for ``gpushare status``;
a crash loop stops; the cluster's choices become the services' flags; each service its
own metrics port; a taken NATS port and long socket paths are said at once."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.cli import status
from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.cli.supervisor import CrashLoop, Supervisor, services_file
from gpushare.cli.up import UsageError, config_from, parser
from gpushare.embedded.nats_server import NatsServer, NatsServerError, exit_reason
from gpushare.node_agent.settings import NodeTarget
from gpushare.node_agent.sockets import socket_problems


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack whose one "binder" is a ``sleep`` and whose spawn starts another."""
    config = StackConfig(data_dir=tmp_path, nodes=[parse_node("a=1000")])
    stack = Stack(config)

    def spawn(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(["sleep", "60"])
        stack.processes[name] = process
        stack.argv[name] = list(args)
        stack.down.discard(name)
        return process

    stack.spawn = spawn  # type: ignore[method-assign]
    stack.logs_dir.mkdir()
    (stack.logs_dir / "binder.log").write_text("binding\nthe last line\n")
    stack.spawn("binder", ["binder", "--nats", "x"])
    yield stack
    for process in stack.processes.values():
        process.kill()
        process.wait()


def kill(stack: Stack, name: str) -> int:
    process = stack.processes[name]
    process.kill()
    process.wait()
    return process.pid


def test_a_killed_service_is_restarted_after_a_doubling_backoff(stack: Stack) -> None:
    clock, out = Clock(), io.StringIO()
    supervisor = Supervisor(stack, backoff=1.0, limit=5, window=60, out=out, clock=clock)
    old = kill(stack, "binder")

    supervisor.poll()
    assert "binder killed by SIGKILL; restarting it in 1.0s (restart 1)" in out.getvalue()
    assert "the last line" in out.getvalue()
    assert supervisor.services["binder"].state == "restarting"
    clock.now += 1.0
    supervisor.poll()

    state = supervisor.services["binder"]
    assert (state.state, state.restarts, state.last_exit) == ("running", 1, "killed by SIGKILL")
    assert state.pid == stack.processes["binder"].pid != old
    assert stack.argv["binder"] == ["binder", "--nats", "x"]
    kill(stack, "binder")
    supervisor.poll()
    assert "restarting it in 2.0s (restart 2)" in out.getvalue()
    clock.now += 1.0
    supervisor.poll()
    assert supervisor.services["binder"].state == "restarting"  # not yet
    recorded = json.loads(services_file(stack.config.data_dir).read_text())
    assert recorded["services"]["binder"]["restarts"] == 1
    assert recorded["services"]["binder"]["state"] == "restarting"


def test_a_crash_loop_stops_with_the_reason_but_old_crashes_do_not_count(stack: Stack) -> None:
    clock = Clock()
    supervisor = Supervisor(stack, backoff=0.1, limit=3, window=60, out=io.StringIO(), clock=clock)
    for _ in range(2):
        kill(stack, "binder")
        supervisor.poll()
        clock.now += 61  # outside the window
        supervisor.poll()
    for _ in range(2):
        kill(stack, "binder")
        supervisor.poll()
        clock.now += 1
        supervisor.poll()
    kill(stack, "binder")
    with pytest.raises(CrashLoop, match=r"binder is crash-looping: 3 crashes within 60s"):
        supervisor.poll()
    assert supervisor.services["binder"].restarts == 4


def test_status_shows_each_process_and_says_when_up_is_gone(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    supervisor = Supervisor(stack, backoff=0.1, out=io.StringIO(), clock=Clock())
    kill(stack, "binder")
    supervisor.poll()
    data_dir = ["--data-dir", str(stack.config.data_dir)]

    assert status.main(data_dir) == 1  # binder is restarting
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["NAME", "STATE", "PID", "RESTARTS", "LAST", "EXIT", "METRICS"]
    binder = next(line for line in lines if line.startswith("binder "))
    assert binder.split()[:5] == ["binder", "restarting", "-", "0", "killed"]

    supervisor.stopped()
    assert status.main(data_dir) == status.NOT_UP
    assert "gpushare up is not running" in capsys.readouterr().err


def configure(argv: list[str], env: dict[str, str] | None = None) -> StackConfig:
    args = parser().parse_args(["--data-dir", "/tmp/x", "--stand-in", *argv])
    return config_from(args, env or {})[0]


def test_the_cluster_choices_become_the_services_flags() -> None:
    dialects = ["--dialect", "nvidia", "--dialect", "aliyun", "--dialect", "nvidia"]
    sharing = ["--topology", "pcie", "--mps", "--metrics-port", "9400"]
    config = configure(["--policy", "spread", *dialects, *sharing])
    assert config.policy == "spread"
    assert config.dialects == ("nvidia", "aliyun")
    assert (config.topology, config.mps, config.metrics_port) == ("pcie", "on", 9400)
    assert configure(["--mps", "off"]).mps == "off"
    assert configure([]).metrics_port == 0
    with pytest.raises(SystemExit):
        configure(["--policy", "nonsense"])


def test_an_inherited_metrics_port_is_the_base_and_each_service_gets_its_own(
    tmp_path: Path,
) -> None:
    assert configure([], {"GPUSHARE_METRICS_PORT": "9500"}).metrics_port == 9500
    assert (
        configure(["--metrics-port", "9600"], {"GPUSHARE_METRICS_PORT": "9500"}).metrics_port
        == 9600
    )
    with pytest.raises(UsageError, match="GPUSHARE_METRICS_PORT"):
        configure([], {"GPUSHARE_METRICS_PORT": "many"})

    config = StackConfig(data_dir=tmp_path, nodes=[parse_node("a=1")], metrics_port=9500)
    stack = Stack(config)
    flags = [stack._metrics_flags(name) for name in ("reporter", "binder", "node-agent")]
    assert flags == [["--metrics-port", str(9500 + i)] for i in range(3)]
    assert stack._metrics_flags("binder") == ["--metrics-port", "9501"]  # a restart: the same
    assert Stack(StackConfig(data_dir=tmp_path, nodes=[]))._metrics_flags("binder") == []


def test_a_taken_nats_port_fails_at_once_saying_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = NatsServer(tmp_path, port=port, log_file=tmp_path / "nats.log")
        with pytest.raises(NatsServerError) as error:
            server.start(timeout=1)
    assert str(error.value) == (
        f"nats-server could not listen on 127.0.0.1:{port}: address already in use"
    )
    assert server.process is None


def test_nats_servers_own_bind_failure_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "nats.log"
    log.write_text(
        "[1] [INF] Starting nats-server\n[1] [FTL] Error listening on port: 127.0.0.1:4222, "
        '"listen tcp 127.0.0.1:4222: bind: address already in use"\n'
    )
    server = NatsServer(tmp_path, port=4222, log_file=log)
    assert server._failure(1) == (
        "nats-server could not listen on 127.0.0.1:4222: address already in use"
    )
    log.write_text("something else\n")
    assert server._failure(-9) == "nats-server killed by SIGKILL; its log ends:\nsomething else"
    assert exit_reason(2) == "exited with 2"


def test_long_socket_paths_are_refused_and_the_stack_moves_its_sockets() -> None:
    long = Path("/tmp") / ("x" * 80)
    problems = socket_problems([NodeTarget("n", long / "device-plugins")], ["aliyun.com/gpu-mem"])
    assert problems
    assert all("over the 107-byte limit" in problem for problem in problems)
    assert socket_problems([NodeTarget("n", Path("/tmp/dp"))], ["aliyun.com/gpu-mem"]) == []

    stack = Stack(StackConfig(data_dir=long / ("y" * 30), nodes=[parse_node("node-1=1")]))
    stack._choose_socket_dir()
    try:
        assert stack.socket_dir is not None
        assert str(stack.socket_dir).startswith("/tmp/gs-")
        assert stack.plugin_dir("node-1") == stack.socket_dir / "node-1" / "device-plugins"
    finally:
        stack.stop()
    assert not stack.socket_dir.exists()

    with tempfile.TemporaryDirectory(prefix="gs-", dir="/tmp") as directory:
        data_dir = Path(directory)
        short = Stack(StackConfig(data_dir=data_dir, nodes=[parse_node("node-1=1")]))
        short._choose_socket_dir()
        assert short.socket_dir == data_dir / "kubelet"
        huge = Stack(StackConfig(data_dir=data_dir, nodes=[parse_node(f"{'n' * 100}=1")]))
        with pytest.raises(ValueError, match="107-byte limit"):
            huge._choose_socket_dir()
        huge.stop()
