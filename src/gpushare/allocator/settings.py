"""The allocator's settings, declared with their flags: read once in ``__main__``, passed down."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

from gpushare.core.policies import policy_names
from gpushare.core.policies.workload import DEFAULT_POLICY
from gpushare.core.quantity import parse_count
from gpushare.flags import DEFAULT_NATS_URL, MEMORY_UNIT, NATS, STREAM_REPLICAS
from gpushare.kube.client import IN_CLUSTER
from gpushare.settings_spec import Group, Setting, SettingsError, number

MemoryUnit = Literal["MiB", "GiB"]


DEFAULT_PORT = 39999
URL_PREFIX = "/gpushare-scheduler"
"""kube-scheduler's ``urlPrefix`` path for this extender (the verbs are appended to it)."""
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""16 MiB: the largest request body any endpoint reads (``--max-body-bytes``).

What the largest legitimate calls need:

* filter/prioritize with ``nodeCacheCapable: false`` carry full Node objects. A real
  node is 5-30 KiB of JSON (labels, 50 images, conditions, managedFields); the recorded
  kube-scheduler call's hand-made nodes are 2.4 KiB each. kube-scheduler sends only the
  nodes its own filters passed, sampled: at most about 800 under the default
  ``percentageOfNodesToScore``, every node at 100. 16 MiB carries 550 nodes of 30 KiB,
  1,000 of 16 KiB; a larger cluster in that mode needs a larger limit (or, as
  ``deploy/`` does, ``nodeCacheCapable: true``: 5,000 names are about 300 KiB).
* An AdmissionReview holds the pod twice at most (``object`` and ``oldObject``); the
  kube-apiserver stores no object over 1.5 MiB (etcd's request limit) and reads no
  request over 3 MiB.
* bind is a few hundred bytes.

Each request's body is held once while it is read (the limit bounds that), then
decoded; a few concurrent maximal filter calls stay well inside the 1 GiB the
deployment gives the allocator.
"""
MIN_MAX_BODY_BYTES = 64 * 1024
"""The smallest ``--max-body-bytes`` accepted: one pod (of a few KiB to tens) must fit."""


def byte_size(text: str) -> int:
    """A number of bytes, ``16777216``, or a quantity, ``16Mi``; at least 64Ki."""
    size = parse_count(text)
    if size < MIN_MAX_BODY_BYTES:
        raise SettingsError(f"{text}: must be at least {MIN_MAX_BODY_BYTES} (64Ki)")
    return size


def existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise SettingsError(f"{text}: no such file")
    return text


def parse_policy(text: str) -> str:
    if text not in policy_names():
        raise SettingsError(f"unknown policy {text!r}; known: {', '.join(sorted(policy_names()))}")
    return text


def default_kubeconfig(environ: Mapping[str, str]) -> str | None:
    """``KUBECONFIG``'s first file, else the service account when running in a pod, else none."""
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"].split(os.pathsep)[0]
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return IN_CLUSTER
    return None


class TlsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """HTTPS for the extender and the webhook; files are re-read when they change."""

    cert_file: Annotated[
        str,
        Setting(
            flag="--tls-cert-file",
            env="GPUSHARE_TLS_CERT_FILE",
            parse=existing_file,
            help="PEM certificate chain, leaf first: serves HTTPS (none: plain HTTP)",
        ),
    ]
    """PEM certificate chain, leaf first (``--tls-cert-file``, ``GPUSHARE_TLS_CERT_FILE``)."""
    key_file: Annotated[
        str,
        Setting(
            flag="--tls-key-file",
            env="GPUSHARE_TLS_KEY_FILE",
            parse=existing_file,
            help="PEM private key of --tls-cert-file",
        ),
    ]
    """PEM private key of ``cert_file`` (``--tls-key-file``, ``GPUSHARE_TLS_KEY_FILE``)."""
    client_ca_file: Annotated[
        str | None,
        Setting(
            flag="--tls-client-ca-file",
            env="GPUSHARE_TLS_CLIENT_CA_FILE",
            parse=existing_file,
            shown_default="none required",
            help="PEM CA bundle: require client certificates it signed",
        ),
    ] = None
    """PEM CA bundle; when set, clients must present a certificate it signed
    (``--tls-client-ca-file``, ``GPUSHARE_TLS_CLIENT_CA_FILE``). Default: none asked."""
    reload_seconds: Annotated[
        float,
        Setting(
            flag="--tls-reload-interval",
            parse=number(float, low=0),
            help="seconds between checks of the TLS files for a rotation; 0: never",
        ),
    ] = 30.0
    """How often the files are checked for a rotation (``--tls-reload-interval``); 0: never."""


def default_replica_id() -> str:
    """``hostname-pid``: unique per process, readable in the log's ``reserved_by``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class AllocatorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything an allocator replica needs to know, with its defaults."""

    nats_url: Annotated[str, NATS] = DEFAULT_NATS_URL
    """NATS server(s), comma-separated (``--nats``, ``GPUSHARE_NATS_URL``)."""
    host: Annotated[str, Setting(flag="--host", help="listen address")] = "0.0.0.0"
    """Address the extender HTTP server listens on (``--host``)."""
    port: Annotated[
        int, Setting(flag="--port", env="GPUSHARE_PORT", parse=int, help="listen port")
    ] = DEFAULT_PORT
    """Port of the extender HTTP server (``--port``, ``GPUSHARE_PORT``); 0 picks a free one."""
    memory_unit: Annotated[MemoryUnit, MEMORY_UNIT] = "MiB"
    """Unit of ``aliyun.com/gpu-mem`` in pod specs, cluster-wide (``--memory-unit``)."""
    stream_replicas: Annotated[int, STREAM_REPLICAS] = 1
    """JetStream replicas of the streams it creates (``--stream-replicas``)."""
    kubeconfig: Annotated[
        str | None,
        Setting(
            flag="--kubeconfig",
            env="KUBECONFIG",
            read_env=default_kubeconfig,
            shown_default="in-cluster inside a pod, else none",
            help="kubeconfig path, or 'in-cluster': lets bind read pods that filter never saw",
        ),
    ] = None
    """Kubeconfig path, or ``in-cluster``; enables reading pods at bind that filter never saw.

    ``__main__`` defaults it to ``KUBECONFIG``, else ``in-cluster`` inside a pod.
    """
    dra_scoring: Annotated[
        bool,
        Setting(
            flag="--dra-scoring",
            kind="negatable",
            help="score nodes for pods whose DRA claims ask DeviceClass gpu.gpushare.io "
            "(reads ResourceClaims and ResourceClaimTemplates; needs --kubeconfig and an "
            "extender stanza without managedResources: docs/dra.md)",
        ),
    ] = False
    """``--dra-scoring``: prioritize ranks nodes for DRA pods by our policy, judging the card
    kube-scheduler's first fit will take (``docs/dra.md``)."""
    replica_id: Annotated[
        str,
        Setting(
            flag="--id",
            shown_default="hostname-pid",
            help="replica name, written as reserved_by on its reservations",
        ),
    ] = msgspec.field(default_factory=default_replica_id)
    """This replica's name, written as ``reserved_by`` on its reservations (``--id``)."""
    bind_wait_seconds: Annotated[
        float,
        Setting(
            flag="--bind-wait",
            parse=number(float, above=0),
            help="seconds bind waits for the binder's verdict",
        ),
    ] = 10.0
    """How long bind waits for the binder's ``PodBound``/``BindFailed`` (``--bind-wait``).

    Keep it below kube-scheduler's extender ``httpTimeout`` (5 s by default: raise it).
    """
    bind_attempts: int = 8
    """Decisions per bind before giving up on a node other writers keep appending to."""
    pod_cache_size: int = 10_000
    """Pods remembered from filter (UID → request) so bind needs no API read."""
    url_prefix: str = URL_PREFIX
    """Path prefix of the extender verbs, as in kube-scheduler's ``urlPrefix``."""
    policy: Annotated[
        str,
        Setting(
            flag="--policy",
            env="GPUSHARE_POLICY",
            parse=parse_policy,
            help="placement policy (a pod may name another in gpushare.io/policy): "
            + ", ".join(sorted(policy_names())),
        ),
    ] = DEFAULT_POLICY
    """The cluster's placement policy (``--policy``, ``GPUSHARE_POLICY``); a pod may name
    another in its ``gpushare.io/policy`` annotation."""
    choose_in_filter: Annotated[
        bool,
        Setting(
            flag="--choose-in-filter",
            kind="negatable",
            help="filter answers only the node the policy places a GPU pod best on, so "
            "kube-scheduler skips prioritize and its own scores; pods whose spec states "
            "preferences (preferred affinity, ScheduleAnyway spreading) get every node that "
            "fits, and prioritize",
        ),
    ] = True
    """Filter answers only the best node for a GPU pod (``--choose-in-filter``; default on).

    kube-scheduler skips scoring when one node passes its filters and extenders
    (``schedule_one.go``), so the pod lands exactly where the policy places it best, by
    the policy's own value rather than its 0..10 rounding mixed with kube-scheduler's
    scores (whose default, least-allocated, spreads pods and so works against packing),
    and a scheduling cycle makes one call to the extender instead of two. A pod whose
    spec states a preference only scores weigh (preferred node or pod (anti-)affinity, a
    ``ScheduleAnyway`` spread constraint) gets every node that fits, and prioritize,
    as with ``--no-choose-in-filter`` for every pod; ``PreferNoSchedule`` taints and
    kube-scheduler's default spreading are then the only scores GPU pods do without.
    """
    card_metrics: Annotated[
        bool,
        Setting(
            flag="--card-metrics",
            kind="negatable",
            help="export seven gauges per card on /metrics (gpushare_allocator_card_*); "
            "--no-card-metrics leaves them out (10,000 nodes of 8 cards: 560,000 samples, "
            "45 MiB a scrape)",
        ),
    ] = True
    """The per-card gauges on ``/metrics`` (``--card-metrics``; default on). Every replica
    exports every card of the cluster; on a large cluster scrape them from one replica,
    or switch them off where the reporters' ``gpushare_reporter_cards`` and the node
    agents' metrics suffice."""
    core_weight: Annotated[
        float,
        Setting(
            flag="--core-weight",
            parse=number(float, low=0, high=1),
            help="weight of core against memory in binpack/spread scores, 0..1 (seed 003)",
        ),
    ] = 0.2
    """Weight of core against memory in binpack/spread scores (``--core-weight``, seed 003)."""
    max_containers_per_card: Annotated[
        int,
        Setting(
            flag="--max-containers-per-card",
            parse=number(int, low=1),
            help="most containers one card may hold (seed 003)",
        ),
    ] = 16
    """Most containers one card may hold (``--max-containers-per-card``, seed 003)."""
    max_body_bytes: Annotated[
        int,
        Setting(
            flag="--max-body-bytes",
            env="GPUSHARE_MAX_BODY_BYTES",
            parse=byte_size,
            shown_default="16Mi",
            help="largest request body read, in bytes or as a quantity (32Mi); larger ones are "
            "refused with 413",
        ),
    ] = DEFAULT_MAX_BODY_BYTES
    """Largest request body read, on every endpoint (``--max-body-bytes``,
    ``GPUSHARE_MAX_BODY_BYTES``); a larger one is refused with 413, or on the admission
    webhook with an AdmissionReview that denies it. See :data:`DEFAULT_MAX_BODY_BYTES`."""
    tls: Annotated[TlsSettings | None, Group(title="HTTPS (required by the admission webhook)")] = (
        None
    )
    """Serve the extender and the admission webhook over HTTPS (``--tls-cert-file``,
    ``--tls-key-file``); ``None`` serves plain HTTP, which kube-apiserver never calls."""
    inspect_open: Annotated[
        bool,
        Setting(
            flag="--inspect-open",
            env="GPUSHARE_INSPECT_OPEN",
            kind="switch",
            help="answer GET .../inspect (every pod's placement) without a client certificate "
            "(the variable: true); default: 403 unless --tls-client-ca-file verified the caller",
        ),
    ] = False
    """Answer ``GET .../inspect`` (every pod's placement) to any caller (``--inspect-open``).
    Default: only to clients with a certificate the client CA signed; 403 to all others,
    hence always over plain HTTP or HTTPS without ``--tls-client-ca-file``."""
