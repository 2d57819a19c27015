"""The NATS configuration the overlays render is one nats-server accepts (``nats-server
-t``, the binary the other tests run), with every password auth.conf references
supplied by the Secrets the StatefulSet reads."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
from pathlib import Path

import nats
import nats.errors
import pytest
import trustme

from gpushare.bus.connection import connect
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.permissions import PASSWORD_ENV_PREFIX
from gpushare.bus.streams import ensure_streams
from gpushare.bus.subjects import ALLOCATION_STREAM
from gpushare.embedded.nats_server import NatsServer, free_port, nats_server_binary
from tests.deploy.manifests import OVERLAYS, Obj, containers, named, of_kind, render

NODE_PREFIX = PASSWORD_ENV_PREFIX + "NODE_"
MOUNTS = ("/etc/nats/tls", "/data/jetstream", "/tmp/nats.pid")


def _config(objects: tuple[Obj, ...]) -> dict[str, str]:
    [config_map] = [
        c
        for c in of_kind(objects, "ConfigMap")
        if c["metadata"]["name"].startswith("gpushare-nats-config")
    ]
    data: dict[str, str] = config_map["data"]
    return data


def _password_variables(auth_conf: str) -> set[str]:
    return set(re.findall(r"\$(" + PASSWORD_ENV_PREFIX + r"[A-Z0-9_]+)", auth_conf))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configuration_includes_the_generated_users(overlay: str) -> None:
    objects = render(overlay)
    files = _config(objects)
    assert set(files) == {"nats.conf", "auth.conf"}
    assert re.search(r"^include auth\.conf$", files["nats.conf"], re.MULTILINE)
    assert _password_variables(files["auth.conf"])
    statefulset = named(objects, "StatefulSet", "gpushare-nats")
    [server] = containers(statefulset)
    assert re.fullmatch(r"nats:2\.\d+\.\d+-alpine", server["image"])
    sources = [s["secretRef"]["name"] for s in server["envFrom"]]
    assert [s.rsplit("-", 1)[0] if overlay == "dev" else s for s in sources] == [
        "gpushare-nats-users",
        "gpushare-nats-node-users",
    ]
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    data = next(m for m in server["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert "store_dir: " + data["mountPath"] in files["nats.conf"]


def _dev_secret(objects: tuple[Obj, ...], prefix: str) -> dict[str, str]:
    [secret] = [
        s for s in of_kind(objects, "Secret") if s["metadata"]["name"].rsplit("-", 1)[0] == prefix
    ]
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def test_dev_secrets_hold_exactly_the_passwords_auth_conf_reads() -> None:
    objects = render("dev")
    wanted = _password_variables(_config(objects)["auth.conf"])
    services = _dev_secret(objects, "gpushare-nats-users")
    nodes = _dev_secret(objects, "gpushare-nats-node-users")
    assert set(services) == {v for v in wanted if not v.startswith(NODE_PREFIX)}
    assert set(nodes) == {v for v in wanted if v.startswith(NODE_PREFIX)}


def test_nats_server_accepts_the_rendered_configuration(tmp_path: Path) -> None:
    objects = render("dev")
    files = _config(objects)
    tls = tmp_path / "tls"
    tls.mkdir()
    ca = trustme.CA()
    server = ca.issue_cert("gpushare-nats.gpushare-system.svc")
    ca.cert_pem.write_to_path(str(tls / "ca.crt"))
    server.cert_chain_pems[0].write_to_path(str(tls / "tls.crt"))
    server.private_key_pem.write_to_path(str(tls / "tls.key"))
    text = files["nats.conf"]
    for path in MOUNTS:
        assert path in text
    text = text.replace("/etc/nats/tls", str(tls))
    # NatsServer passes --store_dir itself; nats-server refuses it twice.
    text = text.replace("store_dir: /data/jetstream", "")
    text = text.replace("/tmp/nats.pid", str(tmp_path / "nats.pid"))
    (tmp_path / "nats.conf").write_text(text)
    (tmp_path / "auth.conf").write_text(files["auth.conf"])
    env = {
        "POD_NAME": "gpushare-nats-0",
        **_dev_secret(objects, "gpushare-nats-users"),
        **_dev_secret(objects, "gpushare-nats-node-users"),
    }
    checked = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # And it does read the passwords: without them the same file is refused.
    missing = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        env={"POD_NAME": "gpushare-nats-0"},
        timeout=30,
        check=False,
    )
    assert missing.returncode != 0
    assert PASSWORD_ENV_PREFIX in missing.stdout + missing.stderr


def _without_block(text: str, name: str) -> str:
    """``text`` less the top-level ``name { ... }`` block (braces balanced)."""
    start = text.index(f"\n{name} {{") + 1
    depth, end = 0, start
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0 and text[end] == "}":
            break
    return text[:start] + text[end + 1 :]


@pytest.mark.integration
async def test_services_connect_over_tls_with_their_own_passwords(tmp_path: Path) -> None:
    """One server of the rendered configuration (the cluster block left out: its routes
    name pods), reached the way the manifests set the services up."""
    objects = render("dev")
    files = _config(objects)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    tls = tmp_path / "tls"
    tls.mkdir()
    ca.cert_pem.write_to_path(str(tls / "ca.crt"))
    leaf.cert_chain_pems[0].write_to_path(str(tls / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tls / "tls.key"))
    text = _without_block(files["nats.conf"], "cluster")
    text = text.replace("/etc/nats/tls", str(tls)).replace("/tmp/nats.pid", str(tmp_path / "pid"))
    # NatsServer passes --store_dir itself; nats-server refuses it twice.
    text = text.replace("store_dir: /data/jetstream", "")
    text = text.replace("http: 0.0.0.0:8222", f"http: 127.0.0.1:{free_port()}")
    (tmp_path / "nats.conf").write_text(text)
    (tmp_path / "auth.conf").write_text(files["auth.conf"])
    services = _dev_secret(objects, "gpushare-nats-users")
    nodes = _dev_secret(objects, "gpushare-nats-node-users")
    server = NatsServer(
        tmp_path / "jetstream",
        config=tmp_path / "nats.conf",
        tls=True,
        log_file=tmp_path / "nats.log",
        env={"POD_NAME": "gpushare-nats-0", **services, **nodes},
    ).start()
    try:
        logins = {
            "allocator": services[PASSWORD_ENV_PREFIX + "ALLOCATOR"],
            "binder": services[PASSWORD_ENV_PREFIX + "BINDER"],
            "node-gpu-node-1": nodes[NODE_PREFIX + "GPU_NODE_1"],
        }
        for user, password in logins.items():
            credentials = NatsCredentials(user=user, password=password, ca_file=str(tls / "ca.crt"))
            client = await connect(server.url, name=f"deploy-test-{user}", credentials=credentials)
            try:
                await client.jetstream().account_info()
            finally:
                await client.close()
        wrong = NatsCredentials(user="binder", password="wrong", ca_file=str(tls / "ca.crt"))
        with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
            await nats.connect(
                server.url,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=5,
                **wrong.connect_options(server.url),
            )
    finally:
        server.stop()


@pytest.mark.integration
async def test_three_servers_form_a_jetstream_cluster_over_verified_routes(
    tmp_path: Path,
) -> None:
    """The rendered configuration, three times on this machine (routes pointed at local
    ports): the servers authenticate each other's certificates and hold a stream with
    three replicas."""
    objects = render("dev")
    files = _config(objects)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    tls = tmp_path / "tls"
    tls.mkdir()
    ca.cert_pem.write_to_path(str(tls / "ca.crt"))
    leaf.cert_chain_pems[0].write_to_path(str(tls / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tls / "tls.key"))
    routes = [free_port() for _ in range(3)]
    env = {**_dev_secret(objects, "gpushare-nats-users")}
    env.update(_dev_secret(objects, "gpushare-nats-node-users"))
    servers = []
    try:
        for index, route in enumerate(routes):
            directory = tmp_path / f"server-{index}"
            directory.mkdir()
            text = files["nats.conf"].replace("/etc/nats/tls", str(tls))
            text = text.replace("/tmp/nats.pid", str(directory / "pid"))
            text = text.replace("store_dir: /data/jetstream", "")
            text = text.replace("http: 0.0.0.0:8222", f"http: 127.0.0.1:{free_port()}")
            text = text.replace("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{route}")
            for peer, port in enumerate(routes):
                host = f"gpushare-nats-{peer}.gpushare-nats-headless.gpushare-system.svc"
                text = text.replace(f"nats://{host}:6222", f"nats://127.0.0.1:{port}")
            (directory / "nats.conf").write_text(text)
            (directory / "auth.conf").write_text(files["auth.conf"])
            server = NatsServer(
                directory / "jetstream",
                config=directory / "nats.conf",
                tls=True,
                log_file=directory / "nats.log",
                env={**env, "POD_NAME": f"gpushare-nats-{index}"},
            )
            servers.append(server.start())
        admin = NatsCredentials(
            user="admin",
            password=env[PASSWORD_ENV_PREFIX + "ADMIN"],
            ca_file=str(tls / "ca.crt"),
        )
        client = await connect(servers[0].url, name="deploy-test-admin", credentials=admin)
        try:
            js = client.jetstream()
            info = None
            for _ in range(150):  # a meta leader within 30 s
                try:
                    info = await js.add_stream(name="DEPLOY_TEST", subjects=["t"], num_replicas=3)
                    break
                except (nats.errors.Error, TimeoutError):  # no JetStream leader yet
                    await asyncio.sleep(0.2)
            assert info is not None, "the three servers formed no JetStream cluster"
            assert info.cluster is not None
            assert len(info.cluster.replicas or []) == 2
        finally:
            await client.close()
        await _streams_keep_three_replicas(servers[0].url, env, str(tls / "ca.crt"))
    finally:
        for server in servers:
            server.stop()


async def _streams_keep_three_replicas(url: str, env: dict[str, str], ca_file: str) -> None:
    """The allocator creates the streams with the deployment's ``GPUSHARE_STREAM_REPLICAS``
    (3); a node's reporter, which may not update them, leaves them as they are."""

    def login(user: str) -> NatsCredentials:
        key = PASSWORD_ENV_PREFIX + user.upper().replace("-", "_")
        return NatsCredentials(user=user, password=env[key], ca_file=ca_file)

    allocator = await connect(url, name="deploy-test-allocator", credentials=login("allocator"))
    node = await connect(url, name="deploy-test-node", credentials=login("node-gpu-node-1"))
    try:
        await ensure_streams(allocator.jetstream(), replicas=3)
        await ensure_streams(node.jetstream())  # would be refused if it tried an update
        info = await node.jetstream().stream_info(ALLOCATION_STREAM)
        assert info.config.num_replicas == 3
    finally:
        await node.close()
        await allocator.close()
