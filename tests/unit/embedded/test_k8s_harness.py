"""The real-Kubernetes harness's pure parts: extender stanzas, env files, ports, binaries."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpushare.embedded import k8s_ports
from gpushare.embedded.k8s_binaries import K8sBinaries, K8sBinariesMissing, bin_dir
from gpushare.embedded.k8s_cluster import read_env_file
from gpushare.embedded.k8s_extender import (
    ExtenderStanza,
    ManagedResource,
    extender_url,
    extenders_flow_list,
    gpushare_managed_resources,
)

DEPLOYED = Path(__file__).resolve().parents[3] / "deploy" / "overlays" / "default-scheduler"


def test_the_default_stanza_is_the_one_deploy_configures() -> None:
    import yaml

    deployed = yaml.safe_load((DEPLOYED / "scheduler-config.yaml").read_text())["extenders"][0]
    tls = {key: Path(path) for key, path in deployed["tlsConfig"].items()}
    ours = ExtenderStanza(
        deployed["urlPrefix"],
        tls_ca_file=tls["caFile"],
        tls_cert_file=tls["certFile"],
        tls_key_file=tls["keyFile"],
    )

    config = ours.to_config()

    assert {key: config[key] for key in deployed} == deployed
    assert set(config) == set(deployed)


def test_a_plain_http_stanza_has_no_tls_and_drops_empty_verbs() -> None:
    stanza = ExtenderStanza(
        extender_url(4000),
        prioritize_verb="",
        node_cache_capable=False,
        http_timeout="",
        managed_resources=(ManagedResource("aliyun.com/gpu-mem"),),
    )

    config = stanza.to_config()

    assert config == {
        "urlPrefix": "http://127.0.0.1:4000/gpushare-scheduler",
        "filterVerb": "filter",
        "bindVerb": "bind",
        "weight": 1,
        "enableHTTPS": False,
        "nodeCacheCapable": False,
        "ignorable": False,
        "managedResources": [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}],
    }


def test_https_without_a_ca_is_insecure_and_the_list_is_one_json_line() -> None:
    stanza = ExtenderStanza(extender_url(443, scheme="https"), tls_server_name="allocator")

    line = extenders_flow_list([stanza])

    assert "\n" not in line
    assert json.loads(line)[0]["tlsConfig"] == {"serverName": "allocator", "insecure": True}


def test_managed_resources_leave_out_kubernetes_io_names() -> None:
    names = {resource.name for resource in gpushare_managed_resources()}
    assert "aliyun.com/gpu-mem" in names
    assert not any(name.startswith("kubernetes.io/") for name in names)


def test_env_files_are_read_as_the_scripts_write_them(tmp_path: Path) -> None:
    path = tmp_path / "env"
    path.write_text("export KUBECONFIG='/tmp/a b/kc'\nexport K8S_TOKEN='t0k'\n# note\n")
    assert read_env_file(path) == {"KUBECONFIG": "/tmp/a b/kc", "K8S_TOKEN": "t0k"}


def test_reserved_ports_are_distinct_below_the_ephemeral_range_and_locked() -> None:
    first = k8s_ports.reserve_ports(5, random.Random(1))
    try:
        assert len(set(first.ports)) == 5
        assert all(k8s_ports.LOWEST <= port <= k8s_ports.highest_port() for port in first.ports)
        assert k8s_ports.highest_port() < 32768
        # the same choices again: every one is locked, so others are picked
        second = k8s_ports.reserve_ports(5, random.Random(1))
        assert not set(second.ports) & set(first.ports)
        second.release()
    finally:
        first.release()
    assert first.ports == []


def test_missing_binaries_are_named_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "kube-apiserver").write_text("")
    (tmp_path / "kube-apiserver").chmod(0o755)
    with pytest.raises(K8sBinariesMissing) as caught:
        K8sBinaries.find(tmp_path, env={"ETCD_BIN": str(tmp_path / "kube-apiserver")})
    assert caught.value.missing == ("kube-scheduler", "kube-controller-manager")
    assert "\n" not in str(caught.value)
    assert "make k8s-bin" in str(caught.value)


def test_the_binaries_directory_comes_from_the_flag_the_environment_or_the_default() -> None:
    assert bin_dir("/opt/k8s", {"GPUSHARE_K8S_BIN_DIR": "/env"}) == Path("/opt/k8s")
    assert bin_dir(None, {"GPUSHARE_K8S_BIN_DIR": "/env"}) == Path("/env")
    assert bin_dir(None, {}) == Path("~/.cache/gpushare/k8s").expanduser()
