"""``gpushare <command>``: one entry point for every service and tool.

Each command lives in its own module and exposes ``main(argv) -> int``; they are
imported only when run, so ``gpushare reporter`` never loads FastAPI or gRPC.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("gpushare.cli.up", "run NATS, the four services, simulated nodes and a Kubernetes API"),
    "status": ("gpushare.cli.status", "each process of gpushare up: state, pid, restarts"),
    "demo": ("gpushare.cli.demo", "bring the stack up, replay seed 000's examples, print results"),
    "allocator": ("gpushare.allocator.__main__", "the extender HTTP service"),
    "binder": ("gpushare.binder.__main__", "the Kubernetes API writer"),
    "reporter": ("gpushare.reporter.__main__", "publish GPU inventory (NVML or simulated)"),
    "node-agent": ("gpushare.node_agent.__main__", "the kubelet device plugin"),
    "audit": ("gpushare.cli.audit", "print (or --follow) the allocation log's events"),
    "inspect": ("gpushare.cli.inspect", "GPU memory allocated per card, now or --at a past point"),
    "explain": ("gpushare.cli.explain", "one pod's story: decisions, reservations, where it is"),
    "bench": ("gpushare.tracebench.cli", "bench trace: replay an Alibaba GPU trace (FGD protocol)"),
    "kube-api": ("gpushare.embedded.kube_api", "a local stand-in for the Kubernetes API"),
    "kubelet": ("gpushare.embedded.kubelet", "a test kubelet that calls the device plugin"),
}


def usage() -> str:
    lines = ["usage: gpushare <command> [options]", "", "commands:"]
    lines += [f"  {name:<11} {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"gpushare: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
