"""The binder's settings: declared here with their flags, read once in ``__main__``, passed down."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

from gpushare.bus.permissions import BINDER_CONSUMER
from gpushare.flags import DEFAULT_NATS_URL, MEMORY_UNIT, METRICS_PORT, NATS, STREAM_REPLICAS
from gpushare.settings_spec import Setting, number, port_or_off

SECONDS = number(float, low=0)


@dataclass(frozen=True, kw_only=True)
class BinderSettings:
    nats_url: Annotated[str, NATS] = DEFAULT_NATS_URL
    """``--nats`` / ``GPUSHARE_NATS_URL``; comma-separated for a cluster."""
    kubeconfig: Annotated[
        str | None,
        Setting(
            flag="--kubeconfig",
            help="kubeconfig file, or 'in-cluster'; none: the default kubeconfig or the pod's "
            "service account",
        ),
    ] = None
    """``--kubeconfig``; None or ``in-cluster`` uses the pod's service account."""
    memory_unit: Annotated[str, MEMORY_UNIT] = "MiB"
    """``--memory-unit`` / ``GPUSHARE_MEMORY_UNIT``: the unit of the annotations (MiB, GiB),
    and the step a DRA claim's memory is consumed in."""
    stream_replicas: Annotated[int, STREAM_REPLICAS] = 1
    """``--stream-replicas`` / ``GPUSHARE_STREAM_REPLICAS``: of the streams it creates."""
    bind_timeout_s: Annotated[
        float,
        Setting(
            flag="--bind-timeout",
            parse=SECONDS,
            help="release a reservation not bound within this many seconds",
        ),
    ] = 120.0
    """``--bind-timeout``: a reservation not bound this long after it was made is released."""
    agent_wait_s: Annotated[
        float,
        Setting(
            flag="--agent-wait",
            parse=SECONDS,
            help="seconds a binding waits for the node's agent to serve again (restarting, or "
            "the kubelet restarted) before binding anyway; keep it below the allocator's "
            "--bind-wait",
        ),
    ] = 8.0
    """``--agent-wait``: how long a binding waits for the node's agent to serve again
    (restarting, or the kubelet restarted), after which it binds anyway. Keep it below
    the allocator's ``--bind-wait`` (10 s)."""
    agent_ready_reuse_s: Annotated[
        float,
        Setting(
            flag="--agent-ready-reuse",
            parse=SECONDS,
            help="seconds a node agent's 'ready' serves further bindings to its node without "
            "asking again (0: ask for every binding)",
        ),
    ] = 0.1
    """``--agent-ready-reuse``: how long a node agent's ``ready`` answer serves the next
    bindings to its node without asking again (0: ask before every binding). Pods come to
    a node in runs under a packing policy, and each question was a request, a reply and a
    wake-up of the agent per pod; ``waiting`` or no answer is never reused."""
    assign_timeout_s: Annotated[
        float,
        Setting(
            flag="--assign-timeout",
            parse=SECONDS,
            help="report a bound pod not fully assigned its cards within this many seconds; "
            "its reservation is kept until the pod is deleted or finishes",
        ),
    ] = 600.0
    """``--assign-timeout``: a bound pod whose containers were not all handed their cards
    by the device plugin this long after binding is reported (``DiscrepancyFound`` of kind
    ``assign_overdue``, a warning, a metric) but keeps its reservation: a bound reservation
    is released only when its pod is gone or finished (``Succeeded``/``Failed``)."""
    sweep_interval_s: Annotated[
        float,
        Setting(
            flag="--sweep-interval",
            parse=SECONDS,
            help="seconds between checks for overdue reservations",
        ),
    ] = 5.0
    """``--sweep-interval``: how often overdue reservations and unmarked assignments are checked."""
    reconcile_interval_s: Annotated[
        float,
        Setting(
            flag="--reconcile-interval",
            env="GPUSHARE_RECONCILE_INTERVAL",
            parse=SECONDS,
            help="seconds between passes comparing the log with the Kubernetes API; 0: only at "
            "start (and after a pod watch gap)",
        ),
    ] = 60.0
    """``--reconcile-interval`` / ``GPUSHARE_RECONCILE_INTERVAL``: seconds between passes
    comparing the log with the Kubernetes API (one also runs at start and after every pod
    watch gap); 0 disables the periodic passes."""
    rewrite_grace_s: float = 30.0
    """A pod the log moved to other cards less than this long ago, whose annotations still
    name the old ones, is repaired by a reconcile pass without a ``DiscrepancyFound``: the
    move's own rewrite may still be in flight (it is retried for ``bind_attempts``
    deliveries)."""
    metrics_port: Annotated[int | None, dataclasses.replace(METRICS_PORT, parse=port_or_off)] = None
    """``--metrics-port`` / ``GPUSHARE_METRICS_PORT``: serve Prometheus ``/metrics`` there
    (None: not served; 0: any free port)."""
    consumer: str = BINDER_CONSUMER
    """Name of the durable JetStream consumer all binder replicas share (NATS permissions
    let binders use only :data:`~gpushare.bus.permissions.BINDER_CONSUMER`)."""
    fetch_batch: int = 16
    """Reservations fetched at a time."""
    bindings_in_flight: int = 64
    """Reservations handled at once (each on its own: one waiting for its node's agent
    holds only its own place)."""
    fetch_wait_s: float = 1.0
    """How long one fetch waits for new messages; a stop waits at most this long for it."""
    ack_wait_s: Annotated[
        float,
        Setting(
            flag="--ack-wait",
            parse=number(float, low=1),
            help="seconds after which a reservation a binder took but never answered (it "
            "died) goes to another binder replica; set it when the shared consumer is "
            "first made",
        ),
    ] = 60.0
    """``--ack-wait``: JetStream redelivers a reservation not acknowledged this long after
    delivery (the durable consumer all binders share keeps the value it was made with)."""
    bind_attempts: int = 5
    """Deliveries of a reservation that may fail temporarily before ``BindFailed``."""
    retry_delay_s: float = 2.0
    """Delay before redelivering a reservation whose bind failed temporarily."""
    fold_wait_s: float = 2.0
    """How long a reservation waits for the binder's own fold to reach it."""
    watch_timeout_s: int = 60
    """Seconds one pod watch request lasts before it is renewed from its resourceVersion."""
    relist_delay_s: float = 2.0
    """Pause before listing pods again after the API failed; it doubles with each failure
    in a row, up to 30 s, and comes back once two minutes pass without one."""
    capacity_resync_s: float = 300.0
    """A node's ``aliyun.com/gpu-count`` is rewritten at least this often, even unchanged."""
    sync_devices: Annotated[
        bool,
        Setting(
            flag="--sync-devices",
            kind="negatable",
            help="keep a gpushare.io Device custom resource per node (kubectl get devices)",
        ),
    ] = True
    """``--sync-devices`` / ``--no-sync-devices``: keep a ``Device`` custom resource per node."""
    device_sync_interval_s: Annotated[
        float,
        Setting(
            flag="--device-sync-interval",
            parse=SECONDS,
            help="write a node's Device at most every this many seconds",
        ),
    ] = 5.0
    """``--device-sync-interval``: a node's Device is written at most this often."""
    device_resync_s: float = 300.0
    """Every Device is compared with the API this often (and gone nodes' Devices deleted);
    so is every ResourceSlice of our DRA driver."""
    dra: Annotated[
        bool,
        Setting(
            flag="--dra",
            kind="negatable",
            help="publish DRA nodes' cards as ResourceSlices and record their claims' "
            "allocations in the log (needs resource.k8s.io/v1, Kubernetes 1.34+)",
        ),
    ] = True
    """``--dra`` / ``--no-dra``: serve the nodes labelled ``gpushare.io/front-door=dra``
    through Dynamic Resource Allocation (``docs/dra.md``)."""
    slice_check_s: float = 5.0
    """Published slices are checked this often for a node gone silent."""
    claim_recheck_s: float = 30.0
    """Every claim is compared with the log at least this often (changes wake it sooner)."""
