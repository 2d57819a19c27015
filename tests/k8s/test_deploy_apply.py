"""``deploy/`` on a real kube-apiserver: every overlay applies, the webhook blocks only
what it must while the allocator is down, and kube-scheduler runs both configurations.

One control plane for the module (no controller-manager: nothing here needs one). The
cert-manager kinds (``Issuer``, ``Certificate``) get stand-in CRDs that accept any spec,
so that the apply checks gpushare's objects, not cert-manager's schema.

* Every overlay passes ``kubectl apply --server-side --dry-run=server -k`` (strict field
  validation by the API server itself), then applies for real, one after another; every
  object it renders exists afterwards, and the ``Device`` CRD is established.
* The applied ValidatingWebhookConfiguration points at the Service ``gpushare-allocator``,
  which has no pods here: the allocator is down. kube-apiserver then creates a CPU pod
  and a plain ``nvidia.com/gpu`` pod, and applies label and annotation patches (as the
  binder's) to an existing share pod; it refuses (``failurePolicy: Fail``) a pod asking
  for a share, in a container or an init container, and an
  ``nvidia.com/gpu`` pod carrying ``gpushare.io/policy``: the ``matchConditions`` CEL runs
  on the real API server. The MutatingWebhookConfiguration, also pointing at no allocator,
  refuses a pod asking seed 002's ``kubernetes.io/gpu*`` names (as a limit, as a request
  only, in an init container) and nothing else.
* Copies of both webhooks pointed at an allocator served here over HTTPS (their rules and
  ``matchConditions`` as in ``deploy/``, judging only ``gpushare-system``, which the
  deployed ones leave out): a pod created with ``kubernetes.io/gpu: 50`` comes back from
  the API server asking ``gpushare.io/gpu: 50`` (the JSON Patch applied by the real
  kube-apiserver), and one asking both names is refused by the validating webhook.
* The real kube-scheduler starts with each overlay's whole KubeSchedulerConfiguration
  (the second scheduler's ConfigMap and the default scheduler's file), only its file
  paths moved here, answers ``/healthz`` and takes its leader-election lease.
  ``test_scheduler_https.py`` checks the extender stanza itself against an allocator.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvicorn
import yaml
from kubernetes import client
from kubernetes import config as kube_config

from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings
from gpushare.core.native_names import REWRITTEN_ANNOTATION
from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.embedded.k8s_ports import reserve_ports
from tests.fakes import offline_follower
from tests.k8s.pods import eventually

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OVERLAYS = ("second-scheduler", "default-scheduler", "dev")
NAMESPACE = "gpushare-system"
CHECKED = "webhook-check"
"""Where the webhook is judged: any namespace but kube-system and gpushare-system."""
SHARE = {"aliyun.com/gpu-mem": "1024"}
WEBHOOK_FAILED = 'failed calling webhook "pods.gpushare.io"'
RENAME_FAILED = 'failed calling webhook "kubernetes-io-names.pods.gpushare.io"'

Obj = dict[str, Any]


def _stand_in_crd(kind: str) -> Obj:
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


class Kubectl:
    """The tier's kubectl (the API server's release) against the control plane."""

    def __init__(self, binaries: K8sBinaries, plane: ControlPlane) -> None:
        path = binaries.path("kubectl")
        found = str(path) if path.exists() else shutil.which("kubectl")
        if found is None:
            pytest.skip("no kubectl beside the Kubernetes binaries nor on PATH")
        self.path = found
        self.env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [self.path, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}:\n{result.stderr}{result.stdout}")
        return result.stdout

    def render(self, overlay: str) -> list[Obj]:
        text = self("kustomize", str(DEPLOY / "overlays" / overlay))
        return [obj for obj in yaml.safe_load_all(text) if obj]


def _pod(
    name: str, resources: dict[str, str] | None = None, *, section: str = "limits", **extra: Any
) -> Obj:
    container: Obj = {"name": "main", "image": "busybox"}
    if resources is not None:
        container["resources"] = {section: dict(resources)}
    spec: Obj = {"containers": [container]}
    metadata: Obj = {"name": name}
    if "annotations" in extra:
        metadata["annotations"] = extra.pop("annotations")
    spec.update(extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@pytest.fixture(scope="module")
def plane(k8s_binaries: K8sBinaries) -> Iterator[ControlPlane]:
    with ControlPlane(binaries=k8s_binaries, controller_manager=False) as started:
        yield started


@pytest.fixture(scope="module")
def kubectl(k8s_binaries: K8sBinaries, plane: ControlPlane) -> Kubectl:
    run = Kubectl(k8s_binaries, plane)
    stand_ins = [_stand_in_crd("Issuer"), _stand_in_crd("Certificate")]
    run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(stand_ins))
    for crd in stand_ins:
        run("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}")
    # The namespace first: a dry run creates nothing, the objects in it included.
    run("apply", "--server-side", "-f", str(DEPLOY / "base" / "namespace.yaml"))
    return run


@pytest.fixture(scope="module")
def api(plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with kube_config.new_client_from_config(str(plane.kubeconfig)) as api_client:
        yield client.CoreV1Api(api_client)


@pytest.fixture(scope="module")
def existing(api: client.CoreV1Api, kubectl: Kubectl) -> str:
    """A share pod created before the webhook exists (its namespace too)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHECKED}}
    api.create_namespace(namespace)
    api.create_namespaced_pod(CHECKED, _pod("existing-share", SHARE))
    return "existing-share"


@pytest.fixture(scope="module")
def applied(kubectl: Kubectl, existing: str) -> Kubectl:
    """Every overlay applied (the webhook live, pointing at no allocator)."""
    for overlay in OVERLAYS:
        kubectl("apply", "--server-side", "-k", str(DEPLOY / "overlays" / overlay))
    return kubectl


# --- applying ---------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_passes_a_server_side_dry_run(kubectl: Kubectl, overlay: str) -> None:
    rendered = kubectl.render(overlay)
    out = kubectl(
        "apply", "--server-side", "--dry-run=server", "-k", str(DEPLOY / "overlays" / overlay)
    )
    assert out.count("(server dry run)") == len(rendered), out


def _key(obj: Obj) -> tuple[str, str, str | None]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_applies_and_its_objects_exist(applied: Kubectl, overlay: str) -> None:
    directory = str(DEPLOY / "overlays" / overlay)
    # Applying again changes nothing and conflicts with nothing (one field manager).
    applied("apply", "--server-side", "-k", directory)
    rendered = {_key(obj) for obj in applied.render(overlay)}
    stored = json.loads(applied("get", "-k", directory, "-o", "json"))["items"]
    assert {_key(obj) for obj in stored} == rendered
    assert all(obj["metadata"].get("uid") for obj in stored)


def test_the_device_crd_is_established(applied: Kubectl) -> None:
    crd = json.loads(applied("get", "crd", "devices.gpushare.io", "-o", "json"))
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    applied("get", "devices.gpushare.io")  # served: listing answers


def test_the_applied_webhook_is_the_one_in_deploy(applied: Kubectl) -> None:
    stored = json.loads(
        applied("get", "validatingwebhookconfiguration", "gpushare-allocator", "-o", "json")
    )
    [webhook] = stored["webhooks"]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    assert [c["name"] for c in webhook["matchConditions"]] == ["asks-for-a-gpushare-resource"]
    stored = json.loads(
        applied("get", "mutatingwebhookconfiguration", "gpushare-allocator", "-o", "json")
    )
    [webhook] = stored["webhooks"]
    assert (webhook["failurePolicy"], webhook["reinvocationPolicy"]) == ("Fail", "Never")
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    assert [c["name"] for c in webhook["matchConditions"]] == ["asks-for-a-kubernetes-io-gpu-name"]


# --- the webhook, with the allocator down -------------------------------------------------


def _create(api: client.CoreV1Api, pod: Obj) -> None:
    api.create_namespaced_pod(CHECKED, pod)


def _refused(api: client.CoreV1Api, pod: Obj, failed: str = WEBHOOK_FAILED) -> str:
    """The API server's refusal: calling the webhook failed (no allocator answers)."""
    with pytest.raises(client.ApiException) as caught:
        _create(api, pod)
    message = str(json.loads(caught.value.body)["message"])
    assert failed in message, message
    return message


def test_pods_gpushare_does_not_judge_are_created(api: client.CoreV1Api, applied: Kubectl) -> None:
    _create(api, _pod("cpu", {"cpu": "100m"}))
    _create(api, _pod("no-resources"))
    _create(api, _pod("whole-cards", {"nvidia.com/gpu": "2"}))
    # Only nvidia.com/gpu, with an annotation the webhook does not judge.
    _create(
        api,
        _pod(
            "whole-cards-model",
            {"nvidia.com/gpu": "1"},
            annotations={"gpushare.io/gpu-model": "A100"},
        ),
    )
    names = {pod.metadata.name for pod in api.list_namespaced_pod(CHECKED).items}
    assert {"cpu", "no-resources", "whole-cards", "whole-cards-model"} <= names


def test_updates_of_gpu_pods_go_through(
    api: client.CoreV1Api, applied: Kubectl, existing: str
) -> None:
    """Label and annotation patches, as the binder's: UPDATE never reaches the webhook."""
    patch = {
        "metadata": {
            "labels": {"gpushare.io/checked": "yes"},
            "annotations": {"gpushare.io/reservation": "r-1", "gpushare.io/policy": "binpack"},
        }
    }
    patched = api.patch_namespaced_pod(existing, CHECKED, patch)
    assert patched.metadata.annotations["gpushare.io/reservation"] == "r-1"
    assert patched.metadata.labels["gpushare.io/checked"] == "yes"
    # A whole-card pod too (created here if the test above did not run first).
    if not any(p.metadata.name == "whole-cards" for p in api.list_namespaced_pod(CHECKED).items):
        _create(api, _pod("whole-cards", {"nvidia.com/gpu": "2"}))
    api.patch_namespaced_pod("whole-cards", CHECKED, {"metadata": {"annotations": {"a": "b"}}})


def test_pods_asking_for_a_share_are_refused(api: client.CoreV1Api, applied: Kubectl) -> None:
    _refused(api, _pod("share", SHARE))
    _refused(api, _pod("core", {"gpushare.io/gpu-core": "50", "gpushare.io/gpu-memory": "4Gi"}))
    by_request = _pod("by-request")
    by_request["spec"]["containers"][0]["resources"] = {
        "requests": {"koordinator.sh/gpu-core": "50"}
    }
    # Never judged: the API server requires a limit of an extended resource, so the
    # webhook's matchConditions look at limits only.
    with pytest.raises(client.ApiException) as caught:
        _create(api, by_request)
    assert "Limit must be set" in json.loads(caught.value.body)["message"]
    init = _pod(
        "init-share",
        initContainers=[{"name": "init", "image": "busybox", "resources": {"limits": SHARE}}],
    )
    _refused(api, init)


def test_whole_card_pods_with_a_judged_annotation_are_refused(
    api: client.CoreV1Api, applied: Kubectl
) -> None:
    annotated = {"gpushare.io/policy": "spread"}
    _refused(api, _pod("policy", {"nvidia.com/gpu": "1"}, annotations=annotated))
    multiple = {"vke.volcengine.com/container-multiple-gpu": "2"}
    _refused(api, _pod("multiple", {"nvidia.com/gpu": "2"}, annotations=multiple))


def test_pods_asking_seed_002_names_wait_for_the_rename(
    api: client.CoreV1Api, applied: Kubectl
) -> None:
    """Refused by the mutating webhook while no allocator renames them: as asked, they
    could never run. Asked as a request alone too (a native name needs no limit)."""
    _refused(api, _pod("seed-002", {"kubernetes.io/gpu": "50"}), RENAME_FAILED)
    requested = _pod("seed-002-requests", {"kubernetes.io/gpu-core": "50"}, section="requests")
    _refused(api, requested, RENAME_FAILED)
    resources = {"requests": {"kubernetes.io/gpu-memory-ratio": "50"}}
    init_container = {"name": "i", "image": "x", "resources": resources}
    init = _pod("seed-002-init", initContainers=[init_container])
    _refused(api, init, RENAME_FAILED)
    # Other kubernetes.io names are not gpushare's: created, as without it.
    _create(api, _pod("rdma", {"kubernetes.io/rdma": "100"}, section="requests"))


# --- the webhooks, with an allocator ----------------------------------------------------

LIVE = "gpushare-allocator-live"


@contextlib.contextmanager
def _allocator_over_https(directory: Path) -> Iterator[tuple[int, bytes]]:
    """The allocator's app (no cards: the webhooks need none) on 127.0.0.1 over HTTPS,
    in a thread; yields its port and its CA's PEM."""
    ca = trustme.CA()
    certificate = ca.issue_cert("127.0.0.1")
    certificate.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    certificate.private_key_pem.write_to_path(str(directory / "tls.key"))
    app = create_app(offline_follower(), AllocatorSettings(replica_id="live"))
    config = uvicorn.Config(
        app,
        ssl_certfile=str(directory / "tls.crt"),
        ssl_keyfile=str(directory / "tls.key"),
        lifespan="off",
        loop="asyncio",
        ws="none",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            eventually(lambda: server.started, "the allocator serving HTTPS", timeout=30)
            yield sock.getsockname()[1], ca.cert_pem.bytes()
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def _live_copy(configuration: Obj, port: int, ca_pem: bytes) -> Obj:
    """``configuration`` calling the allocator at ``port``, judging only gpushare-system."""
    live = copy.deepcopy(configuration)
    live["metadata"] = {"name": LIVE}
    for webhook in live["webhooks"]:
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca_pem).decode(),
        }
        webhook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    return live


@pytest.fixture
def live_webhooks(applied: Kubectl, tmp_path: Path) -> Iterator[None]:
    """Both webhooks of deploy/, calling an allocator, for pods of gpushare-system."""
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    deployed = [obj for obj in applied.render("second-scheduler") if obj["kind"] in kinds]
    assert len(deployed) == 2
    with _allocator_over_https(tmp_path) as (port, ca_pem):
        copies = [_live_copy(obj, port, ca_pem) for obj in deployed]
        applied("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(copies))
        try:
            yield
        finally:
            for kind in kinds:
                applied("delete", kind.lower(), LIVE, "--ignore-not-found")
            applied("delete", "pods", "-n", NAMESPACE, "--all", "--wait=false")


def _resources(pod: Any) -> tuple[dict[str, str], dict[str, str]]:
    resources = pod.spec.containers[0].resources
    return dict(resources.limits or {}), dict(resources.requests or {})


def test_seed_002_names_come_back_as_gpushare_names(
    api: client.CoreV1Api, live_webhooks: None
) -> None:
    seed = _pod("seed-002", {"kubernetes.io/gpu": "50"})

    def renamed() -> bool:  # until the API server has loaded the new configurations
        dry = api.create_namespaced_pod(NAMESPACE, seed, dry_run="All")
        return "gpushare.io/gpu" in _resources(dry)[0]

    eventually(renamed, "the API server calling the live mutating webhook", timeout=30)
    created = api.create_namespaced_pod(NAMESPACE, seed)
    assert _resources(created) == ({"gpushare.io/gpu": "50"}, {"gpushare.io/gpu": "50"})
    assert created.metadata.annotations == {REWRITTEN_ANNOTATION: "kubernetes.io/gpu"}
    stored = api.read_namespaced_pod("seed-002", NAMESPACE)
    assert _resources(stored) == _resources(created)
    # Seed 002's own form: requests only; the limit an extended resource needs is added.
    asked = {"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory-ratio": "60"}
    requested = api.create_namespaced_pod(
        NAMESPACE, _pod("seed-002-requests", asked, section="requests")
    )
    renamed_asked = {"gpushare.io/gpu-core": "50", "gpushare.io/gpu-memory-ratio": "60"}
    assert _resources(requested) == (renamed_asked, renamed_asked)
    # Both names in one container: not merged; the validating webhook refuses the pair.
    both = _pod("both", {"kubernetes.io/gpu": "50", "gpushare.io/gpu": "30"})
    with pytest.raises(client.ApiException) as caught:
        api.create_namespaced_pod(NAMESPACE, both)
    message = str(json.loads(caught.value.body)["message"])
    assert 'gpushare: rule "duplicate-dimension"' in message, message


# --- kube-scheduler with deploy/'s configurations -----------------------------------------


def _scheduler_configuration(kubectl: Kubectl, overlay: str) -> Obj:
    if overlay == "default-scheduler":
        path = DEPLOY / "overlays" / "default-scheduler" / "scheduler-config.yaml"
        return dict(yaml.safe_load(path.read_text()))
    [config_map] = [
        obj
        for obj in kubectl.render(overlay)
        if obj["kind"] == "ConfigMap"
        and obj["metadata"]["name"].startswith("gpushare-scheduler-config")
    ]
    return dict(yaml.safe_load(config_map["data"]["config.yaml"]))


def _healthy(port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", context=context, timeout=2
        ) as reply:
            return reply.status == 200
    except OSError:
        return False


SCHEDULERS = {
    "second-scheduler": (NAMESPACE, "gpushare-scheduler"),
    "default-scheduler": ("kube-system", "kube-scheduler"),
}
"""Each overlay's scheduler configuration and the lease its leader election takes."""


@pytest.mark.parametrize("overlay", SCHEDULERS)
def test_kube_scheduler_runs_the_configuration(
    applied: Kubectl,
    k8s_binaries: K8sBinaries,
    plane: ControlPlane,
    tmp_path: Path,
    overlay: str,
) -> None:
    configuration = _scheduler_configuration(applied, overlay)
    configuration["clientConnection"] = {"kubeconfig": str(plane.kubeconfig)}
    [extender] = configuration["extenders"]
    # The files the Deployment (or the kubeadm patch) mounts, here.
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    client_certificate = trustme.CA().issue_cert("gpushare-scheduler")
    client_certificate.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    client_certificate.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    assert set(extender["tlsConfig"]) == {"caFile", "certFile", "keyFile"}
    extender["tlsConfig"] = {
        "caFile": str(tmp_path / "ca.crt"),
        "certFile": str(tmp_path / "tls.crt"),
        "keyFile": str(tmp_path / "tls.key"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(configuration))
    reservation = reserve_ports(1)
    port = reservation.ports[0]
    log = (tmp_path / "kube-scheduler.log").open("w")
    process = subprocess.Popen(
        [
            str(k8s_binaries.path("kube-scheduler")),
            f"--config={path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={tmp_path / 'certs'}",
            f"--authentication-kubeconfig={plane.kubeconfig}",
            f"--authorization-kubeconfig={plane.kubeconfig}",
            "--v=2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    reservation.release()
    try:

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(
                    f"kube-scheduler exited {process.returncode}:\n"
                    + (tmp_path / "kube-scheduler.log").read_text()[-4000:]
                )
            return _healthy(port)

        eventually(up, "kube-scheduler /healthz", timeout=90)
        namespace, name = SCHEDULERS[overlay]

        def holder() -> str:
            try:
                found = json.loads(applied("get", "lease", name, "-n", namespace, "-o", "json"))
            except AssertionError:
                return ""
            return str(found["spec"].get("holderIdentity") or "")

        eventually(holder, f"the lease {namespace}/{name}", timeout=60)
        assert process.poll() is None
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
