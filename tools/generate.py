"""Regenerate (or, with ``--check``, verify) every generated file in the repository."""

from __future__ import annotations

import importlib
import sys

GENERATORS = (
    "tools.generate_schemas",
    "tools.generate_proto",
    "tools.generate_nats_auth",
    "tools.generate_settings",
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    status = 0
    for name in GENERATORS:
        module = importlib.import_module(name)
        status |= module.main(list(args))
    return status


if __name__ == "__main__":
    sys.exit(main())
