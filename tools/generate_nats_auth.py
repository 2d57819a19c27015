"""Write ``deploy/base/nats/auth.conf`` (NATS users and permissions); ``--check`` fails
on drift.

The users come from :mod:`gpushare.bus.permissions`, one ``node-<name>`` user for each
node listed in ``deploy/base/nats/nodes.txt`` (an overlay renders its own nodes with
``--nodes FILE --out FILE``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpushare.bus.permissions import render_auth_conf, users

ROOT = Path(__file__).resolve().parent.parent
NATS_DIR = ROOT / "deploy" / "base" / "nats"
NODES = NATS_DIR / "nodes.txt"
AUTH_CONF = NATS_DIR / "auth.conf"


def read_nodes(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def expected_text(nodes_file: Path = NODES) -> str:
    return render_auth_conf(users(read_nodes(nodes_file)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if auth.conf is out of date")
    parser.add_argument("--nodes", type=Path, default=NODES, help="node names, one a line")
    parser.add_argument("--out", type=Path, default=AUTH_CONF, help="where to write it")
    args = parser.parse_args(argv)
    text = expected_text(args.nodes)
    current = args.out.read_text() if args.out.exists() else None
    if current == text:
        return 0
    if args.check:
        print(f"{args.out} out of date; run `make generate`", file=sys.stderr)
        return 1
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
