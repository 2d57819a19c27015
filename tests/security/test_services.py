"""The services' own bus code works with their credentials over TLS, and says no secret."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.aio.client import Client

from gpushare.bus.connection import connect
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.permissions import BINDER_CONSUMER, users
from gpushare.bus.streams import ensure_streams
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    BINDER_QUEUE_STREAM,
    allocation_subject,
)
from gpushare.cli import audit
from gpushare.cli.rendering import open_bus
from gpushare.core.events import ContainerAssigned, InventoryReported, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.embedded.nats_server import NatsServer
from tests.integration.cli.running import run_main
from tests.integration.kube.waiting import eventually
from tests.security.conftest import NODE_A, SecureNats, write_tls
from tools.generate_nats_auth import AUTH_CONF, NODES, read_nodes

AT = datetime(2026, 1, 1, tzinfo=UTC)
POD = PodRef(namespace="ns", name="web", uid="uid-web")
CARD = Card(index=0, uuid="GPU-0", model="T4", memory_mib=16000)


async def test_one_allocation_through_authenticated_services(
    secure_nats: SecureNats, admin: Client
) -> None:
    allocator = await secure_nats.connect("allocator")
    binder = await secure_nats.connect("binder")
    node = await secure_nats.connect(f"node-{NODE_A}")
    for client in (allocator, binder, node):
        await ensure_streams(client.jetstream())  # they exist: nobody needs to update them
    inventory = InventoryReported(
        id="inv-1", at=AT, node=NODE_A, cards=(CARD,), source="fixture", heartbeat_seconds=5
    )
    await publish_inventory(node.jetstream(), inventory)
    folding = LogFollower(allocator.jetstream(), snapshot_min_events=1, snapshot_interval_s=0.05)
    on_node = LogFollower(node.jetstream(), node=NODE_A)
    try:
        await folding.start()
        await on_node.start()
        share = ContainerShare(container="c", card_index=0, card_uuid="GPU-0", memory_mib=3000)
        reserved = PodReserved(id="reserve-web", at=AT, node=NODE_A, pod=POD, shares=(share,))
        seq = await folding.log.append(reserved, folding.state.node(NODE_A).last_seq)
        assigned = ContainerAssigned(
            id="assigned-web", at=AT, node=NODE_A, pod=POD, reservation_id="reserve-web",
            container="c", card_uuids=("GPU-0",),
        )  # fmt: skip
        await on_node.log.append(assigned)
        pulled = await binder.jetstream().pull_subscribe(
            ALL_ALLOCATIONS, durable=BINDER_CONSUMER, stream=BINDER_QUEUE_STREAM
        )
        (first,) = await pulled.fetch(1)
        await first.ack_sync()
        assert first.subject == allocation_subject(NODE_A, "allocator")
        await eventually(lambda: folding.applied_seq == seq + 1)
        await eventually(lambda: on_node.state.node(NODE_A).last_seq == seq + 1)
        assert folding.state.node(NODE_A).used_mib == {"GPU-0": 3000}
        assert on_node.state.node(NODE_A).max_free_mib == 13000
        assert folding.keeper is not None
        await eventually(lambda: folding.keeper is not None and folding.keeper.written_seq > 0)
    finally:
        await folding.stop()
        await on_node.stop()
        for client in (allocator, binder, node):
            await client.close()


async def test_a_password_never_reaches_the_logs(
    secure_nats: SecureNats, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = secure_nats.passwords["auditor"]
    credentials = secure_nats.credentials("auditor")
    assert secret not in repr(credentials)
    client = await connect(secure_nats.url, name="auditor", credentials=credentials)
    await client.close()
    wrong = "wrong-" + secret
    monkeypatch.setenv("GPUSHARE_NATS_USER", "auditor")
    monkeypatch.setenv("GPUSHARE_NATS_PASSWORD", wrong)
    monkeypatch.setenv("GPUSHARE_NATS_CA", str(secure_nats.ca_file))
    url_with_secret = secure_nats.url.replace("//", f"//auditor:{wrong}@")
    with pytest.raises(ConnectionError) as refused:
        async with open_bus(url_with_secret, "audit"):
            pass
    assert wrong not in str(refused.value)
    assert secret not in caplog.text
    assert wrong not in caplog.text
    assert repr(NatsCredentials.from_env()).count(wrong) == 0


async def test_the_committed_auth_conf_is_what_nats_server_runs(tmp_path: Path) -> None:
    ca, cert, key = write_tls(tmp_path)
    config = tmp_path / "nats.conf"
    tls = f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n}}\n'
    config.write_text(tls + AUTH_CONF.read_text())
    node = read_nodes(NODES)[0]
    env = {user.password_env: f"pw-{user.name}" for user in users(read_nodes(NODES))}
    server = NatsServer(tmp_path / "js", config=config, tls=True, env=env).start()
    try:
        credentials = NatsCredentials(
            user=f"node-{node}", password=f"pw-node-{node}", ca_file=str(ca)
        )
        client = await connect(server.url, name="node", credentials=credentials)
        await client.close()
    finally:
        server.stop()


async def test_gpushare_audit_reads_the_log_as_the_auditor(
    secure_nats: SecureNats,
    admin: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    share = ContainerShare(container="c", card_index=0, card_uuid="GPU-0", memory_mib=1000)
    reserved = PodReserved(id="reserve-web", at=AT, node=NODE_A, pod=POD, shares=(share,))
    await AllocationLog(admin.jetstream()).append(reserved)
    monkeypatch.setenv("GPUSHARE_NATS_USER", "auditor")
    monkeypatch.setenv("GPUSHARE_NATS_PASSWORD", secure_nats.passwords["auditor"])
    monkeypatch.setenv("GPUSHARE_NATS_CA", str(secure_nats.ca_file))
    ran = await run_main(audit.main, ["--json", "--node", NODE_A], secure_nats.url, capsys)
    assert ran.code == 0
    (row,) = [json.loads(line) for line in ran.lines]
    assert row["subject"] == allocation_subject(NODE_A, "allocator")
    assert row["event"]["type"] == "PodReserved"
