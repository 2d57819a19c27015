"""The manifests agree with the code they run: every container's arguments parse with
that service's own parser, the webhook and NATS URLs name Services and certificates
that exist, and each node pod finds its own NATS user's password."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trustme

from gpushare.allocator.__main__ import parse_settings as parse_allocator
from gpushare.allocator.admission import ADMISSION_PATH
from gpushare.allocator.admission_mutation import MUTATION_PATH
from gpushare.allocator.settings import URL_PREFIX
from gpushare.binder.__main__ import parse_settings as parse_binder
from gpushare.bus.permissions import node as node_user
from gpushare.core.native_names import RENAMES
from gpushare.core.requests import (
    MULTIPLE_GPU_ANNOTATION,
    NVIDIA_GPU,
    POLICY_ANNOTATION,
    SHARE_RESOURCES,
)
from gpushare.node_agent.__main__ import parse_settings as parse_agent
from gpushare.reporter.__main__ import parse_settings as parse_reporter
from tests.deploy.manifests import (
    NAMESPACE,
    OVERLAYS,
    Obj,
    containers,
    named,
    of_kind,
    render,
    selects,
)

NODE = "gpu-node-1.example"
"""A node name with a dot, as a kubelet's --hostname-override may give."""


def _container(objects: tuple[Obj, ...], kind: str, name: str, container: str) -> Obj:
    [found] = [c for c in containers(named(objects, kind, name)) if c["name"] == container]
    return found


def _args(container: Obj) -> list[str]:
    """The container's arguments after the kubelet expands $(NODE_NAME)."""
    args: list[str] = container["args"]
    return [arg.replace("$(NODE_NAME)", NODE) for arg in args]


def _mounted_secret_dir(workload: Obj, container: Obj, secret: str) -> str:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    [volume] = [v["name"] for v in volumes if v.get("secret", {}).get("secretName") == secret]
    [path] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume]
    return str(path)


CLIENT_SECRET = "gpushare-scheduler-client-tls"
"""kube-scheduler's client certificate; the allocator mounts only its ``ca.crt``."""


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_allocator_arguments_parse_and_serve_https(overlay: str, tmp_path: Path) -> None:
    objects = render(overlay)
    deployment = named(objects, "Deployment", "gpushare-allocator")
    container = _container(objects, "Deployment", "gpushare-allocator", "allocator")
    args = _args(container)
    assert args[0] == "allocator"
    tls_dir = _mounted_secret_dir(deployment, container, "gpushare-allocator-tls")
    client_ca_dir = _mounted_secret_dir(deployment, container, CLIENT_SECRET)
    # The files the Certificates' Secrets hold, where the pod mounts them.
    ca = trustme.CA()
    certificate = ca.issue_cert("gpushare-allocator.gpushare-system.svc")
    certificate.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    certificate.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    (tmp_path / "client-ca").mkdir()
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "client-ca" / "ca.crt"))
    local = [
        arg.replace(f"={tls_dir}/", f"={tmp_path}/").replace(
            f"={client_ca_dir}/", f"={tmp_path}/client-ca/"
        )
        for arg in args[1:]
    ]
    settings = parse_allocator(local, {})
    assert settings.tls is not None
    # Client certificates required: the verbs and /inspect answer kube-scheduler only.
    assert settings.tls.client_ca_file == f"{tmp_path}/client-ca/ca.crt"
    assert not settings.inspect_open
    assert settings.port == container["ports"][0]["containerPort"] == 39999
    assert settings.kubeconfig == "in-cluster"
    assert settings.nats_url.startswith("tls://")
    # The probes need no client certificate (the kubelet holds none): the allocator
    # leaves /healthz and /readyz open.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] in {"/healthz", "/readyz"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_kube_schedulers_certificate_is_a_client_the_allocator_accepts(
    overlay: str,
) -> None:
    objects = render(overlay)
    deployment = named(objects, "Deployment", "gpushare-allocator")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    [client_ca] = [v for v in volumes if v.get("secret", {}).get("secretName") == CLIENT_SECRET]
    # The CA only, never the scheduler's key.
    assert client_ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    [scheduler] = [
        c for c in of_kind(objects, "Certificate") if c["spec"]["secretName"] == CLIENT_SECRET
    ]
    assert scheduler["spec"]["usages"] == ["client auth"]
    issuer = scheduler["spec"]["issuerRef"]["name"]
    ca_secret = named(objects, "Issuer", issuer)["spec"]["ca"]["secretName"]
    ca = [c for c in of_kind(objects, "Certificate") if c["spec"]["secretName"] == ca_secret]
    assert [c["spec"]["isCA"] for c in ca] == [True]
    # A CA of its own: it signs nothing else, so no other certificate (NATS's is a client
    # certificate too) can call the extender.
    signed = [
        c["metadata"]["name"]
        for c in of_kind(objects, "Certificate")
        if c["spec"]["issuerRef"]["name"] == issuer
    ]
    assert signed == [scheduler["metadata"]["name"]]
    allocator_issuer = named(objects, "Certificate", "gpushare-allocator")["spec"]["issuerRef"]
    assert allocator_issuer["name"] != issuer


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_binder_reporter_and_agent_arguments_parse(overlay: str) -> None:
    objects = render(overlay)
    binder = _args(_container(objects, "Deployment", "gpushare-binder", "binder"))
    assert binder[0] == "binder"
    assert parse_binder(binder[1:], {}).kubeconfig == "in-cluster"
    reporter = _args(_container(objects, "DaemonSet", "gpushare-node", "reporter"))
    assert reporter[0] == "reporter"
    settings = parse_reporter(reporter[1:], {})
    assert settings.node_name == NODE
    agent = _args(_container(objects, "DaemonSet", "gpushare-node", "node-agent"))
    assert agent[0] == "node-agent"
    [target] = parse_agent(agent[1:], {}).targets
    assert target.name == NODE
    assert str(target.plugin_dir) == "/var/lib/kubelet/device-plugins"
    assert str(target.pod_resources_socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_nats_over_tls_as_their_own_user(overlay: str) -> None:
    objects = render(overlay)
    users = {}
    for workload in [*of_kind(objects, "Deployment"), *of_kind(objects, "DaemonSet")]:
        for container in containers(workload):
            env = {e["name"]: e for e in container.get("env", [])}
            if "GPUSHARE_NATS_USER" not in env:
                continue
            nats = [a for a in container["args"] if a.startswith("--nats=")]
            assert nats == [f"--nats=tls://gpushare-nats.{NAMESPACE}.svc:4222"]
            ca = env["GPUSHARE_NATS_CA"]["value"]
            ca_dir = _mounted_secret_dir(workload, container, "gpushare-nats-tls")
            assert ca == f"{ca_dir}/ca.crt"
            volume = next(
                v
                for v in workload["spec"]["template"]["spec"]["volumes"]
                if v.get("secret", {}).get("secretName") == "gpushare-nats-tls"
            )
            # Only the CA, never the server's private key.
            assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
            users[container["name"]] = env["GPUSHARE_NATS_USER"]["value"]
    assert users == {
        "allocator": "allocator",
        "binder": "binder",
        "reporter": "node-$(NODE_NAME)",
        "node-agent": "node-$(NODE_NAME)",
    }
    for name in ("allocator", "binder"):
        deployment = named(objects, "Deployment", f"gpushare-{name}")
        [container] = containers(deployment)
        [password] = [e for e in container["env"] if e["name"] == "GPUSHARE_NATS_PASSWORD"]
        ref = password["valueFrom"]["secretKeyRef"]
        assert ref["name"].startswith("gpushare-nats-users")
        assert ref["key"] == f"GPUSHARE_NATS_PASSWORD_{name.upper()}"


@pytest.mark.parametrize("container_name", ["reporter", "node-agent"])
def test_node_pods_read_their_own_nats_password(container_name: str, tmp_path: Path) -> None:
    """The shell wrapper derives the same variable name as gpushare.bus.permissions."""
    shell = shutil.which("sh")
    assert shell is not None
    objects = render("second-scheduler")
    container = _container(objects, "DaemonSet", "gpushare-node", container_name)
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "gpushare").write_text('#!/bin/sh\necho "$GPUSHARE_NATS_PASSWORD_FILE $*"\n')
    (fake / "gpushare").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "NODE_NAME": NODE}
    result = subprocess.run(
        [shell, "-c", command[2], *command[3:], "reporter", "--flag"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=10,
    )
    mount = next(
        m["mountPath"] for m in container["volumeMounts"] if m["name"] == "nats-node-users"
    )
    expected = f"{mount}/{node_user(NODE).password_env}"
    assert result.stdout.strip() == f"{expected} reporter --flag"


WEBHOOKS = {
    "ValidatingWebhookConfiguration": ADMISSION_PATH,
    "MutatingWebhookConfiguration": MUTATION_PATH,
}
"""Each admission webhook's configuration and the allocator path it calls."""


@pytest.mark.parametrize("kind", WEBHOOKS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_calls_the_allocator_admission_endpoint(overlay: str, kind: str) -> None:
    objects = render(overlay)
    [configuration] = of_kind(objects, kind)
    [webhook] = configuration["webhooks"]
    service_ref = webhook["clientConfig"]["service"]
    assert service_ref["path"] == URL_PREFIX + WEBHOOKS[kind]
    assert service_ref["namespace"] == NAMESPACE
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    [rule] = webhook["rules"]
    assert rule["resources"] == ["pods"]
    # CREATE only: no update (the binder's patches included) waits on an allocator.
    assert rule["operations"] == ["CREATE"]
    assert webhook["failurePolicy"] == "Fail"
    service = named(objects, "Service", service_ref["name"])
    [port] = [p for p in service["spec"]["ports"] if p["port"] == service_ref["port"]]
    deployment = named(objects, "Deployment", "gpushare-allocator")
    assert selects(
        {"matchLabels": service["spec"]["selector"]},
        deployment["spec"]["template"]["metadata"]["labels"],
    )
    [container] = containers(deployment)
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    # cert-manager injects the CA of the certificate the allocator serves.
    namespace, name = configuration["metadata"]["annotations"][
        "cert-manager.io/inject-ca-from"
    ].split("/")
    certificate = named(objects, "Certificate", name)
    assert namespace == certificate["metadata"]["namespace"] == NAMESPACE
    assert certificate["spec"]["secretName"] == "gpushare-allocator-tls"
    assert f"{service_ref['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_sees_only_pods_asking_for_a_gpushare_resource(overlay: str) -> None:
    """The share dialects always; nvidia.com/gpu only with an annotation the webhook
    judges (``tests/k8s/test_deploy_apply.py`` runs the expression on kube-apiserver)."""
    [configuration] = of_kind(render(overlay), "ValidatingWebhookConfiguration")
    [condition] = configuration["webhooks"][0]["matchConditions"]
    expression = condition["expression"]
    shares = sorted(_requestable() - {NVIDIA_GPU})
    literal = "[" + ", ".join(f"'{n}'" for n in shares) + "]"
    # Containers and init containers (limits: the API server requires them of extended
    # resources): twice the same list.
    assert expression.count(literal) == 2
    assert "requests" not in expression
    assert expression.count(f"'{NVIDIA_GPU}' in c.resources.limits") == 2
    assert expression.count("initContainers") == 4
    for annotation in (POLICY_ANNOTATION, MULTIPLE_GPU_ANNOTATION):
        assert f"'{annotation}' in object.metadata.annotations" in expression


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mutating_webhook_sees_only_pods_asking_a_kubernetes_io_name(overlay: str) -> None:
    """Every kubernetes.io name gpushare reads, and only those, as a limit or a request
    (a native name needs no limit); ``tests/k8s/test_deploy_apply.py`` runs it for real."""
    objects = render(overlay)
    [configuration] = of_kind(objects, "MutatingWebhookConfiguration")
    [webhook] = configuration["webhooks"]
    # Once: the rename leaves nothing to rename, and no other webhook adds these names.
    assert webhook["reinvocationPolicy"] == "Never"
    # Wherever a pod is rewritten, the validating webhook judges the result.
    [validating] = of_kind(objects, "ValidatingWebhookConfiguration")
    assert webhook["namespaceSelector"] == validating["webhooks"][0]["namespaceSelector"]
    [condition] = webhook["matchConditions"]
    expression = condition["expression"]
    native = {name for name in SHARE_RESOURCES if name.startswith("kubernetes.io/")}
    assert set(RENAMES) == native
    literal = "[" + ", ".join(f"'{n}'" for n in RENAMES) + "]"
    # Limits and requests, of containers and of init containers.
    assert expression.count(literal) == 4
    assert expression.count("c.resources.limits.exists(r, r in") == 2
    assert expression.count("c.resources.requests.exists(r, r in") == 2
    assert expression.count("initContainers") == 2
    assert "'gpushare.io/" not in expression


def _requestable() -> set[str]:
    """What a pod may ask for: kubernetes.io/ names are refused by the API server."""
    return {name for name in SHARE_RESOURCES if not name.startswith("kubernetes.io/")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_certificates_name_every_host_the_clients_dial(overlay: str) -> None:
    objects = render(overlay)
    nats = named(objects, "Certificate", "gpushare-nats")["spec"]
    assert f"gpushare-nats.{NAMESPACE}.svc" in nats["dnsNames"]
    assert {"server auth", "client auth"} <= set(nats["usages"])
    headless = named(objects, "Service", "gpushare-nats-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    statefulset = named(objects, "StatefulSet", "gpushare-nats")
    assert statefulset["spec"]["serviceName"] == "gpushare-nats-headless"
    assert f"*.gpushare-nats-headless.{NAMESPACE}.svc" in nats["dnsNames"]
    for certificate in of_kind(objects, "Certificate"):
        issuer = certificate["spec"]["issuerRef"]
        assert named(objects, issuer.get("kind", "Issuer"), issuer["name"])


def test_nats_routes_name_each_statefulset_pod() -> None:
    objects = render("second-scheduler")
    [config_map] = [
        c
        for c in of_kind(objects, "ConfigMap")
        if c["metadata"]["name"].startswith("gpushare-nats")
    ]
    text = config_map["data"]["nats.conf"]
    replicas = named(objects, "StatefulSet", "gpushare-nats")["spec"]["replicas"]
    for index in range(replicas):
        host = f"gpushare-nats-{index}.gpushare-nats-headless.{NAMESPACE}.svc"
        assert f"nats://{host}:6222" in text
    assert text.count("nats://gpushare-nats-") == replicas
    assert text.rstrip().endswith("include auth.conf")
