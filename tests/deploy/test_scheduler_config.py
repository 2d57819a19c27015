"""The kube-scheduler configurations (second scheduler and default scheduler) call the
allocator the way it serves: filter, prioritize and bind over HTTPS at its URL prefix,
for exactly the resources gpushare reads, never ignorable, with a timeout longer than
bind's wait."""

from __future__ import annotations

import copy
import re
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gpushare.allocator.__main__ import parse_settings as parse_allocator
from gpushare.allocator.settings import URL_PREFIX
from gpushare.core.plugin_resources import DIALECTS
from gpushare.core.requests import GPU_COUNT, SHARE_RESOURCES
from tests.deploy.manifests import (
    DEPLOY,
    NAMESPACE,
    Obj,
    containers,
    named,
    render,
    scheduler_config,
)

CONFIGURED = ("second-scheduler", "default-scheduler", "dev")
TOP_LEVEL = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
}
"""KubeSchedulerConfiguration's fields (kube-scheduler config/v1 types.go)."""
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
TLS_FIELDS = {
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
}
DURATION = re.compile(r"^(?:(?P<m>\d+)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$")
KUBEADM_PATCH = (
    DEPLOY / "overlays" / "default-scheduler" / "kubeadm-patches" / "kube-scheduler+json.yaml"
)


def _extender(overlay: str) -> Obj:
    config = scheduler_config(overlay)
    [extender] = config["extenders"]
    extender_: Obj = extender
    return extender_


def _seconds(duration: str) -> float:
    match = DURATION.match(duration)
    assert duration, "empty duration"
    assert match, f"not a duration: {duration!r}"
    return int(match["m"] or 0) * 60 + float(match["s"] or 0)


def expected_managed_resources() -> dict[str, bool]:
    """Resource name → ignoredByScheduler: what gpushare reads and the gpu-count the binder
    advertises; ignored by the in-tree fit check unless some node-agent dialect advertises
    it. kubernetes.io/ names are not extended resources (config validation refuses them)."""
    advertised = {name for names in DIALECTS.values() for name in names} | {GPU_COUNT}
    names = {n for n in SHARE_RESOURCES | {GPU_COUNT} if not n.startswith("kubernetes.io/")}
    return {name: name not in advertised for name in names}


@pytest.mark.parametrize("overlay", CONFIGURED)
def test_configuration_is_v1_with_known_fields(overlay: str) -> None:
    config = scheduler_config(overlay)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= TOP_LEVEL
    assert config["leaderElection"]["leaderElect"] is True
    extender = _extender(overlay)
    assert set(extender) <= EXTENDER_FIELDS
    assert set(extender.get("tlsConfig", {})) <= TLS_FIELDS


@pytest.mark.parametrize("overlay", CONFIGURED)
def test_extender_filters_prioritizes_and_binds(overlay: str) -> None:
    extender = _extender(overlay)
    assert extender["filterVerb"] == "filter"
    assert extender["prioritizeVerb"] == "prioritize"
    assert extender["bindVerb"] == "bind"
    assert "preemptVerb" not in extender
    assert extender["weight"] > 0
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    # bind answers only once the binder has, waiting up to --bind-wait (not overridden).
    [allocator] = containers(named(render(overlay), "Deployment", "gpushare-allocator"))
    assert not any(arg.startswith("--bind-wait") for arg in allocator["args"])
    assert _seconds(extender["httpTimeout"]) > parse_allocator([], {}).bind_wait_seconds


@pytest.mark.parametrize("overlay", CONFIGURED)
def test_extender_calls_the_allocator_service_over_https(overlay: str) -> None:
    extender = _extender(overlay)
    url = urlsplit(extender["urlPrefix"])
    assert url.scheme == "https"
    assert extender["enableHTTPS"] is True
    assert url.path == URL_PREFIX
    assert url.hostname == f"gpushare-allocator.{NAMESPACE}.svc"
    service = named(render(overlay), "Service", "gpushare-allocator")
    assert url.port in {port["port"] for port in service["spec"]["ports"]}
    tls = extender["tlsConfig"]
    assert tls["caFile"]
    assert not tls.get("insecure", False)


@pytest.mark.parametrize("overlay", CONFIGURED)
def test_managed_resources_are_what_gpushare_reads(overlay: str) -> None:
    managed = {m["name"]: m["ignoredByScheduler"] for m in _extender(overlay)["managedResources"]}
    assert managed == expected_managed_resources()
    assert managed["aliyun.com/gpu-mem"] is False
    assert managed["aliyun.com/gpu-count"] is False


def test_both_scheduler_options_share_one_extender() -> None:
    second, default = _extender("second-scheduler"), _extender("default-scheduler")
    files = {"caFile": "", "certFile": "", "keyFile": ""}
    without_files = [{**e, "tlsConfig": {**e["tlsConfig"], **files}} for e in (second, default)]
    assert without_files[0] == without_files[1]


@pytest.mark.parametrize("overlay", CONFIGURED)
def test_kube_scheduler_presents_its_client_certificate(overlay: str) -> None:
    """The allocator runs with --tls-client-ca-file: a scheduler without a certificate gets
    403 from every verb."""
    tls = _extender(overlay)["tlsConfig"]
    assert tls["certFile"]
    assert tls["keyFile"]
    assert not {"certData", "keyData"} & set(tls)  # files, never secrets inlined in a ConfigMap


def test_second_scheduler_loads_its_configuration_and_the_allocator_ca() -> None:
    objects = render("second-scheduler")
    deployment = named(objects, "Deployment", "gpushare-scheduler")
    [container] = containers(deployment)
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+", container["image"])
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    [flag] = [arg for arg in container["command"] if arg.startswith("--config=")]
    path = PurePosixPath(flag.removeprefix("--config="))
    assert mounts[str(path.parent)]["configMap"]["name"].startswith("gpushare-scheduler-config")
    assert path.name == "config.yaml"
    config = scheduler_config("second-scheduler")
    assert config["profiles"] == [{"schedulerName": "gpushare-scheduler"}]
    tls = _extender("second-scheduler")["tlsConfig"]
    ca = PurePosixPath(tls["caFile"])
    secret = mounts[str(ca.parent)]["secret"]
    assert secret["secretName"] == "gpushare-allocator-tls"
    assert secret["items"] == [{"key": "ca.crt", "path": ca.name}]
    # Its client certificate and key, from the Secret of its Certificate.
    cert, key = PurePosixPath(tls["certFile"]), PurePosixPath(tls["keyFile"])
    assert cert.parent == key.parent
    secret = mounts[str(cert.parent)]["secret"]
    assert secret["secretName"] == "gpushare-scheduler-client-tls"
    assert {(item["key"], item["path"]) for item in secret["items"]} == {
        ("tls.crt", cert.name),
        ("tls.key", key.name),
    }
    lease = named(objects, "Role", "gpushare-scheduler-lease")
    election = config["leaderElection"]
    assert election["resourceNamespace"] == lease["metadata"]["namespace"]
    assert lease["rules"][0]["resourceNames"] == [election["resourceName"]]


KUBEADM_SCHEDULER: Obj = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
    "spec": {
        "hostNetwork": True,
        "priorityClassName": "system-node-critical",
        "containers": [
            {
                "name": "kube-scheduler",
                "image": "registry.k8s.io/kube-scheduler:v1.32.4",
                "command": [
                    "kube-scheduler",
                    "--authentication-kubeconfig=/etc/kubernetes/scheduler.conf",
                    "--authorization-kubeconfig=/etc/kubernetes/scheduler.conf",
                    "--bind-address=127.0.0.1",
                    "--kubeconfig=/etc/kubernetes/scheduler.conf",
                    "--leader-elect=true",
                ],
                "volumeMounts": [
                    {
                        "name": "kubeconfig",
                        "mountPath": "/etc/kubernetes/scheduler.conf",
                        "readOnly": True,
                    }
                ],
            }
        ],
        "volumes": [
            {
                "name": "kubeconfig",
                "hostPath": {"path": "/etc/kubernetes/scheduler.conf", "type": "FileOrCreate"},
            }
        ],
    },
}
"""The static pod kubeadm writes (/etc/kubernetes/manifests/kube-scheduler.yaml)."""


def _apply_adds(document: Obj, operations: list[Obj]) -> Obj:
    """RFC 6902 ``add`` operations, the only kind the kubeadm patch uses."""
    patched = copy.deepcopy(document)
    for operation in operations:
        assert operation["op"] == "add", operation
        *parents, last = operation["path"].lstrip("/").split("/")
        target: Any = patched
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if last == "-":
            target.append(operation["value"])
        else:
            target[last] = operation["value"]
    return patched


def test_kubeadm_patch_points_the_default_scheduler_at_the_configuration() -> None:
    operations = yaml.safe_load(KUBEADM_PATCH.read_text())
    pod = _apply_adds(KUBEADM_SCHEDULER, operations)
    kubernetes_validate.validate(pod, "1.32", strict=True)
    spec = pod["spec"]
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    [container] = spec["containers"]
    [flag] = [arg for arg in container["command"] if arg.startswith("--config=")]
    config_path = PurePosixPath(flag.removeprefix("--config="))
    host_dirs = {
        m["mountPath"]: v["hostPath"]["path"]
        for m in container["volumeMounts"]
        for v in spec["volumes"]
        if v["name"] == m["name"]
    }
    assert host_dirs[str(config_path.parent)] == str(config_path.parent)
    assert config_path.name == "scheduler-config.yaml"
    tls = _extender("default-scheduler")["tlsConfig"]
    for file in ("caFile", "certFile", "keyFile"):  # all copied beside the configuration
        assert PurePosixPath(tls[file]).parent == config_path.parent
    config = scheduler_config("default-scheduler")
    assert config["profiles"] == [{"schedulerName": "default-scheduler"}]
    # With --config, kube-scheduler ignores --kubeconfig: the file must name it.
    assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
