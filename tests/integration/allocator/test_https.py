"""The extender and the admission webhook over HTTPS (trustme certificates), and no secret
in the allocator's start-up logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import urllib.error
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme
from nats.js import JetStreamContext

from gpushare.allocator.__main__ import parse_settings
from gpushare.allocator.runtime import RunningAllocator, run_allocator, running_allocator
from gpushare.allocator.settings import AllocatorSettings, TlsSettings
from gpushare.allocator.tls import ServerCertificates
from gpushare.embedded.nats_server import NatsServer
from gpushare.embedded.scheduler import ExtenderCallFailed, ExtenderClient
from tests.integration.allocator.serving import allocator_settings, publish
from tests.unit.allocator.builders import card, first_chosen, fixture, inventory
from tests.unit.allocator.test_admission import VALIDATE, admission_review, allowed, stored_pod

PREFIX = "/gpushare-scheduler"
PASSWORD = "s3cret-nats-password"


@dataclass(frozen=True)
class Pki:
    """A CA, a certificate it signed for 127.0.0.1/localhost, and their files."""

    ca: trustme.CA
    ca_file: Path
    cert_file: Path
    key_file: Path

    def tls(self, client_ca_file: str | None = None, reload_seconds: float = 30.0) -> TlsSettings:
        return TlsSettings(
            cert_file=str(self.cert_file),
            key_file=str(self.key_file),
            client_ca_file=client_ca_file,
            reload_seconds=reload_seconds,
        )

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def issue(self, ca: trustme.CA) -> None:
        """Write a server certificate from ``ca`` over the served files (a rotation)."""
        server = ca.issue_cert("127.0.0.1", "localhost")
        server.private_key_pem.write_to_path(str(self.key_file))
        server.cert_chain_pems[0].write_to_path(str(self.cert_file))
        for pem in server.cert_chain_pems[1:]:
            pem.write_to_path(str(self.cert_file), append=True)


def make_pki(directory: Path) -> Pki:
    directory.mkdir()
    ca = trustme.CA()
    ca_file = directory / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    pki = Pki(ca, ca_file, directory / "tls.crt", directory / "tls.key")
    pki.issue(ca)
    return pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "server")


def https_settings(tls: TlsSettings) -> AllocatorSettings:
    return allocator_settings(tls=tls)


@pytest.fixture
async def served(js: JetStreamContext, pki: Pki) -> AsyncIterator[RunningAllocator]:
    await publish(
        js, [inventory(n, [card(n, 0), card(n, 1)]) for n in ("gpu-node-1", "gpu-node-2")]
    )
    async with running_allocator(js, https_settings(pki.tls())) as running:
        yield running


async def test_kube_schedulers_filter_call_over_https_with_the_ca(
    served: RunningAllocator, pki: Pki
) -> None:
    assert served.url.startswith("https://127.0.0.1:")
    client = ExtenderClient(f"{served.url}{PREFIX}", ca_file=str(pki.ca_file))
    for mode in ("", ".nodecache"):
        body = json.loads(fixture(f"filter{mode}.request.json"))
        answer = await asyncio.to_thread(client.call, "filter", body)
        accepted = json.loads(fixture(f"filter{mode}.accepted-response.json"))
        assert answer == {
            "Nodes": None,
            "NodeNames": None,
            "FailedAndUnresolvableNodes": {},
        } | first_chosen(accepted)


async def test_the_admission_webhook_answers_over_https(served: RunningAllocator, pki: Pki) -> None:
    async with httpx.AsyncClient(base_url=served.url, verify=pki.client_context()) as http:
        answer = await http.post(VALIDATE, json=admission_review(stored_pod("p", 8138)))
    assert answer.status_code == 200
    assert answer.json() == allowed()


async def test_plain_http_to_the_tls_port_fails(served: RunningAllocator) -> None:
    plain = served.url.replace("https://", "http://")
    async with httpx.AsyncClient(base_url=plain) as http:
        with pytest.raises(httpx.TransportError):
            await http.post(VALIDATE, json=admission_review(stored_pod("p", 8138)))


async def test_a_client_without_the_ca_fails_verification(served: RunningAllocator) -> None:
    async with httpx.AsyncClient(base_url=served.url) as http:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.get("/healthz")
    client = ExtenderClient(f"{served.url}{PREFIX}")
    body = json.loads(fixture("filter.nodecache.request.json"))
    with pytest.raises(urllib.error.URLError) as refused:
        await asyncio.to_thread(client.call, "filter", body)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


async def test_with_a_client_ca_only_clients_with_its_certificate_are_served(
    js: JetStreamContext, pki: Pki, tmp_path: Path
) -> None:
    clients = make_pki(tmp_path / "clients")
    scheduler = clients.ca.issue_cert("kube-scheduler")
    scheduler_pem = tmp_path / "kube-scheduler.pem"
    scheduler.private_key_and_cert_chain_pem.write_to_path(str(scheduler_pem))
    settings = https_settings(pki.tls(client_ca_file=str(clients.ca_file)))
    body = {"Pod": {}, "NodeNames": []}
    async with running_allocator(js, settings) as running:
        # Without a certificate: the probes answer (the kubelet holds none), the verbs 403.
        async with httpx.AsyncClient(base_url=running.url, verify=pki.client_context()) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert (await http.post(f"{PREFIX}/filter", json=body)).status_code == 403
        anonymous = ExtenderClient(f"{running.url}{PREFIX}", ca_file=str(pki.ca_file))
        with pytest.raises(ExtenderCallFailed, match=r"filter: HTTP 403: .*client certificate"):
            await asyncio.to_thread(anonymous.call, "filter", body)
        # A certificate of another CA: refused in the handshake.
        with_other = pki.client_context()
        make_pki(tmp_path / "other").ca.issue_cert("kube-scheduler").configure_cert(with_other)
        async with httpx.AsyncClient(base_url=running.url, verify=with_other) as http:
            with pytest.raises(httpx.TransportError):
                await http.get("/healthz")
        with_cert = pki.client_context()
        scheduler.configure_cert(with_cert)
        async with httpx.AsyncClient(base_url=running.url, verify=with_cert) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
        client = ExtenderClient(
            f"{running.url}{PREFIX}", ca_file=str(pki.ca_file), cert_file=str(scheduler_pem)
        )
        answer = await asyncio.to_thread(client.call, "filter", body)
    assert answer["Error"] == ""


async def test_a_rotated_certificate_is_served_without_a_restart(
    js: JetStreamContext, pki: Pki, tmp_path: Path
) -> None:
    successor = make_pki(tmp_path / "successor")
    settings = https_settings(pki.tls(reload_seconds=0.05))
    with (
        on_log("gpushare.allocator.tls", "tls: certificate files changed") as refused,
        on_log("gpushare.allocator.tls", "tls: reloaded") as reloaded,
    ):
        async with running_allocator(js, settings) as running:
            assert await _handshakes(running.url, pki.client_context())
            pki.cert_file.write_bytes(successor.cert_file.read_bytes())  # the key comes later
            await asyncio.wait_for(refused.wait(), 30)
            assert await _handshakes(running.url, pki.client_context())
            pki.key_file.write_bytes(successor.key_file.read_bytes())
            await asyncio.wait_for(reloaded.wait(), 30)
            assert await _handshakes(running.url, successor.client_context())
            assert not await _handshakes(running.url, pki.client_context())


@contextlib.contextmanager
def on_log(logger: str, prefix: str) -> Iterator[asyncio.Event]:
    """An event set when ``logger`` logs a message starting with ``prefix``."""
    seen = asyncio.Event()

    class Watcher(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith(prefix):
                seen.set()

    watched = logging.getLogger(logger)
    level = watched.level
    watcher = Watcher(logging.DEBUG)
    watched.addHandler(watcher)
    watched.setLevel(logging.DEBUG)
    try:
        yield seen
    finally:
        watched.removeHandler(watcher)
        watched.setLevel(level)


async def _handshakes(url: str, context: ssl.SSLContext) -> bool:
    async with httpx.AsyncClient(base_url=url, verify=context) as http:
        try:
            return (await http.get("/healthz")).status_code == 200
        except httpx.ConnectError:
            return False


def test_a_broken_rotation_keeps_the_serving_certificate(pki: Pki, tmp_path: Path) -> None:
    certificates = ServerCertificates(pki.tls())
    assert not certificates.reload_if_changed()
    other = make_pki(tmp_path / "other")
    pki.cert_file.write_bytes(other.cert_file.read_bytes())  # a key that does not match
    assert not certificates.reload_if_changed()
    pki.key_file.write_bytes(other.key_file.read_bytes())
    assert certificates.reload_if_changed()
    assert not certificates.reload_if_changed()


def test_tls_flags_and_environment(pki: Pki) -> None:
    assert not parse_settings([], {}).inspect_open
    assert parse_settings(["--inspect-open"], {}).inspect_open
    assert parse_settings([], {"GPUSHARE_INSPECT_OPEN": "true"}).inspect_open
    environ = {
        "GPUSHARE_TLS_CERT_FILE": str(pki.cert_file),
        "GPUSHARE_TLS_KEY_FILE": str(pki.key_file),
    }
    settings = parse_settings([], environ)
    assert settings.tls == pki.tls()
    flags = ["--tls-cert-file", str(pki.cert_file), "--tls-key-file", str(pki.key_file)]
    flags += ["--tls-client-ca-file", str(pki.ca_file), "--tls-reload-interval", "0"]
    assert parse_settings(flags, {}).tls == pki.tls(
        client_ca_file=str(pki.ca_file), reload_seconds=0.0
    )
    assert parse_settings([], {}).tls is None
    for wrong in (
        ["--tls-cert-file", str(pki.cert_file)],
        [*flags[:2], "--tls-key-file", "/nowhere"],
    ):
        with pytest.raises(SystemExit) as exit_:
            parse_settings(wrong, {})
        assert exit_.value.code == 2


async def test_starting_with_secrets_logs_none(
    nats_server: NatsServer, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    url = nats_server.url.replace("nats://", f"nats://gpushare:{PASSWORD}@")
    settings = allocator_settings(tls=pki.tls(), nats_url=url)
    stop = asyncio.Event()
    caplog.set_level(logging.DEBUG)
    with on_log("gpushare.allocator.runtime", "allocator allocator-a serving on https://") as up:
        running = asyncio.create_task(run_allocator(settings, stop))
        serving = asyncio.create_task(up.wait())
        await asyncio.wait({running, serving}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
    assert up.is_set()
    stop.set()
    assert await running == 0
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "allocator settings: nats_url='nats://***@127.0.0.1:" in logged
    assert PASSWORD not in logged
    assert PASSWORD not in caplog.text
