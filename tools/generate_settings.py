"""Write ``services/<service>/settings.md`` from each service's settings struct; ``--check``
fails on drift.

The tables come from the ``Setting`` declarations on the structs
(:mod:`gpushare.settings_spec`): the same declarations the services' flags and environment
reading are derived from, so the documentation cannot say otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpushare.allocator.settings import AllocatorSettings
from gpushare.binder.settings import BinderSettings
from gpushare.node_agent.settings import AgentSettings
from gpushare.reporter.settings import ReporterSettings
from gpushare.settings_spec import settings_table

ROOT = Path(__file__).resolve().parent.parent
SERVICES: dict[str, type] = {
    "allocator": AllocatorSettings,
    "binder": BinderSettings,
    "reporter": ReporterSettings,
    "node-agent": AgentSettings,
}
"""The folder under ``services/`` (the command's name) and its settings struct."""


def render(service: str, cls: type) -> str:
    return (
        f"# `gpushare {service}` settings\n\n"
        f"Generated from `{cls.__module__}.{cls.__qualname__}` by `python -m tools.generate`;"
        " do not edit.\n\n"
        "A flag wins over its environment variable, which wins over the default; an empty\n"
        "variable counts as unset. A bad value, from either, exits with status 2 and says why.\n"
        f"`gpushare {service} --help` prints the same.\n\n" + settings_table(cls)
    )


def expected_files() -> dict[Path, str]:
    return {
        ROOT / "services" / service / "settings.md": render(service, cls)
        for service, cls in SERVICES.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a settings.md is stale")
    args = parser.parse_args(argv)
    drift = []
    for path, text in expected_files().items():
        if (path.read_text() if path.exists() else None) == text:
            continue
        drift.append(str(path.relative_to(ROOT)))
        if not args.check:
            path.write_text(text)
    if args.check and drift:
        print(f"out of date: {', '.join(drift)}; run `make generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
