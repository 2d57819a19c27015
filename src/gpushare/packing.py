"""What each per-card share of a workload is worth when its shares are packed onto cards
as tightly as they can be: the dual prices of the cutting-stock LP.

The LP (Gilmore-Gomory's, written as Valério de Carvalho's arc-flow model) packs the
workload's share mix (``TaskClass.gpu_milli`` below a whole card, each as often as its
weight) onto as few cards as possible. A share's dual price is the part of a card it
costs in that optimal packing: on the Alibaba trace's default list 810 costs a whole
card (nothing but the rare 160 fits beside it), 470 half of one, 320 a third. The core's
``priced_leftover`` turns the prices into the part of a card's free milli that such a
packing could not use, which ``FragmentationPolicy`` charges for.

HiGHS (through scipy) solves it at each rebuild of the workload policy (a few ms). It is
here rather than in the core, which does no numerics through numpy or scipy.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from gpushare.core.policies.fragmentation import MILLI, Workload


def share_demand(workload: Workload) -> dict[int, float]:
    """Per-card shares (milli-GPU below a whole card) by size, each weighted by how often
    the workload asks for one (``weight × gpus``)."""
    demand: dict[int, float] = {}
    for task in workload.classes:
        if task.gpus and 0 < task.gpu_milli < MILLI and task.weight > 0:
            demand[task.gpu_milli] = demand.get(task.gpu_milli, 0.0) + task.weight * task.gpus
    return demand


def share_prices(workload: Workload) -> dict[int, float]:
    """Each share size's dual price, in milli-GPU (0..1000), in the LP that packs the
    workload's share mix onto the fewest cards; empty when the workload has no shares."""
    demand = share_demand(workload)
    if not demand:
        return {}
    granule = math.gcd(MILLI, *demand)
    card = MILLI // granule
    sizes = sorted(size // granule for size in demand)
    arcs = [(at, size, row) for row, size in enumerate(sizes) for at in range(card - size + 1)]
    arcs += [(at, 0, -1) for at in range(card)]  # the card's unused part, a granule at a time
    flow_rows: list[int] = []
    flow_columns: list[int] = []
    flow_values: list[float] = []
    demand_rows: list[int] = []
    demand_columns: list[int] = []
    for column, (at, size, row) in enumerate(arcs):
        end = at + max(size, 1)
        if 0 < end < card:  # into an inner point
            flow_rows.append(end - 1)
            flow_columns.append(column)
            flow_values.append(1.0)
        if at > 0:  # out of an inner point
            flow_rows.append(at - 1)
            flow_columns.append(column)
            flow_values.append(-1.0)
        if size:
            demand_rows.append(row)
            demand_columns.append(column)
    cards_used = np.array([1.0 if at == 0 else 0.0 for at, _, _ in arcs])
    conservation = coo_matrix((flow_values, (flow_rows, flow_columns)), shape=(card - 1, len(arcs)))
    covered = coo_matrix(
        ([-1.0] * len(demand_rows), (demand_rows, demand_columns)), shape=(len(sizes), len(arcs))
    )
    wanted = [-demand[size * granule] for size in sizes]
    solved = linprog(
        cards_used,
        A_ub=covered,
        b_ub=wanted,
        A_eq=conservation,
        b_eq=np.zeros(card - 1),
        bounds=(0, None),
        method="highs",
    )
    if solved.status != 0:  # cannot happen for a feasible mix; no prices, no charge
        return {}
    return {
        size * granule: max(0.0, float(-dual)) * MILLI
        for size, dual in zip(sizes, solved.ineqlin.marginals, strict=True)
    }
