"""Parsing the reporter's flags, and refusing bad ones with a message that says why."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpushare.reporter import __main__ as reporter_main
from gpushare.reporter import nvml as nvml_module
from gpushare.reporter.fixture import FixtureBackend
from gpushare.reporter.nvml import NvmlBackend
from gpushare.reporter.running import open_backends
from gpushare.reporter.settings import (
    ReporterSettings,
    SettingsError,
    SimulatedNode,
    parse_heartbeat,
    parse_simulated_node,
)
from gpushare.reporter.simulated import SimulatedBackend
from tests.unit.reporter.fakes import DGX1_FIXTURE, H100_FIXTURE, FakeNvml


def test_a_simulated_node_with_two_cards() -> None:
    assert parse_simulated_node("a=16276,16276") == SimulatedNode(
        name="a", cards_mib=(16276, 16276)
    )


def test_a_heterogeneous_node_with_a_dotted_name() -> None:
    node = parse_simulated_node("gpu-b.example.com=16276, 16276,32510")
    assert node == SimulatedNode(name="gpu-b.example.com", cards_mib=(16276, 16276, 32510))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu-a", "--node wants NAME=MIB"),
        ("gpu-a=", "--node wants NAME=MIB"),
        ("=16276", "the node name is empty"),
        ("GPU-A=16276", "is not a Kubernetes node name"),
        ("gpu_a=16276", "is not a Kubernetes node name"),
        ("gpu a=16276", "is not a Kubernetes node name"),
        ("gpu-a=16GiB", "card size '16GiB' is not a whole MiB number"),
        ("gpu-a=16276,,16276", "card size '' is not a whole MiB number"),
        ("gpu-a=0", "sizes must be positive"),
        ("gpu-a=-1", "sizes must be positive"),
        ("gpu-a=85520809984", "sizes are MiB, not bytes"),
    ],
)
def test_bad_node_values_are_refused_clearly(value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_simulated_node(value)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon", "7200"])
def test_bad_heartbeats_are_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="--heartbeat"):
        parse_heartbeat(value)


def settings_from(argv: list[str], environ: dict[str, str] | None = None) -> ReporterSettings:
    return reporter_main.parse_settings(argv, environ or {})


def test_flags_and_environment() -> None:
    settings = settings_from(
        ["--node", "a=1000", "--node", "b=2000,3000", "--heartbeat", "2.5"],
        {"GPUSHARE_NATS_URL": "nats://nats:4222", "NODE_NAME": "ignored-here"},
    )
    assert settings.nats_url == "nats://nats:4222"
    assert [node.name for node in settings.simulated_nodes] == ["a", "b"]
    assert settings.heartbeat_seconds == 2.5
    assert not settings.uses_nvml


def test_defaults_report_this_machine_through_nvml() -> None:
    settings = settings_from([], {"NODE_NAME": "worker-1"})
    assert settings.uses_nvml
    assert (settings.node_name, settings.nats_url) == ("worker-1", "nats://127.0.0.1:4222")
    assert settings.heartbeat_seconds == 5.0
    assert (settings.mps, settings.mps_pipe_directory) == ("auto", Path("/tmp/nvidia-mps"))
    assert settings.simulated_topology == "none"


def test_mps_from_the_environment_and_the_flag_over_it() -> None:
    environ = {"GPUSHARE_MPS": "On", "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia/mps"}
    settings = settings_from(["--node", "a=1000"], environ)
    assert (settings.mps, settings.mps_pipe_directory) == ("on", Path("/run/nvidia/mps"))
    settings = settings_from(["--node", "a=1000", "--mps", "off", "--mps-pipe-directory", "/x"])
    assert (settings.mps, settings.mps_pipe_directory) == ("off", Path("/x"))


def test_an_empty_mps_pipe_directory_variable_means_the_default() -> None:
    settings = settings_from(["--node", "a=1000"], {"CUDA_MPS_PIPE_DIRECTORY": ""})
    assert settings.mps_pipe_directory == Path("/tmp/nvidia-mps")


@pytest.mark.parametrize("topology", ["none", "nvlink-pairs", "nvswitch", "PCIe"])
def test_simulated_topologies(topology: str) -> None:
    settings = settings_from(["--node", "a=1000", "--topology", topology])
    assert settings.simulated_topology == topology.lower()


@pytest.fixture(autouse=True)
def no_logging_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() would point the root logger at this test's captured stderr, for good."""
    monkeypatch.setattr(reporter_main, "setup_logging", lambda service: None)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = reporter_main.main(argv)
    return code, capsys.readouterr().err


def test_main_refuses_a_bad_node_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["--node", "gpu-a=lots"], capsys)
    assert code == 2
    assert "argument --node: --node 'gpu-a=lots': card size 'lots' is not a whole MiB" in err


def test_main_refuses_an_unknown_mps_mode_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSHARE_MPS", "yes")
    code, err = run_main(["--node", "a=1000"], capsys)
    assert code == 2
    assert "argument --mps: --mps 'yes': give one of auto, on, off" in err


def test_main_refuses_an_unknown_topology(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["--node", "a=1000", "--topology", "mesh"], capsys)
    assert code == 2
    assert "--topology 'mesh': give one of none, nvlink-pairs, nvswitch, pcie" in err


def test_main_refuses_the_same_node_twice(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["--node", "a=1000", "--node", "a=2000"], capsys)
    assert code == 2
    assert err.strip() == "gpushare reporter: node a is given more than once"


def test_main_wants_a_node_name_for_a_fixture(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code, err = run_main(["--fixture", str(H100_FIXTURE)], capsys)
    assert code == 2
    assert "--fixture needs --node-name NAME (or NODE_NAME in the environment)" in err


def test_main_wants_a_node_name_for_nvml(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code, err = run_main([], capsys)
    assert code == 2
    assert "reporting this machine's GPUs needs --node-name" in err


def test_main_exits_clearly_when_nvml_cannot_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = FakeNvml.from_fixture()
    broken.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setattr(nvml_module, "load_nvml", lambda: broken)
    code, err = run_main(["--node-name", "worker-1"], capsys)
    assert code == 1
    assert "NVML could not initialise: Driver Not Loaded" in err
    assert "--simulate-if-no-gpu" in err


def test_main_exits_clearly_on_an_unreadable_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["--fixture", "/nonexistent/x.json", "--node-name", "n"], capsys)
    assert code == 1
    assert "/nonexistent/x.json: cannot read" in err


def test_simulate_if_no_gpu_falls_back_to_simulated_cards() -> None:
    broken = FakeNvml.from_fixture()
    broken.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    settings = settings_from(
        ["--node-name", "worker-1", "--simulate-if-no-gpu", "--simulated-cards", "8000,8000"]
    )
    backends = open_backends(settings, nvml=broken)
    backend = backends["worker-1"]
    assert isinstance(backend, SimulatedBackend)
    assert [card.memory_mib for card in backend.read_cards()] == [8000, 8000]


def test_simulated_nodes_get_the_topology_and_mps_flags() -> None:
    settings = settings_from(
        ["--node", "a=1000,1000", "--node", "b=1000,1000", "--topology", "pcie", "--mps", "on"]
    )
    for backend in open_backends(settings).values():
        assert [(link.a, link.b, link.path) for link in backend.read_links()] == [(0, 1, "PHB")]
        assert backend.mps_enabled()


def test_the_simulated_fallback_gets_the_topology_too() -> None:
    broken = FakeNvml.from_fixture()
    broken.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    argv = ["--node-name", "w", "--simulate-if-no-gpu", "--simulated-cards", "1,1"]
    backend = open_backends(settings_from([*argv, "--topology", "nvswitch"]), nvml=broken)["w"]
    assert [link.nvlinks for link in backend.read_links()] == [18]


def test_a_fixture_node_gets_the_mps_flag() -> None:
    argv = ["--fixture", str(DGX1_FIXTURE), "--node-name", "dgx", "--mps", "off"]
    backend = open_backends(settings_from(argv))["dgx"]
    assert isinstance(backend, FixtureBackend)
    assert len(backend.read_links()) == 28
    assert not backend.mps_enabled()


def test_an_nvml_node_gets_the_mps_flags(tmp_path: Path) -> None:
    argv = ["--node-name", "w", "--mps", "on", "--mps-pipe-directory", str(tmp_path)]
    backend = open_backends(settings_from(argv), nvml=FakeNvml.from_fixture())["w"]
    assert isinstance(backend, NvmlBackend)
    assert backend.mps_enabled()


def test_open_backends_one_per_node() -> None:
    settings = settings_from(
        ["--node", "a=1000", "--fixture", str(H100_FIXTURE), "--node-name", "h100-1"]
    )
    backends = open_backends(settings)
    assert {name: backend.source for name, backend in backends.items()} == {
        "a": "simulated",
        "h100-1": "fixture",
    }


@pytest.mark.parametrize("url", ["http://nats:4222", "nats://:4222", "nats://h:port", "nats"])
def test_a_nats_url_that_is_not_one_is_refused(url: str) -> None:
    with pytest.raises(SettingsError, match="is not a URL like nats://host:4222"):
        settings_from(["--node", "a=1000"], {"GPUSHARE_NATS_URL": url})


def test_several_nats_urls_are_fine() -> None:
    urls = "nats://n1:4222,nats://n2:4222, tls://n3:4222"
    settings = settings_from(["--node", "a=1000", "--nats", urls])
    assert settings.nats_url == "nats://n1:4222,nats://n2:4222,tls://n3:4222"
