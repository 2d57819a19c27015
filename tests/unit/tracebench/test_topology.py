"""NVLink topologies for the trace's 8-card nodes, and what the replay makes of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.core.model import Card
from gpushare.core.policies.fragmentation import Workload
from gpushare.core.policies.workload import workload_policy
from gpushare.core.view import affinity_matrix
from gpushare.reporter.recording import load_recording
from gpushare.reporter.topology import links_from_records
from gpushare.tracebench import cli
from gpushare.tracebench.replay import replay
from gpushare.tracebench.topology import topology_affinity, with_topology
from gpushare.tracebench.trace import TraceNode, TracePod
from tests.unit.reporter.fakes import DGX1_FIXTURE

NODES = (
    TraceNode(name="big", cpu_milli=96000, memory_mib=393216, gpus=8, model="V100M32"),
    TraceNode(name="small", cpu_milli=32000, memory_mib=65536, gpus=2, model="T4"),
)


def test_dgx1_is_the_fixture_s_matrix() -> None:
    recording = load_recording(DGX1_FIXTURE)
    links = links_from_records(recording.devices, recording.topology)
    cards = tuple(
        Card(index=device.index, uuid=str(device.index), model="V100", memory_mib=1)
        for device in recording.devices
    )
    assert topology_affinity("dgx1") == affinity_matrix(cards, links)


def test_only_8_card_nodes_get_a_topology() -> None:
    dgx1 = with_topology(NODES, "dgx1")
    assert len(dgx1[0].affinity) == 8
    assert dgx1[1].affinity == ()
    assert with_topology(NODES, "none") == NODES
    assert {value for row in topology_affinity("nvswitch") for value in row} == {0, 78}
    with pytest.raises(ValueError, match="unknown topology"):
        topology_affinity("torus")


def pods() -> list[TracePod]:
    """Six half-card pods, then a 4-card and a 2-card pod."""
    return [
        *(
            TracePod(name=f"s{i}", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=500)
            for i in range(6)
        ),
        TracePod(name="quad", cpu_milli=4000, memory_mib=1024, num_gpu=4, gpu_milli=1000),
        TracePod(name="pair", cpu_milli=4000, memory_mib=1024, num_gpu=2, gpu_milli=1000),
    ]


@pytest.mark.parametrize(("topology", "linked"), [("dgx1", 2), ("nvswitch", 2), ("none", 0)])
def test_the_default_gives_multi_card_pods_nvlinked_cards(topology: str, linked: int) -> None:
    arrivals = pods()
    workload = Workload.typical((p.task_class for p in arrivals), coverage=1.0)
    result = replay(
        with_topology(NODES, topology),
        arrivals,
        workload_policy("fragmentation", workload),
        tie_seed=3,
    )
    assert result.failed == 0
    assert result.linked_nodes_multi_card == linked
    assert result.fully_nvlinked == linked


def test_command_reports_the_nvlinked_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pod_list = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}\n" for n in NODES)
    )
    pod_list.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(
            f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli}\n" for p in pods()
        )
    )
    argv = ["trace", "--nodes", str(nodes), "--pods", str(pod_list), "--workers", "1", "--json"]
    assert cli.main([*argv, "--topology", "dgx1", "--policy", "fragmentation"]) == 0
    row = json.loads(capsys.readouterr().out)["fragmentation"]
    assert row["fully_nvlinked_pct_of_multi_card"] == 100.0
    assert cli.main([*argv, "--policy", "fragmentation"]) == 0
    assert (
        "fully_nvlinked_pct_of_multi_card"
        not in json.loads(capsys.readouterr().out)["fragmentation"]
    )
