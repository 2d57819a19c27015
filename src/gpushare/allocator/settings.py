"""The allocator's settings: read once in ``__main__`` (flags, then environment), passed down."""

from __future__ import annotations

import os
import socket
from typing import Literal

import msgspec

from gpushare.core.policies.workload import DEFAULT_POLICY
from gpushare.flags import DEFAULT_NATS_URL

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


class TlsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """HTTPS for the extender and the webhook; files are re-read when they change."""

    cert_file: str
    """PEM certificate chain, leaf first (``--tls-cert-file``, ``GPUSHARE_TLS_CERT_FILE``)."""
    key_file: str
    """PEM private key of ``cert_file`` (``--tls-key-file``, ``GPUSHARE_TLS_KEY_FILE``)."""
    client_ca_file: str | None = None
    """PEM CA bundle; when set, clients must present a certificate it signed
    (``--tls-client-ca-file``, ``GPUSHARE_TLS_CLIENT_CA_FILE``). Default: none asked."""
    reload_seconds: float = 30.0
    """How often the files are checked for a rotation (``--tls-reload-interval``); 0: never."""


def default_replica_id() -> str:
    """``hostname-pid``: unique per process, readable in the log's ``reserved_by``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class AllocatorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything an allocator replica needs to know, with its defaults."""

    nats_url: str = DEFAULT_NATS_URL
    """NATS server(s), comma-separated (``--nats``, ``GPUSHARE_NATS_URL``)."""
    host: str = "0.0.0.0"
    """Address the extender HTTP server listens on (``--host``)."""
    port: int = DEFAULT_PORT
    """Port of the extender HTTP server (``--port``, ``GPUSHARE_PORT``); 0 picks a free one."""
    memory_unit: MemoryUnit = "MiB"
    """Unit of ``aliyun.com/gpu-mem`` in pod specs, cluster-wide (``--memory-unit``)."""
    stream_replicas: int = 1
    """JetStream replicas of the streams it creates (``--stream-replicas``)."""
    kubeconfig: str | None = None
    """Kubeconfig path, or ``in-cluster``; enables reading pods at bind that filter never saw.

    ``__main__`` defaults it to ``KUBECONFIG``, else ``in-cluster`` inside a pod.
    """
    replica_id: str = msgspec.field(default_factory=default_replica_id)
    """This replica's name, written as ``reserved_by`` on its reservations (``--id``)."""
    bind_wait_seconds: float = 10.0
    """How long bind waits for the binder's ``PodBound``/``BindFailed`` (``--bind-wait``).

    Keep it below kube-scheduler's extender ``httpTimeout`` (5 s by default: raise it).
    """
    bind_attempts: int = 8
    """Decisions per bind before giving up on a node other writers keep appending to."""
    pod_cache_size: int = 10_000
    """Pods remembered from filter (UID → request) so bind needs no API read."""
    url_prefix: str = URL_PREFIX
    """Path prefix of the extender verbs, as in kube-scheduler's ``urlPrefix``."""
    policy: str = DEFAULT_POLICY
    """The cluster's placement policy (``--policy``, ``GPUSHARE_POLICY``); a pod may name
    another in its ``gpushare.io/policy`` annotation."""
    core_weight: float = 0.2
    """Weight of core against memory in binpack/spread scores (``--core-weight``, seed 003)."""
    max_containers_per_card: int = 16
    """Most containers one card may hold (``--max-containers-per-card``, seed 003)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body read, on every endpoint (``--max-body-bytes``,
    ``GPUSHARE_MAX_BODY_BYTES``); a larger one is refused with 413, or on the admission
    webhook with an AdmissionReview that denies it. See :data:`DEFAULT_MAX_BODY_BYTES`."""
    tls: TlsSettings | None = None
    """Serve the extender and the admission webhook over HTTPS (``--tls-cert-file``,
    ``--tls-key-file``); ``None`` serves plain HTTP, which kube-apiserver never calls."""
    inspect_open: bool = False
    """Answer ``GET .../inspect`` (every pod's placement) to any caller (``--inspect-open``).
    Default: only to clients with a certificate the client CA signed; 403 to all others,
    hence always over plain HTTP or HTTPS without ``--tls-client-ca-file``."""
