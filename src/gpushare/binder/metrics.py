"""The binder's Prometheus metrics (served with ``--metrics-port``).

Process-wide, like the node agent's: one binder runs per process. The log lag is
per follower (:class:`gpushare.bus.lag.LogLag`, registered where the server starts).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge

BINDINGS = Counter(
    "gpushare_binder_bindings",
    "Reservations handled, by outcome: bound (PodBound appended), failed (BindFailed "
    "appended), retried (redelivered later), not_needed (already bound or released).",
    ["outcome"],
)
RECONCILE_PASSES = Counter(
    "gpushare_binder_reconcile_passes",
    "Passes comparing the log with the Kubernetes API.",
)
RECONCILE_PROBES = Counter(
    "gpushare_binder_reconcile_probes",
    "Periodic passes over the watched pods; one that finds something to correct is "
    "followed by a pass over a new pod list (gpushare_binder_reconcile_passes).",
)
RECONCILE_FINDINGS = Gauge(
    "gpushare_binder_reconcile_findings",
    "What the last reconcile pass found, by kind: adoption, release, or the discrepancy's kind.",
    ["kind"],
)
APPEND_CONFLICTS = Counter(
    "gpushare_binder_append_conflicts",
    "Adoptions refused by compare-and-set because the node changed; re-decided.",
)

AGENT_QUESTIONS = Counter(
    "gpushare_binder_agent_questions",
    "Readiness questions to node agents before bindings, by answer: ready, waiting, or none "
    "(no agent answered). Bindings served by a recent ready (--agent-ready-reuse) ask none.",
    ["answer"],
)

ASSIGN_OVERDUE = Gauge(
    "gpushare_binder_assign_overdue",
    "Bound pods, existing and not finished, not fully assigned within --assign-timeout "
    "(last sweep): reported as DiscrepancyFound(assign_overdue), their reservations kept.",
)
ANNOTATION_REWRITES = Counter(
    "gpushare_binder_annotation_rewrites",
    "Patches setting a bound pod's annotations to the log's allocation, by cause (moved: an "
    "AllocationCorrected; reconciled: a reconcile pass found them different) and outcome "
    "(written, gone: the pod no longer exists, failed: retried later).",
    ["cause", "outcome"],
)


def set_reconcile_findings(kinds: Mapping[str, int]) -> None:
    """The last pass's findings replace the previous pass's."""
    RECONCILE_FINDINGS.clear()
    for kind, count in kinds.items():
        RECONCILE_FINDINGS.labels(kind).set(count)
