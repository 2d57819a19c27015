"""The trace harness: reading the CSVs, FGD's protocol, the replay, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.core.policies import standard_policies
from gpushare.core.policies.fragmentation import FGDPolicy, FragmentationPolicy, Workload
from gpushare.core.requests import ContainerRequest
from gpushare.tracebench import cli
from gpushare.tracebench.protocol import Curve, arrivals
from gpushare.tracebench.replay import replay
from gpushare.tracebench.trace import TraceError, TraceNode, TracePod, read_nodes, read_pods

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,16000,32768,1,P100\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "p0,4000,1024,1,500,\n"
    "p1,4000,1024,1,500,T4\n"
    "p2,2000,1024,1,1000,\n"
    "p3,1000,1024,0,0,\n"
    "p4,4000,1024,2,1000,\n"
    "p5,4000,1024,1,250,P100|P100\n"
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_reads_nodes_and_pods(files: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(files[0]), read_pods(files[1])
    assert nodes[0] == TraceNode(name="n0", cpu_milli=32000, memory_mib=65536, gpus=2, model="T4")
    assert [p.gpu_request_milli for p in pods] == [500, 500, 1000, 0, 2000, 250]
    assert pods[5].gpu_spec == ("P100",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("name,cpu_milli\n", "missing column", id="columns"),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,0,0\n", "not a whole", id="int"
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n", "gpu_milli 0", id="zero"
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n",
            "share of several",
            id="multi-share",
        ),
        pytest.param("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods", id="empty"),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,-1,1,0,0\n", "negative", id="negative"
        ),
    ],
)
def test_bad_pod_lists_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_pods(path)
    with pytest.raises(TraceError, match="No such file"):
        read_pods(tmp_path / "absent.csv")


def test_trace_pods_become_the_requests_the_extender_reads() -> None:
    share = TracePod(
        name="s", cpu_milli=1, memory_mib=2, num_gpu=1, gpu_milli=470, gpu_spec=("T4",)
    )
    whole = TracePod(name="w", cpu_milli=1, memory_mib=2, num_gpu=4, gpu_milli=1000)
    none = TracePod(name="c", cpu_milli=1, memory_mib=2, num_gpu=0, gpu_milli=0)
    assert share.request().containers == (
        ContainerRequest(container="main", core_percent=47, memory_ratio=47),
    )
    assert share.request().models == ("T4",)
    assert whole.request().containers == (
        ContainerRequest(container="main", cards=4, exclusive=True),
    )
    assert none.request().containers == ()
    assert (none.request().cpu_milli, none.request().host_memory_mib) == (1, 2)


def test_arrivals_shuffle_by_seed_then_inflate_with_replacement(files: tuple[Path, Path]) -> None:
    pods = read_pods(files[1])
    capacity = 3000
    first, again, other = (arrivals(pods, s, capacity) for s in (42, 42, 43))
    assert first == again
    assert first != other
    assert sum(p.gpu_request_milli for p in first) <= 1.3 * capacity  # tuned down: 4250 > 3900
    assert set(first) <= set(pods)
    grown = arrivals(pods, 42, 10_000)
    assert sorted(p.name for p in grown[: len(pods)]) == sorted(p.name for p in pods)
    assert 13_000 - 2000 < sum(p.gpu_request_milli for p in grown) <= 13_000
    assert set(grown[len(pods) :]) <= set(pods)


def test_curve_levels_use_exact_then_neighbouring_points() -> None:
    curve = Curve(capacity_milli=1000)
    for arrived, allocated in [(500, 500), (950, 900), (960, 900), (1000, 940), (1300, 950)]:
        curve.record(arrived, allocated)
    assert curve.allocation_at(95) == pytest.approx(90.0)
    assert curve.unallocated_at(100) == pytest.approx(6.0)
    assert curve.allocation_at(99) == pytest.approx(94.0)  # none at 99: the ±1 neighbours
    assert curve.allocation_at(120) is None


def test_replay_places_by_the_core_and_never_oversubscribes(files: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(files[0]), read_pods(files[1])
    workload = Workload.typical((p.task_class for p in pods), coverage=1.0)
    for policy in [
        FGDPolicy(workload),
        FragmentationPolicy(workload),
        *standard_policies().values(),
    ]:
        result = replay(nodes, pods, policy, tie_seed=1)
        # p0, p1 share n0's card 0 or take both cards; p2 needs a whole card; p4 needs two;
        # p5 only fits the P100; nothing can hold more than the 3000 milli there is
        assert result.curve.allocated[-1] <= 3000
        assert result.placed + result.failed == len(pods)
        assert all(
            b >= a for a, b in zip(result.curve.allocated, result.curve.allocated[1:], strict=False)
        )


def test_replay_is_deterministic_for_a_seed(files: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(files[0]), read_pods(files[1])
    workload = Workload.typical(p.task_class for p in pods)
    runs = [
        replay(nodes, arrivals(pods, 7, 3000), FGDPolicy(workload), tie_seed=7) for _ in range(2)
    ]
    assert runs[0].curve == runs[1].curve


def test_command_prints_json_per_policy(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["trace", "--nodes", str(files[0]), "--pods", str(files[1]), "--policy", "all"]
    assert cli.main([*argv, "--seeds", "1-2", "--json", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"fragmentation", "fgd", "bestfit", "binpack", "spread", "topology"}
    for row in out.values():
        assert set(row["unallocated_pct_at"]) == {"95", "100", "130"}
        assert row["pods_per_second"] > 0
        assert row["seeds"] == [1, 2]


def test_command_prints_a_table_and_rejects_bad_input(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["trace", "--nodes", str(files[0]), "--pods", str(files[1]), "--workers", "1"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "fragmentation" in captured.out
    assert "unallocated at 100 %" in captured.err
    with pytest.raises(SystemExit):
        cli.main([*argv, "--policy", "nope"])
    assert "unknown policy 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*argv, "--seeds", "x"])


@pytest.mark.slow
def test_the_bundled_trace_reproduces_the_published_fgd_and_ours_beats_it() -> None:
    """Seed 42 of the default pod list: FGD lands on the artifact's 4.86 % (±0.2)."""
    nodes, pods = read_nodes(cli.DEFAULT_NODES), read_pods(cli.DEFAULT_PODS)
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1213, 6212)
    order = arrivals(pods, 42, 6_212_000)
    workload = Workload.typical(p.task_class for p in pods)
    fgd = replay(nodes, order, FGDPolicy(workload), tie_seed=42).curve.unallocated_at(100)
    ours = replay(nodes, order, FragmentationPolicy(workload), tie_seed=42).curve.unallocated_at(
        100
    )
    assert fgd is not None
    assert ours is not None
    assert abs(fgd - 4.86) <= 0.2
    assert ours < 4.5 < fgd
