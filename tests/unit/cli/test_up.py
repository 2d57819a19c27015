"""``gpushare up``: which Kubernetes it runs, from its flags and the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpushare.cli.stack import Stack, StackConfig
from gpushare.cli.up import UsageError, config_from, describe, parser
from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_cluster import KubeletEndpoints
from gpushare.embedded.nats_server import NatsServer

CONTROL_PLANE = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A directory with (empty, executable) control-plane binaries and etcd."""
    directory = tmp_path / "k8s"
    directory.mkdir()
    for name in (*CONTROL_PLANE, "etcd"):
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return directory


def configure(argv: list[str], env: dict[str, str]) -> tuple[StackConfig, str]:
    return config_from(parser().parse_args(["--data-dir", "/tmp/x", *argv]), env)


def test_k8s_bin_starts_a_real_control_plane(bin_dir: Path) -> None:
    config, note = configure(["--k8s-bin", str(bin_dir)], {"ETCD_BIN": str(bin_dir / "etcd")})
    assert config.k8s_bin == bin_dir.resolve()
    assert config.kubeconfig is None
    assert note == ""


def test_the_environment_names_the_binaries_when_no_flag_does(bin_dir: Path) -> None:
    env = {"GPUSHARE_K8S_BIN_DIR": str(bin_dir), "ETCD_BIN": str(bin_dir / "etcd")}
    config, _ = configure([], env)
    assert config.k8s_bin == bin_dir.resolve()


def test_binaries_asked_for_and_missing_are_an_error_naming_them(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no kube-apiserver, kube-scheduler"):
        configure(["--k8s-bin", str(tmp_path)], {})
    with pytest.raises(UsageError, match=str(tmp_path)):
        configure([], {"GPUSHARE_K8S_BIN_DIR": str(tmp_path)})


def test_without_binaries_the_stand_in_runs_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the default ~/.cache/gpushare/k8s is empty
    config, note = configure([], {})
    assert config.k8s_bin is None
    assert note.startswith("no Kubernetes binaries (no kube-apiserver")
    assert note.endswith("using the API stand-in")


def test_stand_in_and_kubeconfig_start_no_control_plane(bin_dir: Path) -> None:
    env = {"GPUSHARE_K8S_BIN_DIR": str(bin_dir), "ETCD_BIN": str(bin_dir / "etcd")}
    assert configure(["--stand-in"], env)[0].k8s_bin is None
    config, _ = configure(["--kubeconfig", "/tmp/kc"], env)
    assert config.k8s_bin is None
    assert config.kubeconfig == Path("/tmp/kc")


@pytest.mark.parametrize("other", [["--stand-in"], ["--kubeconfig", "/tmp/kc"]])
def test_real_kubelets_need_the_control_plane_up_starts(other: list[str]) -> None:
    with pytest.raises(UsageError, match="--real-kubelet needs"):
        configure(["--real-kubelet", *other], {})


def test_real_kubelets_need_the_kubelet_and_its_runtime(bin_dir: Path) -> None:
    env = {"ETCD_BIN": str(bin_dir / "etcd")}
    with pytest.raises(UsageError, match="kubelet"):
        configure(["--k8s-bin", str(bin_dir), "--real-kubelet"], env)


def test_k8s_bin_stand_in_and_kubeconfig_exclude_each_other(bin_dir: Path) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--k8s-bin", str(bin_dir), "--stand-in"])


def test_the_description_says_which_kubelet_serves_each_node(tmp_path: Path) -> None:
    config, _ = configure(["--stand-in", "--node", "a=1000", "--node", "b=2000,2000"], {})
    stack = Stack(config, nats=NatsServer(tmp_path, port=4222), extender_ports=[39999])
    stack.kubelet_endpoints["b"] = KubeletEndpoints(tmp_path / "dp", tmp_path / "pr.sock")

    text = describe(stack)

    assert "a (1 cards, test kubelet), b (2 cards, real kubelet)" in text
    assert "the local API stand-in" in text


def test_found_binaries_report_their_version(bin_dir: Path) -> None:
    (bin_dir / "VERSION").write_text("v1.36.3\n")
    binaries = K8sBinaries.find(bin_dir, env={"ETCD_BIN": str(bin_dir / "etcd")})
    assert binaries.version == "v1.36.3"
    assert binaries.etcd == bin_dir / "etcd"
    assert os.access(binaries.path("kube-apiserver"), os.X_OK)
