"""``gpushare bench trace``: replay an Alibaba-format trace under FGD's protocol.

Prints, per policy, the unallocated GPU % at 95, 100 and 130 % arrived demand (mean ±
sd over the seeds), the GPU allocation ratio at 100 %, and placements per second;
``--json`` prints one object keyed by policy instead. Seeds run in parallel worker
processes; progress goes to stderr.

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
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from os import cpu_count
from pathlib import Path

from gpushare.tracebench.policies import build, policy_names, resolve
from gpushare.tracebench.protocol import LEVELS, arrivals
from gpushare.tracebench.replay import replay
from gpushare.tracebench.trace import TraceError, read_nodes, read_pods

BUNDLED = Path(__file__).resolve().parents[3] / "benchmarks" / "traces" / "alibaba-gpu-v2023"
"""The trace in a source checkout (``src/gpushare/tracebench`` -> the repository root);
an installed wheel has no such folder."""
TRACE_DIR_VARIABLE = "GPUSHARE_TRACE_DIR"
NODES_FILE = "openb_node_list_gpu_node.csv"
PODS_FILE = "openb_pod_list_default.csv"
DEFAULT_NODES = BUNDLED / NODES_FILE
DEFAULT_PODS = BUNDLED / PODS_FILE
TRACE_SOURCE = "alibaba/clusterdata, cluster-trace-gpu-v2023/csv/"

PUBLISHED_FGD = {
    "default": 4.77,
    "cpu050": 5.00,
    "gpushare40": 6.04,
    "gpuspec10": 5.34,
    "multigpu20": 4.47,
}
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


def _run_one(nodes_path: str, pods_path: str, policy_name: str, seed: int) -> SeedResult:
    nodes = read_nodes(Path(nodes_path))
    pods = read_pods(Path(pods_path))
    capacity = sum(node.gpus for node in nodes) * 1000
    order = arrivals(pods, seed, capacity)
    result = replay(nodes, order, build(policy_name, pods), tie_seed=seed)
    return SeedResult(
        policy=policy_name,
        seed=seed,
        unallocated={level: result.curve.unallocated_at(int(level)) for level in LEVELS},
        allocation_at_100=result.curve.allocation_at(100),
        pods=len(order),
        failed=result.failed,
        seconds=result.seconds,
    )


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
    published = PUBLISHED_FGD.get(family)
    if published is not None:
        lines.append(
            f"published FGD (ATC '23) on {family}, seeds 42-51: {published:.2f} % at 100 %"
        )
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
        "--policy",
        default="default",
        help="a policy name, 'default' (the cluster default) or 'all': "
        + ", ".join(policy_names()),
    )
    parser.add_argument("--seeds", type=parse_seeds, default=(42,), help="42, 42-51 or 42,43")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--workers", type=int, default=min(cpu_count() or 1, 4), help="parallel replays"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "trace":
        print(
            "usage: gpushare bench trace [--trace-dir DIR] [--nodes F] [--pods F] "
            "[--policy P] [--seeds S]"
        )
        return 0 if args and args[0] in {"-h", "--help"} else 2
    parser = _parser()
    options = parser.parse_args(args[1:])
    try:
        names = resolve(options.policy)
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
            pool.submit(_run_one, str(options.nodes), str(options.pods), name, seed)
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
