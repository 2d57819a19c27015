"""``gpushare status``: each process of the ``gpushare up`` running beside it.

    gpushare status                      # the stack of ./.gpushare
    gpushare status --data-dir DIR --json

One line per process: its state (``running``; ``restarting`` after a crash, until its
backoff ends; ``stopped``), pid, how often ``gpushare up`` restarted it, how it last
exited (``killed by SIGKILL``, ``exited with 1``) and when, and its metrics port.

Exit codes: 0 when ``gpushare up`` runs and every process is running, 1 when a process
is not, 3 when no ``gpushare up`` runs there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpushare.cli.supervisor import pid_alive, services_file

NOT_UP = 3
COLUMNS = ("NAME", "STATE", "PID", "RESTARTS", "LAST EXIT", "METRICS")


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="gpushare status", description=__doc__.split("\n\n")[0])
    parse.add_argument(
        "--data-dir", type=Path, default=Path(".gpushare"), help="gpushare up's (default .gpushare)"
    )
    parse.add_argument("--json", action="store_true", help="print services.json as it is")
    return parse


def rows(services: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    def cell(value: object) -> str:
        return "-" if value is None else str(value)

    table: list[tuple[str, ...]] = []
    for name, state in sorted(services.items()):
        last = state.get("last_exit")
        if last and state.get("last_exit_at"):
            last = f"{last} at {state['last_exit_at']}"
        port = state.get("metrics_port")
        table.append(
            (
                name,
                cell(state.get("state")),
                cell(state.get("pid")),
                cell(state.get("restarts", 0)),
                cell(last),
                f":{port}/metrics" if port else "-",
            )
        )
    return table


def render(table: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in [COLUMNS, *table]) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in [COLUMNS, *table]
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    path = services_file(args.data_dir)
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        print(f"gpushare status: no gpushare up has run in {args.data_dir}", file=sys.stderr)
        return NOT_UP
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
    up_pid = facts.get("up_pid")
    services: dict[str, dict[str, Any]] = facts.get("services") or {}
    if not pid_alive(up_pid):
        print(f"gpushare status: gpushare up is not running in {args.data_dir}", file=sys.stderr)
        return NOT_UP
    if not args.json:
        print(f"gpushare up (pid {up_pid}), as of {facts.get('updated')}:")
        print(render(rows(services)))
    return 0 if all(s.get("state") == "running" for s in services.values()) else 1
