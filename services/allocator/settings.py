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
    tls: TlsSettings | None = None
    """Serve the extender and the admission webhook over HTTPS (``--tls-cert-file``,
    ``--tls-key-file``); ``None`` serves plain HTTP, which kube-apiserver never calls."""
