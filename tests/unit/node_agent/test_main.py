"""The node agent's command line: which nodes, which sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare.embedded.kubelet import main as kubelet_main
from gpushare.node_agent.__main__ import main, parse_settings
from gpushare.node_agent.settings import DEVICE_PLUGIN_PATH, NodeTarget, parse_targets
from gpushare.settings_spec import SettingsError


def test_one_node_per_flag_with_its_plugin_dir() -> None:
    targets = parse_targets(["a=/tmp/a/device-plugins", "b=/tmp/b/device-plugins"], [])
    assert [t.name for t in targets] == ["a", "b"]
    assert targets[0].plugin_socket == Path("/tmp/a/device-plugins/gpushare-gpu-mem.sock")
    assert targets[0].kubelet_socket == Path("/tmp/a/device-plugins/kubelet.sock")
    assert targets[1].pod_resources == Path("/tmp/b/pod-resources/kubelet.sock")


def test_node_name_from_the_environment() -> None:
    (target,) = parse_settings([], {"NODE_NAME": "gpu-7"}).targets
    assert target == NodeTarget(name="gpu-7", plugin_dir=DEVICE_PLUGIN_PATH)
    assert target.pod_resources == Path("/var/lib/kubelet/pod-resources/kubelet.sock")


def test_pod_resources_socket_for_all_or_one_node() -> None:
    targets = parse_targets(["a=/x/a", "b=/x/b"], ["/run/pr.sock", "b=/run/b.sock"])
    assert [t.pod_resources for t in targets] == [Path("/run/pr.sock"), Path("/run/b.sock")]


@pytest.mark.parametrize("nodes", [[], ["=/x"], ["a=/x", "a=/y"]])
def test_bad_node_flags_are_refused(nodes: list[str]) -> None:
    with pytest.raises(SettingsError, match="node"):
        parse_targets(nodes, [])


def test_flags_fall_back_to_the_environment() -> None:
    environ = {"GPUSHARE_NATS_URL": "nats://elsewhere:4222", "GPUSHARE_MEMORY_UNIT": "GiB"}
    settings = parse_settings(["--node", "a"], environ)
    assert settings.nats_url == "nats://elsewhere:4222"
    assert settings.memory_unit == "GiB"
    assert parse_settings(["--node", "a", "--memory-unit", "MiB"], environ).memory_unit == "MiB"


@pytest.mark.parametrize(
    "argv", [["--node", "=nowhere"], ["--node", "a=/x", "--node", "a=/y"]], ids=["empty", "twice"]
)
def test_bad_command_lines_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "node" in capsys.readouterr().err


def test_kubelet_wants_its_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubelet_main([]) == 2
    assert kubelet_main(["--node", "n1"]) == 2
    assert "NAME=" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "environment", "expected"),
    [
        pytest.param(
            [],
            "",
            (
                "aliyun.com/gpu-mem",
                "gpushare.io/gpu-memory-ratio",
                "gpushare.io/gpu",
                "gpushare.io/gpu-core",
            ),
            id="default: aliyun and gpushare",
        ),
        pytest.param(["aliyun"], "vke", ("aliyun.com/gpu-mem",), id="flags win"),
        pytest.param(
            [],
            "aliyun, vke",
            (
                "aliyun.com/gpu-mem",
                "vke.volcengine.com/mgpu-memory",
                "vke.volcengine.com/mgpu-core",
            ),
            id="from the environment",
        ),
    ],
)
def test_dialects(flags: list[str], environment: str, expected: tuple[str, ...]) -> None:
    argv = ["--node", "a", *(arg for flag in flags for arg in ("--dialect", flag))]
    settings = parse_settings(argv, {"GPUSHARE_DIALECTS": environment})
    assert settings.resources == expected


def test_an_unknown_dialect_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--node", "a=/x", "--dialect", "hami"]) == 2
    assert "unknown dialect 'hami'" in capsys.readouterr().err
