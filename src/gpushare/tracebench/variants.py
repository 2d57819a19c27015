"""The trace's pod-list variants, rebuilt from the bundled lists as the FGD artifact made them.

The repository bundles five pod lists of alibaba/clusterdata ``cluster-trace-gpu-v2023``
(``default``, ``cpu050``, ``gpushare40``, ``gpuspec10``, ``multigpu20``); the FGD paper
also runs twelve more. The artifact's generator is not public (neither
hkust-adsl/kubernetes-scheduler-simulator nor alibaba/clusterdata has it; the trace's
README only says the variants "are sampled from the default one"), so each family is
rebuilt here by the method its bundled member shows (``COLUMNS.md`` beside the trace):

* ``cpuXXX``: every GPU pod of ``default``; the non-GPU pods drawn from default's until
  they are the target share of all pods, without replacement when there are enough
  (``cpu050`` has 374 distinct of 375), with replacement otherwise. Non-GPU pods first,
  as upstream.
* ``gpushareXX``: default's 1088 non-GPU pods, then 7064 GPU pods redrawn in two groups,
  sharing (``gpu_milli < 1000``) and the rest (whole and multi-GPU), sized so that
  sharing pods carry the target share of the GPU request (by the groups' mean request).
  A group is drawn without replacement when it has enough pods, else with replacement
  (``gpushare40``: 4001 sharing rows of 2187 distinct, 3001 whole rows of 2995).
* ``gpuspecXX``: ``default`` with ``gpu_spec`` set on the target share of GPU pods, drawn
  afresh for each variant. Read from upstream ``gpuspec33`` (a 2,448-row sample of its
  8,152: rows 0-1782, 4172-4392, 6109-6326, 7926-8151; same names and resources as
  ``default``, only ``gpu_spec`` differs): 701 of 2,144 GPU pods constrained (32.7 %,
  34.0 % of their request). It is not nested on ``gpuspec10``: 86 of gpuspec10's 239
  constrained pods there are constrained in gpuspec33 (36 %, the base rate; 37 with the
  same spec), and 32.3 % of the others. ``P(constrained | shape)``: sharing 29.4 % (278 of
  947), one whole card 35.3 % (420 of 1190), multi-GPU 3 of 7 (gpuspec10: 8.8 / 11.6 /
  12 %), flat across ``gpu_milli`` values and qos, and uncorrelated with cpu (r = 0.04)
  and memory (r = 0.05); neighbours are independent. ``P(spec | shape)``
  (``SPEC_WEIGHTS``): sharing pods only T4 68 %, P100 29 %, G2|P100|T4|V100M16|V100M32
  3 % (gpuspec10: 60 / 36 / 3 %); whole-card T4 48 %, G2 20 %, V100M16|V100M32 10 %,
  P100|V100M16|V100M32 9 %, G3 5 %, … (gpuspec10: T4 42 %, G2 25 %); P100 alone never on
  a whole card. So here: the constrained pods are drawn uniformly without replacement
  among the sharing pods and among the rest, split so they carry the table's share of
  the request too, and each takes a spec drawn from ``SPEC_WEIGHTS`` of its class (an
  8-GPU pod one naming G2 or G3, as every constrained 8-GPU pod upstream does).
  ``gpuspec10`` rebuilt from scratch uses its own weights (``spec_weights_of``).
* ``multigpuXX``: ``default`` unchanged, then 2-, 4- and 8-GPU pods drawn uniformly with
  replacement from default's 75 multi-GPU pods (``multigpu20``'s 172 added pods are 97 /
  37 / 38 of 8 / 4 / 2 GPUs, every shape one of default's) until multi-GPU pods carry the
  target share of the GPU request. Named ``openb-pod-8152`` onward; five columns.

The targets are the shares measured on the upstream files (``UPSTREAM``), so a variant
here has the upstream one's row count and shares to within a few rows. Generation is
deterministic for a seed; ``python -m gpushare.tracebench.variants DIR`` writes them all.
"""

from __future__ import annotations

import csv
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Row = dict[str, str]

COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
MULTIGPU_COLUMNS = COLUMNS[:5]
GENERATION_SEED = 2023
"""The seed of the generated variants unless told otherwise."""

FAMILIES = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
"""The 17 traces of the FGD paper, in its order."""
BUNDLED = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")
GENERATED = tuple(name for name in FAMILIES if name not in BUNDLED)


@dataclass(frozen=True)
class Stats:
    """A pod list's counts as ``COLUMNS.md`` tabulates them; shares are fractions."""

    rows: int
    non_gpu: int
    gpu_pods: int
    sharing_of_gpu_pods: float
    multi_of_gpu_pods: float
    constrained_of_gpu_pods: float
    gpu_request: float
    """GPUs (sum of ``num_gpu × gpu_milli`` / 1000)."""
    sharing_of_request: float
    multi_of_request: float
    constrained_of_request: float

    @property
    def non_gpu_of_rows(self) -> float:
        return self.non_gpu / self.rows


UPSTREAM: dict[str, Stats] = {
    name: Stats(
        rows=rows,
        non_gpu=non_gpu,
        gpu_pods=rows - non_gpu,
        sharing_of_gpu_pods=share_pods,
        multi_of_gpu_pods=multi_pods,
        constrained_of_gpu_pods=spec_pods,
        gpu_request=request,
        sharing_of_request=share_req,
        multi_of_request=multi_req,
        constrained_of_request=spec_req,
    )
    for name, (
        rows,
        non_gpu,
        share_pods,
        multi_pods,
        spec_pods,
        request,
        share_req,
        multi_req,
        spec_req,
    ) in {
        "default": (8152, 1088, 0.436, 0.011, 0.0, 6086.8, 0.285, 0.073, 0.0),
        "cpu050": (7439, 375, 0.436, 0.011, 0.0, 6086.8, 0.285, 0.073, 0.0),
        "cpu100": (7853, 789, 0.436, 0.011, 0.0, 6086.8, 0.285, 0.073, 0.0),
        "cpu200": (8832, 1768, 0.436, 0.011, 0.0, 6086.8, 0.285, 0.073, 0.0),
        "cpu250": (9420, 2356, 0.436, 0.011, 0.0, 6086.8, 0.285, 0.073, 0.0),
        "gpushare40": (8152, 1088, 0.566, 0.009, 0.0, 5641.2, 0.401, 0.067, 0.0),
        "gpushare60": (8152, 1088, 0.741, 0.004, 0.0, 4908.3, 0.600, 0.033, 0.0),
        "gpushare80": (8152, 1088, 0.889, 0.002, 0.0, 4408.2, 0.800, 0.025, 0.0),
        "gpushare100": (8152, 1088, 1.0, 0.0, 0.0, 3952.7, 1.0, 0.0, 0.0),
        "gpuspec10": (8152, 1088, 0.436, 0.011, 0.104, 6086.8, 0.285, 0.073, 0.109),
        "gpuspec20": (8152, 1088, 0.436, 0.011, 0.204, 6086.8, 0.285, 0.073, 0.204),
        "gpuspec25": (8152, 1088, 0.436, 0.011, 0.249, 6086.8, 0.285, 0.073, 0.259),
        "gpuspec33": (8152, 1088, 0.436, 0.011, 0.338, 6086.8, 0.285, 0.073, 0.348),
        "multigpu20": (8324, 1088, 0.425, 0.034, 0.0, 7086.8, 0.244, 0.204, 0.0),
        "multigpu30": (8508, 1088, 0.415, 0.058, 0.0, 8086.8, 0.214, 0.302, 0.0),
        "multigpu40": (8746, 1088, 0.402, 0.087, 0.0, 9442.8, 0.183, 0.402, 0.0),
        "multigpu50": (9061, 1088, 0.386, 0.123, 0.0, 11358.8, 0.152, 0.503, 0.0),
    }.items()
}
"""``COLUMNS.md``'s variant table, measured on the upstream files."""


def _gpus(row: Row) -> int:
    return int(row["num_gpu"] or 0)


def _milli(row: Row) -> int:
    return int(row["gpu_milli"] or 0) if _gpus(row) else 0


def request_milli(row: Row) -> int:
    return _gpus(row) * min(_milli(row), 1000)


def is_gpu(row: Row) -> bool:
    return _gpus(row) > 0


def is_sharing(row: Row) -> bool:
    return _gpus(row) == 1 and _milli(row) < 1000


def is_multi(row: Row) -> bool:
    return _gpus(row) > 1


def shape_class(row: Row) -> str:
    """``none``, ``sharing``, ``whole`` (one card) or ``multi``."""
    if not is_gpu(row):
        return "none"
    if is_sharing(row):
        return "sharing"
    return "multi" if is_multi(row) else "whole"


def stats(rows: Sequence[Row]) -> Stats:
    gpu = [row for row in rows if is_gpu(row)]
    total = sum(request_milli(row) for row in gpu) or 1

    def pods(test: Callable[[Row], bool]) -> float:
        return sum(1 for row in gpu if test(row)) / (len(gpu) or 1)

    def request(test: Callable[[Row], bool]) -> float:
        return sum(request_milli(row) for row in gpu if test(row)) / total

    def constrained(row: Row) -> bool:
        return bool(row.get("gpu_spec"))

    return Stats(
        rows=len(rows),
        non_gpu=len(rows) - len(gpu),
        gpu_pods=len(gpu),
        sharing_of_gpu_pods=pods(is_sharing),
        multi_of_gpu_pods=pods(is_multi),
        constrained_of_gpu_pods=pods(constrained),
        gpu_request=sum(request_milli(row) for row in gpu) / 1000,
        sharing_of_request=request(is_sharing),
        multi_of_request=request(is_multi),
        constrained_of_request=request(constrained),
    )


def _draw(rng: random.Random, pool: Sequence[Row], count: int) -> list[Row]:
    """``count`` rows of ``pool``: without replacement when it has enough, else with."""
    if count <= len(pool):
        return rng.sample(list(pool), count)
    return [pool[rng.randrange(len(pool))] for _ in range(count)]


def _renamed(rows: Iterable[Row]) -> list[Row]:
    return [{**row, "name": f"openb-pod-{index:04d}"} for index, row in enumerate(rows)]


def cpu_variant(default: Sequence[Row], non_gpu_share: float, rng: random.Random) -> list[Row]:
    """Every GPU pod, and non-GPU pods drawn to ``non_gpu_share`` of all pods."""
    gpu = [row for row in default if is_gpu(row)]
    pool = [row for row in default if not is_gpu(row)]
    count = round(non_gpu_share * len(gpu) / (1 - non_gpu_share))
    return _renamed([*_draw(rng, pool, count), *gpu])


def gpushare_variant(default: Sequence[Row], sharing_share: float, rng: random.Random) -> list[Row]:
    """Non-GPU pods kept; GPU pods redrawn so sharing pods carry ``sharing_share`` of the
    GPU request (counts from the two groups' mean request)."""
    non_gpu = [row for row in default if not is_gpu(row)]
    sharing = [row for row in default if is_sharing(row)]
    rest = [row for row in default if is_gpu(row) and not is_sharing(row)]
    total = len(sharing) + len(rest)
    if sharing_share >= 1:
        count = total
    else:
        mean_sharing = sum(map(request_milli, sharing)) / len(sharing)
        mean_rest = sum(map(request_milli, rest)) / len(rest)
        ratio = sharing_share * mean_rest / ((1 - sharing_share) * mean_sharing)
        count = round(total * ratio / (1 + ratio))
    return _renamed([*non_gpu, *_draw(rng, sharing, count), *_draw(rng, rest, total - count)])


SPEC_WEIGHTS: dict[str, dict[str, int]] = {
    "sharing": {"T4": 190, "P100": 81, "G2|P100|T4|V100M16|V100M32": 7},
    "whole": {
        "T4": 203,
        "G2": 84,
        "V100M16|V100M32": 44,
        "P100|V100M16|V100M32": 37,
        "G3": 22,
        "P100|T4|V100M16|V100M32": 11,
        "V100M32": 5,
        "G2|P100|T4|V100M16|V100M32": 5,
        "V100M16|V100M32|V100M32": 3,
        "A10|T4": 2,
        "A10|G2|T4|V100M16|V100M32": 2,
        "A10|G2|P100|T4|V100M16|V100M32|V100M32": 1,
        "P100|V100M16": 1,
    },
    "multi": {"G2": 10, "G3": 1, "T4|V100M16|V100M32": 1},
}
"""``P(spec | shape class)`` of the upstream gpuspec lists, as counts: sharing and whole
from the 701 constrained pods of a 2,448-row sample of upstream ``gpuspec33`` (rows
0-1782, 4172-4392, 6109-6326, 7926-8151); multi from that sample's 3 and ``gpuspec10``'s
9 constrained multi-GPU pods pooled (too few in either alone)."""

EIGHT_CARD_MODELS = frozenset({"G2", "G3"})
"""The models with enough 8-card nodes for an 8-GPU pod (549 G2 and 39 G3 nodes; every
constrained 8-GPU pod upstream names one of them)."""


def spec_weights_of(rows: Iterable[Row]) -> dict[str, dict[str, int]]:
    """``P(spec | shape class)`` of a gpuspec list, as counts (the form of
    ``SPEC_WEIGHTS``)."""
    weights: dict[str, Counter[str]] = {}
    for row in rows:
        if row.get("gpu_spec") and is_gpu(row):
            weights.setdefault(shape_class(row), Counter())[row["gpu_spec"]] += 1
    return {name: dict(counts) for name, counts in weights.items()}


def gpuspec_variant(
    default: Sequence[Row],
    constrained_share: float,
    rng: random.Random,
    request_share: float | None = None,
    weights: Mapping[str, Mapping[str, int]] = SPEC_WEIGHTS,
) -> list[Row]:
    """``default`` with ``gpu_spec`` on ``constrained_share`` of its GPU pods, drawn
    afresh (not nested on any other gpuspec list): uniformly without replacement among
    the sharing pods and among the rest (whole and multi-GPU), the split between the two
    set so the constrained pods carry ``request_share`` of the GPU request (the same
    rate in both when ``None``); each takes a spec drawn from ``weights`` for its
    shape class."""
    rows = [{**row, "gpu_spec": ""} for row in default]
    gpu = [row for row in rows if is_gpu(row)]
    sharing = [row for row in gpu if is_sharing(row)]
    rest = [row for row in gpu if not is_sharing(row)]
    wanted = round(constrained_share * len(gpu))
    if request_share is None:
        from_rest = round(wanted * len(rest) / len(gpu))
    else:
        mean_sharing = sum(map(request_milli, sharing)) / len(sharing)
        mean_rest = sum(map(request_milli, rest)) / len(rest)
        total = sum(map(request_milli, gpu))
        exact = (request_share * total - wanted * mean_sharing) / (mean_rest - mean_sharing)
        from_rest = round(exact)
    from_rest = max(wanted - len(sharing), min(from_rest, wanted, len(rest)))
    for pool, count in ((sharing, wanted - from_rest), (rest, from_rest)):
        for row in rng.sample(pool, count):
            row["gpu_spec"] = _spec_for(row, weights, rng)
    return rows


def _spec_for(row: Row, weights: Mapping[str, Mapping[str, int]], rng: random.Random) -> str:
    """A spec drawn from ``weights`` of ``row``'s shape class; an 8-GPU pod gets one
    that names an 8-card model (``EIGHT_CARD_MODELS``)."""
    choices = dict(weights.get(shape_class(row)) or weights["whole"])
    if _gpus(row) == 8:
        eight = {
            spec: weight
            for spec, weight in choices.items()
            if EIGHT_CARD_MODELS & set(spec.split("|"))
        }
        choices = eight or choices
    names = sorted(choices)
    return rng.choices(names, weights=[choices[name] for name in names])[0]


def multigpu_variant(default: Sequence[Row], multi_share: float, rng: random.Random) -> list[Row]:
    """``default``, then multi-GPU pods drawn from its own with replacement until they
    carry ``multi_share`` of the GPU request."""
    pool = [row for row in default if is_multi(row)]
    rows = [{column: row.get(column, "") for column in MULTIGPU_COLUMNS} for row in default]
    total = sum(map(request_milli, default))
    multi = sum(map(request_milli, pool))
    while multi < multi_share * total:
        drawn = pool[rng.randrange(len(pool))]
        rows.append(
            {column: drawn.get(column, "") for column in MULTIGPU_COLUMNS}
            | {"name": f"openb-pod-{len(rows):04d}"}
        )
        total += request_milli(drawn)
        multi += request_milli(drawn)
    return rows


_NAME = re.compile(r"(cpu|gpushare|gpuspec|multigpu)(\d+)")


def target(name: str) -> tuple[str, float]:
    """The family and the share a variant's generator aims at: the upstream file's
    measured share (``UPSTREAM``), else the name's number as a percentage (cpu's with
    one decimal: ``cpu050`` = 5.0 %)."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"not a variant name: {name!r} (e.g. cpu100, gpushare60)")
    family, number = match.group(1), int(match.group(2))
    upstream = UPSTREAM.get(name)
    if family == "cpu":
        share = upstream.non_gpu_of_rows if upstream else number / 1000
    elif family == "gpushare":
        share = upstream.sharing_of_request if upstream else number / 100
    elif family == "gpuspec":
        share = upstream.constrained_of_gpu_pods if upstream else number / 100
    else:
        share = upstream.multi_of_request if upstream else number / 100
    if not 0 <= share <= 1 or (family == "cpu" and share >= 1):
        raise ValueError(f"{name}: share {share:.3f} out of range")
    return family, share


def generate(
    name: str,
    default: Sequence[Row],
    specs: Sequence[Row] = (),
    seed: int = GENERATION_SEED,
) -> list[Row]:
    """The pod list ``name`` built from ``default`` (and, for gpuspec, a gpuspec list
    such as ``gpuspec10``'s rows)."""
    family, share = target(name)
    rng = random.Random(f"{name}/{seed}")
    if family == "cpu":
        return cpu_variant(default, share, rng)
    if family == "gpushare":
        return gpushare_variant(default, share, rng)
    if family == "gpuspec":
        weights = spec_weights_of(specs) if name == "gpuspec10" and specs else SPEC_WEIGHTS
        known = UPSTREAM.get(name)
        request = known.constrained_of_request if known else None
        return gpuspec_variant(default, share, rng, request, weights)
    return multigpu_variant(default, share, rng)


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="") as handle:
        return [dict(row) for row in csv.DictReader(handle)]


def columns_of(name: str) -> tuple[str, ...]:
    return MULTIGPU_COLUMNS if name.startswith("multigpu") else COLUMNS


def write_rows(path: Path, rows: Sequence[Row], columns: Sequence[str] = COLUMNS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({column: row.get(column, "") for column in columns} for row in rows)
    return path


def pod_file(name: str) -> str:
    return f"openb_pod_list_{name}.csv"


def materialise(
    name: str, trace_dir: Path, out_dir: Path, seed: int = GENERATION_SEED
) -> tuple[Path, bool]:
    """The pod list ``name``: ``trace_dir``'s file when it has one (``False``), else one
    generated from ``trace_dir``'s ``default`` (and ``gpuspec10``) into ``out_dir``
    (``True``)."""
    given = trace_dir / pod_file(name)
    if given.is_file():
        return given, False
    if name not in FAMILIES and _NAME.fullmatch(name) is None:
        raise ValueError(f"unknown trace {name!r} (known: {', '.join(FAMILIES)})")
    default = read_rows(trace_dir / pod_file("default"))
    specs = read_rows(trace_dir / pod_file("gpuspec10")) if name.startswith("gpuspec") else []
    rows = generate(name, default, specs, seed)
    return write_rows(out_dir / pod_file(name), rows, columns_of(name)), True


def write_all(
    trace_dir: Path, out_dir: Path, seed: int = GENERATION_SEED, names: Sequence[str] = GENERATED
) -> dict[str, Stats]:
    """Generate ``names`` into ``out_dir``; their stats."""
    default = read_rows(trace_dir / pod_file("default"))
    specs = read_rows(trace_dir / pod_file("gpuspec10"))
    written: dict[str, Stats] = {}
    for name in names:
        rows = generate(name, default, specs, seed)
        write_rows(out_dir / pod_file(name), rows, columns_of(name))
        written[name] = stats(rows)
    return written


def describe(name: str, measured: Stats, upstream: Mapping[str, Stats] = UPSTREAM) -> str:
    """One line: this list's counts, and the upstream file's in brackets."""
    theirs = upstream.get(name)

    def cell(ours: float, attr: str, percent: bool = True) -> str:
        shown = f"{ours * 100:.1f}" if percent else f"{ours:g}"
        if theirs is None:
            return shown
        value = getattr(theirs, attr)
        return f"{shown} ({value * 100:.1f})" if percent else f"{shown} ({value:g})"

    return (
        f"{name:<12} rows {cell(measured.rows, 'rows', False)}, "
        f"non-GPU {cell(measured.non_gpu, 'non_gpu', False)}, "
        f"sharing/GPU pods {cell(measured.sharing_of_gpu_pods, 'sharing_of_gpu_pods')} %, "
        f"multi/GPU pods {cell(measured.multi_of_gpu_pods, 'multi_of_gpu_pods')} %, "
        f"constrained/GPU pods "
        f"{cell(measured.constrained_of_gpu_pods, 'constrained_of_gpu_pods')} %, "
        f"request {measured.gpu_request:.1f} GPUs, shares of request: "
        f"sharing {cell(measured.sharing_of_request, 'sharing_of_request')} / "
        f"multi {cell(measured.multi_of_request, 'multi_of_request')} / "
        f"constrained {cell(measured.constrained_of_request, 'constrained_of_request')} %"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpushare.tracebench.variants OUT_DIR [TRACE_DIR] [SEED]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(main.__doc__)
        return 0 if args else 2
    from gpushare.tracebench.cli import BUNDLED as bundled_dir

    out_dir = Path(args[0])
    trace_dir = Path(args[1]) if len(args) > 1 else bundled_dir
    seed = int(args[2]) if len(args) > 2 else GENERATION_SEED
    for name, measured in write_all(trace_dir, out_dir, seed).items():
        print(describe(name, measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
