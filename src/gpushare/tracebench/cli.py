"""``gpushare bench trace``: replay an Alibaba-format trace under FGD's protocol.

Prints, per policy, the unallocated GPU % at 95, 100 and 130 % arrived demand (mean ±
sd over the seeds), the GPU allocation ratio at 100 %, and placements per second;
``--json`` prints one object keyed by policy instead. Seeds run in parallel worker
processes; progress goes to stderr.

``--family NAME[,NAME]|all`` replays the paper's traces instead (``all``: its 17): a pod
list the trace folder lacks is generated from its ``default`` (``variants``). One table
shows, per trace, each ``--policy`` (a comma-separated list) at 100 % arrived, the
published FGD and BestFit (``PUBLISHED``), each policy's difference to FGD in %, the lower
bound of ``bound.unallocated_bound`` (mean over the seeds) and the first policy's gap to it.

The trace (``openb_node_list_gpu_node.csv`` and the ``openb_pod_list_*.csv`` files of
alibaba/clusterdata ``cluster-trace-gpu-v2023/csv/``, 2.5 MB) is not in the wheel: it is
read from ``--trace-dir DIR``, else ``GPUSHARE_TRACE_DIR``, else the source tree's
``benchmarks/traces/alibaba-gpu-v2023`` (a checkout; ``make bench-trace``). ``--nodes`` and
``--pods`` name files anywhere instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from os import cpu_count
from pathlib import Path

from gpushare.tracebench.bound import unallocated_bound
from gpushare.tracebench.policies import build, policy_names, resolve
from gpushare.tracebench.protocol import LEVELS, arrivals
from gpushare.tracebench.replay import replay
from gpushare.tracebench.topology import TOPOLOGIES, with_topology
from gpushare.tracebench.trace import TraceError, read_nodes, read_pods
from gpushare.tracebench.variants import FAMILIES, GENERATION_SEED, materialise, read_rows, stats

BUNDLED = Path(__file__).resolve().parents[3] / "benchmarks" / "traces" / "alibaba-gpu-v2023"
"""The trace in a source checkout (``src/gpushare/tracebench`` -> the repository root);
an installed wheel has no such folder."""
TRACE_DIR_VARIABLE = "GPUSHARE_TRACE_DIR"
NODES_FILE = "openb_node_list_gpu_node.csv"
PODS_FILE = "openb_pod_list_default.csv"
DEFAULT_NODES = BUNDLED / NODES_FILE
DEFAULT_PODS = BUNDLED / PODS_FILE
TRACE_SOURCE = "alibaba/clusterdata, cluster-trace-gpu-v2023/csv/"

PUBLISHED: dict[str, dict[str, tuple[float, float]]] = {
    name: {"FGD": (fgd, fgd_sd), "BestFit": (best, best_sd)}
    for name, (fgd, fgd_sd, best, best_sd) in {
        "default": (4.77, 0.10, 7.14, 0.14),
        "cpu050": (5.00, 0.11, 6.44, 0.12),
        "cpu100": (4.79, 0.13, 6.74, 0.12),
        "cpu200": (5.18, 0.15, 7.85, 0.20),
        "cpu250": (6.80, 0.27, 8.79, 0.24),
        "gpushare40": (6.04, 0.07, 8.56, 0.19),
        "gpushare60": (8.75, 0.12, 10.94, 0.17),
        "gpushare80": (10.92, 0.10, 13.34, 0.23),
        "gpushare100": (13.36, 0.15, 15.38, 0.21),
        "gpuspec10": (5.34, 0.18, 6.90, 0.20),
        "gpuspec20": (5.34, 0.13, 11.54, 0.12),
        "gpuspec25": (6.09, 0.10, 14.33, 0.19),
        "gpuspec33": (12.16, 0.17, 19.61, 0.26),
        "multigpu20": (4.47, 0.15, 6.27, 0.24),
        "multigpu30": (3.64, 0.09, 5.43, 0.22),
        "multigpu40": (3.09, 0.10, 4.90, 0.22),
        "multigpu50": (2.91, 0.10, 4.38, 0.17),
    }.items()
}
"""Unallocated GPU % at 100 % arrived, (mean, population sd) over seeds 42-51, of FGD and
BestFit on the paper's 17 traces: the authors' artifact results
(``experiments/analysis/expected_results/analysis_allo_discrete.csv``; FGD.md §4.3)."""
PUBLISHED_FGD = {name: row["FGD"][0] for name, row in PUBLISHED.items()}
"""FGD's unallocated GPU % at 100 % arrived, mean of seeds 42-51 (the authors' artifact)."""


@dataclass(frozen=True)
class SeedResult:
    policy: str
    seed: int
    unallocated: dict[str, float | None]
    allocation_at_100: float | None
    pods: int
    failed: int
    seconds: float
    multi_card: int = 0
    """Multi-card pods placed on nodes with links (``--topology``) ..."""
    fully_nvlinked: int = 0
    """... and those whose cards are NVLinked pair by pair."""


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42``, ``42-51`` or ``42,45,50``."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first = int(low)
            seeds.extend(range(first, int(high) + 1) if high else [first])
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: use 42, 42-51 or 42,43") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds")
    return tuple(dict.fromkeys(seeds))


def _run_one(
    nodes_path: str, pods_path: str, policy_name: str, seed: int, topology: str = "none"
) -> SeedResult:
    nodes = with_topology(read_nodes(Path(nodes_path)), topology)
    pods = read_pods(Path(pods_path))
    capacity = sum(node.gpus for node in nodes) * 1000
    order = arrivals(pods, seed, capacity)
    result = replay(nodes, order, build(policy_name, pods, nodes), tie_seed=seed)
    return SeedResult(
        policy=policy_name,
        seed=seed,
        unallocated={level: result.curve.unallocated_at(int(level)) for level in LEVELS},
        allocation_at_100=result.curve.allocation_at(100),
        pods=len(order),
        failed=result.failed,
        seconds=result.seconds,
        multi_card=result.linked_nodes_multi_card,
        fully_nvlinked=result.fully_nvlinked,
    )


def _bound_one(nodes_path: str, pods_path: str, seed: int) -> tuple[int, float | None]:
    """``bound.unallocated_bound`` on this seed's arrival order: the lower bound on the
    unallocated GPU % at 100 % arrived that no placement policy beats."""
    nodes = read_nodes(Path(nodes_path))
    pods = read_pods(Path(pods_path))
    capacity = sum(node.gpus for node in nodes) * 1000
    return seed, unallocated_bound(nodes, arrivals(pods, seed, capacity)).unallocated


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _sd(values: Sequence[float | None]) -> float:
    known = [v for v in values if v is not None]
    return statistics.pstdev(known) if len(known) > 1 else 0.0


def summarise(results: Sequence[SeedResult]) -> dict[str, dict[str, object]]:
    """The ``--json`` object: a key per policy."""
    summary: dict[str, dict[str, object]] = {}
    for name in dict.fromkeys(r.policy for r in results):
        runs = [r for r in results if r.policy == name]
        pods = sum(r.pods for r in runs)
        seconds = sum(r.seconds for r in runs)
        summary[name] = {
            "unallocated_pct_at": {
                level: _round(_mean([r.unallocated[level] for r in runs])) for level in LEVELS
            },
            "unallocated_sd_at": {
                level: round(_sd([r.unallocated[level] for r in runs]), 3) for level in LEVELS
            },
            "allocation_ratio_pct_at_100": _round(_mean([r.allocation_at_100 for r in runs])),
            "pods_per_second": round(pods / seconds, 1) if seconds else None,
            "seeds": [r.seed for r in runs],
            "unallocated_pct_at_100_per_seed": {
                str(r.seed): _round(r.unallocated["100"]) for r in runs
            },
        }
        multi = sum(r.multi_card for r in runs)
        if multi:
            linked = sum(r.fully_nvlinked for r in runs)
            summary[name]["fully_nvlinked_pct_of_multi_card"] = round(linked / multi * 100, 1)
    return summary


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def render(summary: dict[str, dict[str, object]], pods_path: Path, seeds: Sequence[int]) -> str:
    family = pods_path.stem.removeprefix("openb_pod_list_")
    lines = [
        f"trace {pods_path.name}, seeds {', '.join(map(str, seeds))}: unallocated GPU % at "
        "arrived demand (mean ± sd), allocation at 100 %, placements per second",
        f"{'policy':<28} {'@95':>13} {'@100':>13} {'@130':>13} {'alloc@100':>10} {'pods/s':>9}",
    ]
    for name, row in summary.items():
        at = row["unallocated_pct_at"]
        sd = row["unallocated_sd_at"]
        assert isinstance(at, dict)
        assert isinstance(sd, dict)
        cells = [
            "n/a" if at[level] is None else f"{at[level]:6.2f} ± {sd[level]:4.2f}"
            for level in LEVELS
        ]
        allocation = row["allocation_ratio_pct_at_100"]
        shown = "n/a" if allocation is None else f"{allocation:.2f}"
        lines.append(
            f"{name:<28} {cells[0]:>13} {cells[1]:>13} {cells[2]:>13} {shown:>10} "
            f"{row['pods_per_second']!s:>9}"
        )
    for name, row in summary.items():
        if "fully_nvlinked_pct_of_multi_card" in row:
            lines.append(
                f"{name}: {row['fully_nvlinked_pct_of_multi_card']} % of multi-card pods on "
                "linked nodes got cards NVLinked pair by pair"
            )
    published = PUBLISHED_FGD.get(family)
    if published is not None:
        lines.append(
            f"published FGD (ATC '23) on {family}, seeds 42-51: {published:.2f} % at 100 %"
        )
    return "\n".join(lines)


def _relative(ours: float | None, published: float | None) -> float | None:
    if ours is None or published is None:
        return None
    return round((ours - published) / published * 100, 1)


def summarise_family(
    name: str,
    pods_path: Path,
    generated: bool,
    results: Sequence[SeedResult],
    bounds: Sequence[float | None],
) -> dict[str, object]:
    """One family's ``--json`` object: its pod list, every policy's summary, the published
    FGD and BestFit, each policy's difference to FGD, and the lower bound with the gap."""
    policies = summarise(results)
    published = PUBLISHED.get(name, {})
    fgd = published["FGD"][0] if "FGD" in published else None
    bound = _round(_mean(bounds))
    at_100: dict[str, float | None] = {}
    for policy, row in policies.items():
        at = row["unallocated_pct_at"]
        assert isinstance(at, dict)
        at_100[policy] = at["100"]
    return {
        "pods": str(pods_path),
        "generated": generated,
        "stats": asdict(stats(read_rows(pods_path))),
        "policies": policies,
        "unallocated_pct_at_100": at_100,
        "published": {policy: {"mean": mean, "sd": sd} for policy, (mean, sd) in published.items()},
        "difference_to_fgd_pp": {
            policy: None if value is None or fgd is None else round(value - fgd, 3)
            for policy, value in at_100.items()
        },
        "difference_to_fgd_pct": {
            policy: _relative(value, fgd) for policy, value in at_100.items()
        },
        "bound_pct": bound,
        "bound_per_seed": list(bounds),
        "gap_to_bound_pp": {
            policy: None if value is None or bound is None else round(value - bound, 3)
            for policy, value in at_100.items()
        },
    }


def render_families(
    summary: Mapping[str, Mapping[str, object]],
    policies: Sequence[str],
    seeds: Sequence[int],
) -> str:
    """One table: a row per family, unallocated GPU % at 100 % arrived."""
    first = policies[0]
    head = [f"{'family':<12}", f"{'list':<9}"]
    head += [f"{name[:13]:>13}" for name in policies]
    head += [f"{'FGD (pub)':>9}", f"{'BestFit (pub)':>13}"]
    head += [f"{'Δ% ' + name[:13]:>16}" for name in policies]
    head += [f"{'bound':>6}", f"{'gap to bound':>12}"]
    lines = [
        f"unallocated GPU % at 100 % arrived, mean of seeds {', '.join(map(str, seeds))} "
        f"(published: the FGD artifact, seeds 42-51; Δ% = (ours − FGD) / FGD; "
        f"gap to bound: {first} − bound, in points)",
        " ".join(head),
    ]
    for name, row in summary.items():
        at = row["unallocated_pct_at_100"]
        published = row["published"]
        relative = row["difference_to_fgd_pct"]
        gap = row["gap_to_bound_pp"]
        assert isinstance(at, dict)
        assert isinstance(published, dict)
        assert isinstance(relative, dict)
        assert isinstance(gap, dict)
        cells = [f"{name:<12}", f"{'generated' if row['generated'] else 'file':<9}"]
        cells += [f"{_shown(at.get(policy)):>13}" for policy in policies]
        cells += [
            f"{_shown(published[key]['mean'] if key in published else None):>{width}}"
            for key, width in (("FGD", 9), ("BestFit", 13))
        ]
        cells += [
            f"{'n/a' if relative.get(p) is None else format(relative[p], '+.1f'):>16}"
            for p in policies
        ]
        bound = row["bound_pct"]
        cells.append(f"{_shown(bound if isinstance(bound, float) else None):>6}")
        cells.append(f"{_shown(gap.get(first)):>12}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def trace_dir(given: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """``--trace-dir``, else ``GPUSHARE_TRACE_DIR``, else the checkout's when it exists."""
    environ = os.environ if environ is None else environ
    if given is not None:
        return given
    if environ.get(TRACE_DIR_VARIABLE):
        return Path(environ[TRACE_DIR_VARIABLE])
    return BUNDLED if BUNDLED.is_dir() else None


def trace_files(
    given_dir: Path | None,
    nodes: Path | None,
    pods: Path | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Path, Path]:
    """The node and pod lists to replay; ``TraceError`` saying which flag to use when the
    trace is not there."""
    directory = trace_dir(given_dir, environ)
    wanted = (nodes, pods)
    if directory is not None:
        wanted = (nodes or directory / NODES_FILE, pods or directory / PODS_FILE)
    found = [path for path in wanted if path is not None]
    missing = [str(path) for path in found if not path.is_file()]
    if len(found) < 2 or missing:
        where = ", ".join(missing) if missing else "no trace folder (this is not a checkout)"
        raise TraceError(
            f"no trace data: {where}; pass --trace-dir DIR (a copy of {TRACE_SOURCE}: "
            f"{NODES_FILE} and the openb_pod_list_*.csv files) or --nodes FILE --pods FILE"
        )
    return found[0], found[1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare bench trace",
        description="Replay an Alibaba-format GPU trace through gpushare's placement core "
        "under the FGD paper's protocol.",
    )
    parser.add_argument(
        "--trace-dir",
        type=Path,
        metavar="DIR",
        help=f"the trace's folder (a copy of {TRACE_SOURCE}; default: {TRACE_DIR_VARIABLE}, "
        "else benchmarks/traces/alibaba-gpu-v2023 of a source checkout)",
    )
    parser.add_argument("--nodes", type=Path, help=f"node list CSV (default: DIR/{NODES_FILE})")
    parser.add_argument("--pods", type=Path, help=f"pod list CSV (default: DIR/{PODS_FILE})")
    parser.add_argument(
        "--family",
        metavar="NAME",
        help="replay these traces instead of --pods: a name (default, cpu100, gpuspec33, …), "
        "a comma-separated list, or 'all' (the paper's 17). A list not in DIR is generated "
        "from DIR's default (and gpuspec10) by gpushare.tracebench.variants; one table "
        "compares each with the published FGD and the lower bound",
    )
    parser.add_argument(
        "--variant-seed",
        type=int,
        default=GENERATION_SEED,
        help=f"seed of the generated pod lists (default {GENERATION_SEED})",
    )
    parser.add_argument(
        "--variants-dir",
        type=Path,
        metavar="DIR",
        help="write the generated pod lists here (default: a temporary folder)",
    )
    parser.add_argument(
        "--policy",
        default="default",
        help="a policy name, a comma-separated list, 'default' (the cluster default) or "
        "'all': " + ", ".join(policy_names()),
    )
    parser.add_argument("--seeds", type=parse_seeds, default=(42,), help="42, 42-51 or 42,43")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--workers", type=int, default=min(cpu_count() or 1, 4), help="parallel replays"
    )
    parser.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default="none",
        help="NVLink links for every 8-card node (the trace has none): dgx1 (a DGX-1's "
        "hybrid cube-mesh), nvswitch (every pair NVLinked) or none (default)",
    )
    return parser


def resolve_policies(text: str) -> tuple[str, ...]:
    """``--policy``: one choice or a comma-separated list of them."""
    names: list[str] = []
    for part in text.split(","):
        names.extend(resolve(part.strip()))
    return tuple(dict.fromkeys(names))


def family_names(text: str) -> tuple[str, ...]:
    if text.strip() == "all":
        return FAMILIES
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise ValueError("--family: no trace named")
    return names


def _progress(done: int, total: int, what: str, started: float) -> None:
    print(
        f"[{done}/{total}] {what} ({time.perf_counter() - started:.0f} s elapsed)",
        file=sys.stderr,
        flush=True,
    )


def run_families(
    names: Sequence[str],
    directory: Path,
    nodes: Path,
    *,
    policies: Sequence[str],
    seeds: Sequence[int],
    workers: int,
    out_dir: Path,
    variant_seed: int = GENERATION_SEED,
) -> dict[str, dict[str, object]]:
    """Every family × policy × seed (and the bound per family × seed), one pool."""
    lists = {name: materialise(name, directory, out_dir, variant_seed) for name in names}
    for path, _ in lists.values():
        read_pods(path)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        runs = {
            (name, policy, seed): pool.submit(
                _run_one, str(nodes), str(lists[name][0]), policy, seed
            )
            for name in names
            for policy in policies
            for seed in seeds
        }
        bounds = {
            (name, seed): pool.submit(_bound_one, str(nodes), str(lists[name][0]), seed)
            for name in names
            for seed in seeds
        }
        total = len(runs) + len(bounds)
        results: dict[str, list[SeedResult]] = {name: [] for name in names}
        for done, ((name, policy, seed), future) in enumerate(runs.items(), start=1):
            result = future.result()
            results[name].append(result)
            _progress(
                done,
                total,
                f"{name} {policy} seed {seed}: {_shown(result.unallocated['100'])} % "
                f"unallocated at 100 %",
                started,
            )
        found: dict[str, list[float | None]] = {name: [] for name in names}
        for done, ((name, seed), bound_future) in enumerate(bounds.items(), start=len(runs) + 1):
            value = bound_future.result()[1]
            found[name].append(value)
            _progress(done, total, f"{name} bound seed {seed}: {_shown(value)} %", started)
    return {
        name: summarise_family(name, lists[name][0], lists[name][1], results[name], found[name])
        for name in names
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "trace":
        print(
            "usage: gpushare bench trace [--trace-dir DIR] [--nodes F] [--pods F] "
            "[--family NAME|all] [--policy P[,P]] [--seeds S]"
        )
        return 0 if args and args[0] in {"-h", "--help"} else 2
    parser = _parser()
    options = parser.parse_args(args[1:])
    if options.family is not None:
        return _main_families(parser, options)
    try:
        names = resolve_policies(options.policy)
        options.nodes, options.pods = trace_files(options.trace_dir, options.nodes, options.pods)
        read_nodes(options.nodes)
        read_pods(options.pods)
    except (ValueError, TraceError) as error:
        parser.error(str(error))
    jobs = [(name, seed) for name in names for seed in options.seeds]
    results: list[SeedResult] = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, options.workers)) as pool:
        futures = [
            pool.submit(
                _run_one, str(options.nodes), str(options.pods), name, seed, options.topology
            )
            for name, seed in jobs
        ]
        for done, future in enumerate(futures, start=1):
            result = future.result()
            results.append(result)
            print(
                f"[{done}/{len(jobs)}] {result.policy} seed {result.seed}: "
                f"{_shown(result.unallocated['100'])} % unallocated at 100 % "
                f"({result.pods} pods in {result.seconds:.1f} s; "
                f"{time.perf_counter() - started:.0f} s elapsed)",
                file=sys.stderr,
                flush=True,
            )
    summary = summarise(results)
    if options.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render(summary, options.pods, options.seeds))
    return 0


def _main_families(parser: argparse.ArgumentParser, options: argparse.Namespace) -> int:
    if options.pods is not None:
        parser.error("--family and --pods: give one")
    try:
        policies = resolve_policies(options.policy)
        names = family_names(options.family)
        directory = trace_dir(options.trace_dir)
        if directory is None:
            raise TraceError(
                f"no trace folder (this is not a checkout); pass --trace-dir DIR (a copy of "
                f"{TRACE_SOURCE})"
            )
        nodes, _ = trace_files(directory, options.nodes, None)
        with tempfile.TemporaryDirectory(prefix="gpushare-variants-") as scratch:
            out_dir = options.variants_dir or Path(scratch)
            summary = run_families(
                names,
                directory,
                nodes,
                policies=policies,
                seeds=options.seeds,
                workers=options.workers,
                out_dir=out_dir,
                variant_seed=options.variant_seed,
            )
    except (ValueError, TraceError, OSError) as error:
        parser.error(str(error))
    if options.json:
        print(json.dumps({"seeds": list(options.seeds), "families": summary}, indent=2))
    else:
        print(render_families(summary, policies, options.seeds))
    return 0
