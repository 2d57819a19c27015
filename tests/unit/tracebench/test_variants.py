"""The generated trace variants: their counts against the upstream files, determinism,
the bundled variants rebuilt from ``default``, and ``gpushare bench trace --family``."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from gpushare.tracebench import cli, variants
from gpushare.tracebench.trace import read_pods
from gpushare.tracebench.variants import (
    BUNDLED,
    GENERATED,
    UPSTREAM,
    Row,
    Stats,
    generate,
    read_rows,
    stats,
)

TRACE = cli.BUNDLED
pytestmark = pytest.mark.skipif(not TRACE.is_dir(), reason="no bundled trace (not a checkout)")


@pytest.fixture(scope="module")
def default() -> list[Row]:
    return read_rows(TRACE / variants.pod_file("default"))


@pytest.fixture(scope="module")
def gpuspec10() -> list[Row]:
    return read_rows(TRACE / variants.pod_file("gpuspec10"))


def assert_close(ours: Stats, theirs: Stats) -> None:
    """Rows within 1 % (and non-GPU pods within 1 %), pod shares within 0.5 points,
    request shares within 1.5 points, the total request within 2 %."""
    assert ours.rows == pytest.approx(theirs.rows, rel=0.01)
    assert ours.non_gpu == pytest.approx(theirs.non_gpu, rel=0.01)
    for name in ("sharing_of_gpu_pods", "multi_of_gpu_pods", "constrained_of_gpu_pods"):
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name), abs=0.005), name
    for name in ("sharing_of_request", "multi_of_request", "constrained_of_request"):
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name), abs=0.015), name
    assert ours.gpu_request == pytest.approx(theirs.gpu_request, rel=0.02)


def test_the_table_matches_the_bundled_files() -> None:
    for name in BUNDLED:
        assert_close(stats(read_rows(TRACE / variants.pod_file(name))), UPSTREAM[name])


@pytest.mark.parametrize("name", GENERATED)
def test_generated_variants_have_the_upstream_counts(
    name: str, default: list[Row], gpuspec10: list[Row]
) -> None:
    assert_close(stats(generate(name, default, gpuspec10)), UPSTREAM[name])


@pytest.mark.parametrize("name", ["cpu050", "gpushare40", "multigpu20"])
def test_the_bundled_variants_are_rebuilt_from_default(
    name: str, default: list[Row], gpuspec10: list[Row]
) -> None:
    bundled = stats(read_rows(TRACE / variants.pod_file(name)))
    for seed in (1, 2):
        assert_close(stats(generate(name, default, gpuspec10, seed=seed)), bundled)


def test_a_gpuspec10_drawn_afresh_looks_like_the_bundled_one(
    default: list[Row], gpuspec10: list[Row]
) -> None:
    weights = variants.spec_weights_of(gpuspec10)
    rows = variants.gpuspec_variant(default, 0.104, random.Random(5), 0.109, weights)
    assert_close(stats(rows), stats(gpuspec10))
    drawn = Counter(row["gpu_spec"] for row in rows if row["gpu_spec"])
    given = Counter(row["gpu_spec"] for row in gpuspec10 if row["gpu_spec"])
    assert sum(drawn.values()) == pytest.approx(sum(given.values()), abs=5)
    for spec in ("T4", "G2", "P100"):
        assert drawn[spec] / sum(drawn.values()) == pytest.approx(
            given[spec] / sum(given.values()), abs=0.05
        )
    moved = sum(1 for a, b in zip(rows, gpuspec10, strict=True) if a["gpu_spec"] != b["gpu_spec"])
    assert moved > 0


@pytest.mark.parametrize("name", ["gpuspec20", "gpuspec25", "gpuspec33"])
@pytest.mark.parametrize("seed", [variants.GENERATION_SEED, 1, 2])
def test_gpuspec_variants_constrain_the_upstream_shares(
    name: str, seed: int, default: list[Row]
) -> None:
    """COLUMNS.md's constrained shares: of GPU pods exactly (to a pod), of the GPU
    request within a point (the 8-GPU pods drawn move it by up to ~0.6)."""
    ours, theirs = stats(generate(name, default, seed=seed)), UPSTREAM[name]
    assert ours.constrained_of_gpu_pods == pytest.approx(theirs.constrained_of_gpu_pods, abs=0.001)
    assert ours.constrained_of_request == pytest.approx(theirs.constrained_of_request, abs=0.01)


def test_gpuspec_variants_are_drawn_afresh_with_the_upstream_specs(
    default: list[Row], gpuspec10: list[Row]
) -> None:
    """Not nested on gpuspec10 (upstream gpuspec33 keeps only 86 of the 239 constrained
    pods of gpuspec10 in its sample, the base rate); specs by shape class as upstream."""
    spec = generate("gpuspec33", default)
    assert [{**r, "gpu_spec": ""} for r in spec] == [{**r, "gpu_spec": ""} for r in default]
    before = [ours for ours, given in zip(spec, gpuspec10, strict=True) if given["gpu_spec"]]
    kept = sum(1 for row in before if row["gpu_spec"]) / len(before)
    assert kept == pytest.approx(0.338, abs=0.06)
    for shape, weights in variants.SPEC_WEIGHTS.items():
        drawn = Counter(
            row["gpu_spec"]
            for row in spec
            if row["gpu_spec"] and variants.shape_class(row) == shape and row["num_gpu"] != "8"
        )
        assert set(drawn) <= set(weights), shape
        if shape != "multi":
            share = drawn["T4"] / sum(drawn.values())
            assert share == pytest.approx(weights["T4"] / sum(weights.values()), abs=0.05)
    assert all(
        variants.EIGHT_CARD_MODELS & set(row["gpu_spec"].split("|"))
        for row in spec
        if row["gpu_spec"] and row["num_gpu"] == "8"
    )


def test_generation_is_deterministic_per_seed(default: list[Row], gpuspec10: list[Row]) -> None:
    for name in GENERATED:
        assert generate(name, default, gpuspec10) == generate(name, default, gpuspec10), name
        if not name.startswith("cpu2"):  # every non-GPU pod of default is in cpu200/250
            assert generate(name, default, gpuspec10, seed=1) != generate(
                name, default, gpuspec10, seed=2
            ), name


def test_each_family_keeps_what_the_method_keeps(default: list[Row], gpuspec10: list[Row]) -> None:
    def shape(row: Row) -> tuple[str, ...]:
        return (row["cpu_milli"], row["memory_mib"], row["num_gpu"], row["gpu_milli"])

    default_gpu = [shape(row) for row in default if variants.is_gpu(row)]
    cpu = generate("cpu200", default, gpuspec10)
    assert [shape(row) for row in cpu if variants.is_gpu(row)] == default_gpu
    assert len({row["name"] for row in cpu}) == len(cpu)

    share = generate("gpushare60", default, gpuspec10)
    assert [shape(r) for r in share if not variants.is_gpu(r)] == [
        shape(r) for r in default if not variants.is_gpu(r)
    ]
    assert stats(generate("gpushare100", default, gpuspec10)).sharing_of_gpu_pods == 1

    spec = generate("gpuspec20", default, gpuspec10)
    assert [{**r, "gpu_spec": ""} for r in spec] == [{**r, "gpu_spec": ""} for r in default]

    multi = generate("multigpu40", default, gpuspec10)
    assert [r["name"] for r in multi[: len(default)]] == [r["name"] for r in default]
    added = multi[len(default) :]
    assert added[0]["name"] == "openb-pod-8152"
    assert set(added[0]) == set(variants.MULTIGPU_COLUMNS)
    shapes = {shape(row) for row in default if variants.is_multi(row)}
    assert all(shape(row) in shapes for row in added)


def test_variant_names_and_targets() -> None:
    assert variants.target("cpu100") == ("cpu", pytest.approx(789 / 7853))
    assert variants.target("gpushare20") == ("gpushare", 0.2)
    assert variants.target("multigpu60") == ("multigpu", 0.6)
    with pytest.raises(ValueError, match="not a variant"):
        variants.target("gpufoo")
    assert len(variants.FAMILIES) == 17
    assert set(cli.PUBLISHED) == set(variants.FAMILIES)


def test_written_variants_read_back_as_pods(tmp_path: Path) -> None:
    written = variants.write_all(TRACE, tmp_path, names=("gpuspec25", "multigpu30"))
    for name, measured in written.items():
        pods = read_pods(tmp_path / variants.pod_file(name))
        assert len(pods) == measured.rows
        assert sum(p.gpu_request_milli for p in pods) == pytest.approx(measured.gpu_request * 1000)
    constrained = [p for p in read_pods(tmp_path / variants.pod_file("gpuspec25")) if p.gpu_spec]
    assert len(constrained) == round(0.249 * 7064)


NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,16000,32768,1,P100\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "p0,4000,1024,1,500,\n"
    "p1,4000,1024,1,500,T4\n"
    "p2,2000,1024,1,1000,\n"
    "p3,1000,1024,0,0,\n"
    "p4,4000,1024,2,1000,\n"
    "p5,4000,1024,1,250,\n"
)


def test_the_family_command_prints_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / cli.NODES_FILE).write_text(NODES)
    (tmp_path / variants.pod_file("default")).write_text(PODS)
    (tmp_path / variants.pod_file("gpuspec10")).write_text(PODS)
    argv = ["trace", "--trace-dir", str(tmp_path), "--family", "default,cpu100,gpuspec20"]
    argv += ["--policy", "fragmentation,fgd", "--seeds", "1", "--workers", "1"]
    assert cli.main([*argv, "--json", "--variants-dir", str(tmp_path / "out")]) == 0
    out = json.loads(capsys.readouterr().out)["families"]
    assert list(out) == ["default", "cpu100", "gpuspec20"]
    assert [row["generated"] for row in out.values()] == [False, True, True]
    assert (tmp_path / "out" / variants.pod_file("cpu100")).is_file()
    row = out["default"]
    assert set(row["policies"]) == {"fragmentation", "fgd"}
    assert row["published"]["FGD"] == {"mean": 4.77, "sd": 0.10}
    assert set(row["difference_to_fgd_pct"]) == {"fragmentation", "fgd"}
    assert "gap_to_bound_pp" in row
    assert row["stats"]["rows"] == 6
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "gap to bound" in table
    assert "gpuspec20" in table
    assert "generated" in table
    with pytest.raises(SystemExit):
        cli.main([*argv, "--pods", str(tmp_path / variants.pod_file("default"))])
    with pytest.raises(SystemExit):
        cli.main(["trace", "--trace-dir", str(tmp_path), "--family", "nope"])
    assert "unknown trace" in capsys.readouterr().err
