"""kube-scheduler calling the extender over HTTPS, as ``deploy/`` configures it.

The allocator serves a certificate for the allocator Service's DNS names (those of
cert-manager's Certificate in ``deploy/base/certificates/``), signed by a private CA, with
the flags of its Deployment; kube-scheduler's stanza is the one of
``deploy/overlays/default-scheduler/scheduler-config.yaml`` (``enableHTTPS``,
``tlsConfig.caFile``), pointed at 127.0.0.1 with ``tlsConfig.serverName`` set to the
Service's name, since no DNS resolves it here. Pods schedule through it; a CA that did
not sign the certificate, or a name it does not carry, fail the TLS handshake and the pod
waits, and gets scheduled once the stanza is right again. With client certificates
(``--tls-client-ca-file``, ``docs/https.md``), a scheduler without one gets 403.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from kubernetes import client

from gpushare.cli.stack import Stack
from gpushare.core.annotations import IDX
from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from tests.k8s.pods import eventually
from tests.k8s.scheduling import (
    annotations_of,
    gpu_pod,
    running_stack,
    wait_bound,
    wait_scheduler_error,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVICE = "gpushare-allocator.gpushare-system.svc"
NODE = "tls-a"


def deploy_stanza() -> dict[str, Any]:
    """The extender stanza of the default-scheduler overlay."""
    path = DEPLOY / "overlays" / "default-scheduler" / "scheduler-config.yaml"
    return dict(yaml.safe_load(path.read_text())["extenders"][0])


def allocator_dns_names() -> list[str]:
    """The names of the allocator's certificate, as cert-manager issues it."""
    documents = yaml.safe_load_all(
        (DEPLOY / "base" / "certificates" / "certificates.yaml").read_text()
    )
    [certificate] = [d for d in documents if d and d["metadata"]["name"] == "gpushare-allocator"]
    return list(certificate["spec"]["dnsNames"])


@dataclass(frozen=True)
class Pki:
    ca_file: Path
    """The CA that signed the allocator's certificate (the Secret's ``ca.crt``)."""
    cert_file: Path
    key_file: Path
    other_ca_file: Path
    """A CA that signed nothing here."""
    client_ca_file: Path
    """The CA of kube-scheduler's client certificate."""
    client_cert_file: Path
    client_key_file: Path

    def context(self, client_certificate: bool = False) -> ssl.SSLContext:
        """Trusts the CA; the certificate names the Service, not 127.0.0.1, so only the
        chain is checked."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.check_hostname = False
        if client_certificate:
            context.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return context


@pytest.fixture
def pki(short_tmp: Path) -> Pki:
    directory = short_tmp / "pki"
    directory.mkdir()
    ca, other, client_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = ca.issue_cert(*allocator_dns_names())
    scheduler = client_ca.issue_cert("kube-scheduler")
    files = {
        "ca.crt": ca.cert_pem,
        "tls.crt": server.cert_chain_pems[0],
        "tls.key": server.private_key_pem,
        "other-ca.crt": other.cert_pem,
        "client-ca.crt": client_ca.cert_pem,
        "client.crt": scheduler.cert_chain_pems[0],
        "client.key": scheduler.private_key_pem,
    }
    for name, blob in files.items():
        blob.write_to_path(str(directory / name))
    return Pki(*(directory / name for name in files))


def https_stanza(port: int, pki: Pki) -> ExtenderStanza:
    return ExtenderStanza(
        extender_url(port, scheme="https"), tls_ca_file=pki.ca_file, tls_server_name=SERVICE
    )


def serving_flags(pki: Pki) -> list[str]:
    """The allocator Deployment's TLS flags, with this test's files."""
    return ["--tls-cert-file", str(pki.cert_file), "--tls-key-file", str(pki.key_file)]


@pytest.fixture
def https_stack(
    k8s_clean: ControlPlane, extender_port: int, short_tmp: Path, pki: Pki
) -> Iterator[Stack]:
    with running_stack(
        k8s_clean,
        short_tmp / "stack",
        [f"{NODE}=16276,16276"],
        extender_port=extender_port,
        service_args={"allocator": serving_flags(pki)},
        tls_context=pki.context(),
    ) as stack:
        yield stack


def test_the_stanza_is_deploys_but_for_where_the_files_are(extender_port: int, pki: Pki) -> None:
    ours, deploy = https_stanza(extender_port, pki).to_config(), deploy_stanza()
    assert ours.pop("urlPrefix") == f"https://127.0.0.1:{extender_port}/gpushare-scheduler"
    assert deploy.pop("urlPrefix") == f"https://{SERVICE}:443/gpushare-scheduler"
    assert ours.pop("tlsConfig") == {"caFile": str(pki.ca_file), "serverName": SERVICE}
    assert set(deploy.pop("tlsConfig")) == {"caFile", "certFile", "keyFile"}
    assert ours == deploy


def test_pods_schedule_through_the_extender_over_https_and_wait_while_it_is_untrusted(
    https_stack: Stack,
    k8s_api: client.CoreV1Api,
    k8s_clean: ControlPlane,
    extender_port: int,
    pki: Pki,
) -> None:
    good = https_stanza(extender_port, pki)
    k8s_clean.reconfigure_scheduler([good])
    for name in ("tls-1", "tls-2"):
        k8s_api.create_namespaced_pod("default", gpu_pod(name, 8000))
    for name in ("tls-1", "tls-2"):
        pod = wait_bound(k8s_api, name)
        assert pod["spec"]["nodeName"] == NODE
        assert annotations_of(pod)[IDX] in {"0", "1"}

    k8s_clean.reconfigure_scheduler([replace(good, tls_ca_file=pki.other_ca_file)])
    k8s_api.create_namespaced_pod("default", gpu_pod("tls-3", 8000))
    message = wait_scheduler_error(k8s_api, "tls-3")
    assert "x509: certificate signed by unknown authority" in message, message

    k8s_clean.reconfigure_scheduler([replace(good, tls_server_name="")])
    message = eventually_message(k8s_api, "tls-3", "IP SANs")
    assert "x509: cannot validate certificate for 127.0.0.1" in message, message

    k8s_clean.reconfigure_scheduler([good])
    assert wait_bound(k8s_api, "tls-3")["spec"]["nodeName"] == NODE


def eventually_message(api: client.CoreV1Api, name: str, containing: str) -> str:
    """The pod's scheduler error once it contains ``containing`` (after a restart of
    kube-scheduler the last attempt's message may still be the previous one)."""

    def naming() -> str | None:
        message = wait_scheduler_error(api, name)
        return message if containing in message else None

    return str(eventually(naming, f"pod {name}'s scheduler error naming {containing!r}"))


def test_with_client_certificates_only_a_scheduler_holding_one_gets_through(
    k8s_clean: ControlPlane,
    k8s_api: client.CoreV1Api,
    extender_port: int,
    short_tmp: Path,
    pki: Pki,
) -> None:
    flags = [*serving_flags(pki), "--tls-client-ca-file", str(pki.client_ca_file)]
    with running_stack(
        k8s_clean,
        short_tmp / "mtls",
        [f"{NODE}=16276,16276"],
        extender_port=extender_port,
        service_args={"allocator": flags},
        tls_context=pki.context(client_certificate=True),
    ):
        anonymous = https_stanza(extender_port, pki)
        k8s_clean.reconfigure_scheduler([anonymous])
        k8s_api.create_namespaced_pod("default", gpu_pod("mtls-1", 4000))
        message = wait_scheduler_error(k8s_api, "mtls-1")
        # the handshake lets it in without a certificate (the probes hold none either);
        # every verb answers 403
        refused = f"failed filter with extender at URL {anonymous.url_prefix}/filter, code 403"
        assert refused in message, message

        holding = replace(
            anonymous, tls_cert_file=pki.client_cert_file, tls_key_file=pki.client_key_file
        )
        k8s_clean.reconfigure_scheduler([holding])
        assert wait_bound(k8s_api, "mtls-1")["spec"]["nodeName"] == NODE
