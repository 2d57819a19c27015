"""``gpushare up``'s secure NATS: certificates, a password per user, the server's config,
and which user each service process gets."""

from __future__ import annotations

import ipaddress
import os
import shlex
import stat
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.permissions import users
from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.embedded.nats_server import NatsServer, nats_server_binary
from gpushare.embedded.secure_bus import (
    SecureBus,
    issue_certificates,
    new_password,
    service_user,
    write_secure_bus,
)

NOW = datetime(2026, 3, 1, tzinfo=UTC)
NODES = ("gpu-a", "gpu.b")


@pytest.fixture
def bus(tmp_path: Path) -> SecureBus:
    return write_secure_bus(tmp_path / "nats", NODES, url="tls://127.0.0.1:4222", now=NOW)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_user_gets_its_own_random_password_in_a_file_only_it_may_read(
    bus: SecureBus,
) -> None:
    names = [user.name for user in users(NODES)]
    assert list(bus.passwords) == names
    assert "node-gpu.b" in names
    assert len(set(bus.passwords.values())) == len(names)
    for name in names:
        assert bus.password_file(name).read_text().strip() == bus.passwords[name]
        assert mode(bus.password_file(name)) == 0o600
    assert mode(bus.directory) == 0o700
    assert mode(bus.directory / "passwords") == 0o700
    assert mode(bus.server_key) == 0o600


def test_a_password_is_hex_behind_a_letter_so_nats_server_never_reads_a_number() -> None:
    password = new_password()
    assert password[0].isalpha()
    int(password[1:], 16)
    assert len(password) > 40


def test_passwords_stay_out_of_the_repr_and_the_config(bus: SecureBus) -> None:
    config = bus.config.read_text()
    for password in bus.passwords.values():
        assert password not in repr(bus)
        assert password not in config
    assert "password: $GPUSHARE_NATS_PASSWORD_NODE_GPU_B" in config
    assert set(bus.server_env()) == {user.password_env for user in users(NODES)}


def test_the_server_certificate_is_the_cas_for_127_0_0_1_and_localhost(bus: SecureBus) -> None:
    ca = x509.load_pem_x509_certificate(bus.ca_file.read_bytes())
    server = x509.load_pem_x509_certificate(bus.server_cert.read_bytes())
    store = Store([ca])
    for name in (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")):
        verifier = PolicyBuilder().store(store).time(NOW).build_server_verifier(name)
        verifier.verify(server, [])
    assert server.not_valid_before_utc == NOW - timedelta(hours=1)


def test_certificates_are_new_each_time() -> None:
    first, second = issue_certificates(NOW), issue_certificates(NOW)
    assert first.ca_cert != second.ca_cert
    assert first.server_key not in repr(first).encode()


def test_nats_server_accepts_the_config_with_the_passwords_in_its_environment(
    bus: SecureBus,
) -> None:
    checked = subprocess.run(
        [nats_server_binary(), "--config", str(bus.config), "-t"],
        env={**os.environ, **bus.server_env()},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "tls {" in bus.config.read_text()


@pytest.mark.parametrize(
    ("command", "node", "user"),
    [
        ("allocator", "", "allocator"),
        ("binder", "", "binder"),
        ("reporter", "gpu-a", "node-gpu-a"),
        ("node-agent", "gpu.b", "node-gpu.b"),
    ],
)
def test_each_service_runs_as_its_roles_user(command: str, node: str, user: str) -> None:
    assert service_user(command, node) == user


@pytest.mark.parametrize(("command", "node"), [("reporter", ""), ("kubelet", ""), ("audit", "")])
def test_no_user_for_a_node_service_without_its_node_or_a_non_service(
    command: str, node: str
) -> None:
    with pytest.raises(ValueError, match="no NATS user"):
        service_user(command, node)


def test_a_clients_environment_names_its_user_password_file_and_ca(bus: SecureBus) -> None:
    env = bus.client_env("node-gpu-a")
    credentials = NatsCredentials.from_env(env)
    assert credentials == bus.credentials("node-gpu-a")
    assert credentials.password == bus.passwords["node-gpu-a"]
    assert "GPUSHARE_NATS_PASSWORD" not in env
    with pytest.raises(KeyError, match="node-gpu-c"):
        bus.client_env("node-gpu-c")


def test_operators_env_files_set_the_url_and_the_auditors_credentials(bus: SecureBus) -> None:
    text = bus.env_file("auditor").read_text()
    env = dict(line.split("=", 1) for line in text.splitlines())
    assert env.pop("GPUSHARE_NATS_URL") == "tls://127.0.0.1:4222"
    assert {key: shlex.split(value)[0] for key, value in env.items()} == bus.client_env("auditor")
    assert mode(bus.env_file("admin")) == 0o600


def test_writing_again_replaces_every_secret(bus: SecureBus) -> None:
    again = write_secure_bus(bus.directory, NODES, now=NOW)
    assert set(again.passwords.values()).isdisjoint(bus.passwords.values())
    assert bus.password_file("admin").read_text().strip() == again.passwords["admin"]


def started_with(tmp_path: Path, nodes: list[str]) -> Stack:
    """A secure stack's processes as they would be started (nothing is)."""
    config = StackConfig(
        data_dir=tmp_path, nodes=[parse_node(node) for node in nodes], extender_port=0, binders=2
    )
    stack = Stack(
        config, nats=NatsServer(tmp_path / "js", port=4222, tls=True), kubeconfig=tmp_path / "kc"
    )
    stack.secure_bus = write_secure_bus(stack.nats_dir, [node.name for node in config.nodes])

    def spawn(name: str, args: list[str]) -> None:
        stack.argv[name] = args

    stack.spawn = spawn  # type: ignore[method-assign,assignment]
    stack._choose_allocator_ports()
    stack._start_services()
    return stack


def user_of(stack: Stack, name: str) -> str | None:
    return stack.process_env.get(name, {}).get("GPUSHARE_NATS_USER")


def test_each_node_has_its_own_reporter_and_node_agent_with_the_nodes_user(
    tmp_path: Path,
) -> None:
    stack = started_with(tmp_path, ["gpu-a=1000", "gpu-b=2000,2000"])

    assert stack.names("reporter") == ["reporter-gpu-a", "reporter-gpu-b"]
    assert stack.names("node-agent") == ["node-agent-gpu-a", "node-agent-gpu-b"]
    assert user_of(stack, "reporter-gpu-b") == "node-gpu-b"
    assert user_of(stack, "node-agent-gpu-a") == "node-gpu-a"
    assert stack.argv["reporter-gpu-b"][3:5] == ["--node", "gpu-b=2000,2000"]
    assert stack.argv["node-agent-gpu-a"].count("--node") == 1
    assert user_of(stack, "binder") == user_of(stack, "binder-1") == "binder"
    assert user_of(stack, "allocator") == "allocator"
    assert user_of(stack, "kubelet") is None  # Kubernetes' part: no NATS
    assert "--nats" in stack.argv["allocator"]
    ca = stack.process_env["allocator"]["GPUSHARE_NATS_CA"]
    assert ca == str(tmp_path / "nats" / "ca.pem")


def test_a_one_node_stack_keeps_the_plain_process_names(tmp_path: Path) -> None:
    stack = started_with(tmp_path, ["gpu-a=1000"])
    assert stack.names("reporter") == ["reporter"]
    assert stack.names("node-agent") == ["node-agent"]
    assert stack.node_process("node-agent", "gpu-a") == "node-agent"
    assert user_of(stack, "node-agent") == "node-gpu-a"


def test_a_stack_hands_out_credentials_only_once_started_and_none_when_insecure(
    tmp_path: Path,
) -> None:
    secure = Stack(StackConfig(data_dir=tmp_path, nodes=[parse_node("a=1000")]))
    with pytest.raises(RuntimeError, match="when it starts"):
        secure.credentials("auditor")
    plain = Stack(StackConfig(data_dir=tmp_path, nodes=[parse_node("a=1000")], secure=False))
    assert plain.credentials("auditor") == NatsCredentials()
    assert plain.client_env("auditor") == {}
