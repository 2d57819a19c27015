"""``gpushare allocator``: the kube-scheduler extender service.

Flags win over environment variables, which win over the defaults in
:class:`~gpushare.allocator.settings.AllocatorSettings`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping

from gpushare.allocator.pod_source import IN_CLUSTER
from gpushare.allocator.settings import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PORT,
    MIN_MAX_BODY_BYTES,
    AllocatorSettings,
    TlsSettings,
    default_replica_id,
)
from gpushare.core.policies import policy_names
from gpushare.core.policies.workload import DEFAULT_POLICY
from gpushare.core.quantity import parse_count
from gpushare.flags import add_memory_unit_flag, add_nats_flag, add_stream_replicas_flag
from gpushare.logs import setup_logging
from gpushare.redaction import redact_text
from gpushare.telemetry.tracing import configure_tracing

log = logging.getLogger(__name__)


def _default_kubeconfig(environ: Mapping[str, str]) -> str | None:
    """``KUBECONFIG``, else the service account when running in a pod, else no API reads."""
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"].split(os.pathsep)[0]
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return IN_CLUSTER
    return None


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare allocator",
        description="The kube-scheduler extender: filter, prioritize and bind GPU-sharing pods.",
    )
    add_nats_flag(parser, environ)
    add_stream_replicas_flag(parser, environ)
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default %(default)s)")
    parser.add_argument(
        "--port",
        type=int,
        default=environ.get("GPUSHARE_PORT", str(DEFAULT_PORT)),
        help="listen port (env GPUSHARE_PORT; default %(default)s)",
    )
    _add_tls_flags(parser, environ)
    add_memory_unit_flag(parser, environ)
    parser.add_argument(
        "--kubeconfig",
        default=_default_kubeconfig(environ),
        help="kubeconfig path, or 'in-cluster': lets bind read pods that filter never saw "
        "(env KUBECONFIG; default in-cluster inside a pod, else none)",
    )
    parser.add_argument("--id", default=None, help="replica name (default hostname-pid)")
    parser.add_argument(
        "--bind-wait",
        type=float,
        default=10.0,
        help="seconds bind waits for the binder's verdict (default %(default)s)",
    )
    parser.add_argument(
        "--policy",
        default=environ.get("GPUSHARE_POLICY", DEFAULT_POLICY),
        help="placement policy: "
        + ", ".join(sorted(policy_names()))
        + " (env GPUSHARE_POLICY; default %(default)s)",
    )
    parser.add_argument(
        "--core-weight",
        type=float,
        default=0.2,
        help="weight of core against memory in binpack/spread, 0..1 (default %(default)s)",
    )
    parser.add_argument(
        "--max-containers-per-card",
        type=int,
        default=16,
        help="most containers one card may hold (default %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=byte_size,
        default=environ.get("GPUSHARE_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES)),
        help="largest request body read, in bytes or as a quantity (32Mi); larger ones are "
        "refused with 413 (env GPUSHARE_MAX_BODY_BYTES; default %(default)s = 16Mi)",
    )
    return parser


def byte_size(text: str) -> int:
    """A number of bytes: ``16777216`` or a quantity, ``16Mi``."""
    return parse_count(text)


def _add_tls_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    tls = parser.add_argument_group("HTTPS (required by the admission webhook)")
    tls.add_argument(
        "--tls-cert-file",
        default=environ.get("GPUSHARE_TLS_CERT_FILE") or None,
        help="PEM certificate chain; serves HTTPS (env GPUSHARE_TLS_CERT_FILE; default HTTP)",
    )
    tls.add_argument(
        "--tls-key-file",
        default=environ.get("GPUSHARE_TLS_KEY_FILE") or None,
        help="PEM private key of --tls-cert-file (env GPUSHARE_TLS_KEY_FILE)",
    )
    tls.add_argument(
        "--tls-client-ca-file",
        default=environ.get("GPUSHARE_TLS_CLIENT_CA_FILE") or None,
        help="PEM CA bundle: require client certificates it signed "
        "(env GPUSHARE_TLS_CLIENT_CA_FILE; default none required)",
    )
    tls.add_argument(
        "--inspect-open",
        action="store_true",
        default=environ.get("GPUSHARE_INSPECT_OPEN", "") == "true",
        help="answer GET .../inspect (every pod's placement) without a client certificate "
        "(env GPUSHARE_INSPECT_OPEN=true; default: 403 unless --tls-client-ca-file "
        "verified the caller)",
    )
    tls.add_argument(
        "--tls-reload-interval",
        type=float,
        default=30.0,
        help="seconds between checks of the TLS files for a rotation; 0: never "
        "(default %(default)s)",
    )


def _tls_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TlsSettings | None:
    if not (args.tls_cert_file or args.tls_key_file or args.tls_client_ca_file):
        return None
    if not (args.tls_cert_file and args.tls_key_file):
        parser.error("--tls-cert-file and --tls-key-file go together")
    for flag in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            parser.error(f"--{flag.replace('_', '-')} {path}: no such file")
    if args.tls_reload_interval < 0:
        parser.error("--tls-reload-interval must not be negative")
    return TlsSettings(
        cert_file=args.tls_cert_file,
        key_file=args.tls_key_file,
        client_ca_file=args.tls_client_ca_file,
        reload_seconds=args.tls_reload_interval,
    )


def parse_settings(
    argv: list[str] | None, environ: Mapping[str, str] | None = None
) -> AllocatorSettings:
    """Settings from flags and environment; exits with status 2 on a bad flag (argparse)."""
    environ = os.environ if environ is None else environ
    parser = _parser(environ)
    args = parser.parse_args(argv)
    if args.memory_unit not in ("MiB", "GiB"):
        parser.error(f"GPUSHARE_MEMORY_UNIT must be MiB or GiB, not {args.memory_unit!r}")
    if args.bind_wait <= 0:
        parser.error("--bind-wait must be positive")
    if args.policy not in policy_names():
        parser.error(
            f"unknown --policy {args.policy!r}; known: {', '.join(sorted(policy_names()))}"
        )
    if not 0 <= args.core_weight <= 1:
        parser.error("--core-weight must be between 0 and 1")
    if args.max_containers_per_card < 1:
        parser.error("--max-containers-per-card must be at least 1")
    if args.max_body_bytes < MIN_MAX_BODY_BYTES:
        parser.error(f"--max-body-bytes must be at least {MIN_MAX_BODY_BYTES} (64Ki)")
    tls = _tls_settings(parser, args)
    return AllocatorSettings(
        nats_url=args.nats,
        stream_replicas=args.stream_replicas,
        host=args.host,
        port=args.port,
        memory_unit=args.memory_unit,
        kubeconfig=args.kubeconfig,
        replica_id=args.id or default_replica_id(),
        bind_wait_seconds=args.bind_wait,
        policy=args.policy,
        core_weight=args.core_weight,
        max_containers_per_card=args.max_containers_per_card,
        max_body_bytes=args.max_body_bytes,
        tls=tls,
        inspect_open=args.inspect_open,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    setup_logging("allocator")
    configure_tracing("gpushare-allocator")
    from gpushare.allocator.runtime import run_allocator

    try:
        return asyncio.run(run_allocator(settings))
    except Exception as error:
        shown = redact_text(str(error))
        log.error("allocator stopped: %s", shown, exc_info=log.isEnabledFor(logging.DEBUG))
        return 1


if __name__ == "__main__":
    sys.exit(main())
