"""``kubectl gpushare`` as a kubectl plugin: kubectl's flags, addresses from the API.

The allocations come from a real nats-server, the nodes (and their ``InternalIP``) from
the embedded Kubernetes API stand-in, reached through a kubeconfig file as kubectl would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from gpushare.cli import kubectl_plugin
from gpushare.embedded.kube_api import CONTEXT, KubeApiServer
from gpushare.embedded.kube_objects import RESOURCES, prepare_create
from gpushare.embedded.nats_server import NatsServer, free_port
from tests.integration.allocator.serving import publish
from tests.integration.cli.running import run_main, web_lifecycle
from tests.unit.allocator.builders import seed_000_filter_cluster

ADDRESSES = {"N1": "10.0.0.1", "N3": "10.0.0.3"}
"""N2 has no InternalIP (only a Hostname): it shows ``unknown``."""


def node(name: str) -> dict[str, Any]:
    addresses = [{"type": "Hostname", "address": name.lower()}]
    if name in ADDRESSES:
        addresses.insert(0, {"type": "ExternalIP", "address": "203.0.113.9"})
        addresses.append({"type": "InternalIP", "address": ADDRESSES[name]})
    return {"metadata": {"name": name}, "status": {"addresses": addresses}}


@pytest.fixture
async def kube_api() -> AsyncIterator[KubeApiServer]:
    server = await KubeApiServer().start()
    for name in ("N1", "N2", "N3"):
        server.store.write("nodes", prepare_create(RESOURCES["nodes"], node(name), ""))
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def kubeconfig(kube_api: KubeApiServer, tmp_path: Path) -> Path:
    """The stand-in's context, and a current context ``away`` whose cluster nothing serves."""
    config = kube_api.kubeconfig()
    away = f"http://127.0.0.1:{free_port()}"
    config["clusters"].append({"name": "away", "cluster": {"server": away}})
    config["contexts"].append(
        {"name": "away", "context": {"cluster": "away", "user": CONTEXT, "namespace": "ml"}}
    )
    config["current-context"] = "away"
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
async def seeded(js: JetStreamContext) -> None:
    """Seed 000's cluster; default/web on N3 beside two ``occupants`` pods."""
    await publish(js, seed_000_filter_cluster())
    await web_lifecycle(js)


def addresses(lines: list[str]) -> dict[str, str]:
    return {line.split()[0]: line.split()[1] for line in lines[1:4]}


@pytest.mark.usefixtures("seeded")
async def test_kubectls_flags_pick_the_cluster_and_ipaddress_is_each_nodes_internal_ip(
    nats_server: NatsServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--kubeconfig", str(kubeconfig), "--context", CONTEXT]
    ran = await run_main(kubectl_plugin.main, flags, nats_server.url, capsys)
    assert (ran.code, ran.err) == (0, "")
    assert addresses(ran.lines) == {"N1": "10.0.0.1", "N2": "unknown", "N3": "10.0.0.3"}
    # the current context's cluster, named over by --cluster, or its server by --server
    for override in (["--cluster", CONTEXT], ["--server", kubectl_api_url(kubeconfig)]):
        flags = ["--kubeconfig", str(kubeconfig), *override]
        ran = await run_main(kubectl_plugin.main, flags, nats_server.url, capsys)
        assert (ran.code, ran.err) == (0, "")
        assert addresses(ran.lines)["N3"] == "10.0.0.3"


def kubectl_api_url(kubeconfig: Path) -> str:
    clusters = json.loads(kubeconfig.read_text())["clusters"]
    return str(next(c["cluster"]["server"] for c in clusters if c["name"] == CONTEXT))


@pytest.mark.usefixtures("seeded")
async def test_kubeconfig_from_the_environment_and_a_namespace_for_the_details(
    nats_server: NatsServer,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    args = ["N3", "-d", "--context", CONTEXT]
    everyone = await run_main(kubectl_plugin.main, args, nats_server.url, capsys)
    assert everyone.code == 0
    assert "IPADDRESS:  10.0.0.3" in everyone.lines
    pods = [line.split()[0] for line in everyone.lines if line.endswith(("reserved", "assigned"))]
    assert pods == ["N3-gpu0-occupant", "N3-gpu1-occupant", "web"]
    only = await run_main(kubectl_plugin.main, [*args, "-n", "default"], nats_server.url, capsys)
    rows = [line.split() for line in only.lines if line.endswith(("reserved", "assigned"))]
    assert rows == [["web", "default", "8138", "0", "assigned"]]
    assert "Allocated :  32552 (100%)" in only.lines  # the cards' use stays the node's
    all_ns = await run_main(
        kubectl_plugin.main, [*args, "-n", "default", "-A"], nats_server.url, capsys
    )
    assert all_ns.out == everyone.out
    as_json = await run_main(kubectl_plugin.main, [*args, "--json"], nats_server.url, capsys)
    assert json.loads(as_json.out)["nodes"][0]["address"] == "10.0.0.3"


@pytest.mark.usefixtures("seeded")
async def test_an_unusable_kubeconfig_is_said_and_the_allocations_still_shown(
    nats_server: NatsServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = await run_main(
        kubectl_plugin.main,
        ["--kubeconfig", str(kubeconfig), "--context", "nope"],
        nats_server.url,
        capsys,
    )
    assert missing.code == 0
    assert missing.err == (
        "kubectl gpushare: IPADDRESS unknown: context 'nope' is not in the kubeconfig\n"
    )
    assert set(addresses(missing.lines).values()) == {"unknown"}
    away = await run_main(
        kubectl_plugin.main,
        ["--kubeconfig", str(kubeconfig), "--connect-timeout", "2"],
        nats_server.url,
        capsys,
    )
    assert away.code == 0
    assert away.err.startswith("kubectl gpushare: IPADDRESS unknown: cannot list nodes at http")
    assert len(away.err.splitlines()) == 1
    assert set(addresses(away.lines).values()) == {"unknown"}
