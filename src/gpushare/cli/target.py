"""Which NATS the operator commands (``audit``, ``inspect``, ``explain``) talk to.

``--nats URL`` wins; else ``GPUSHARE_NATS_URL``; else the stack that ``gpushare up`` runs
from the current directory (it leaves ``.gpushare/stack.json`` while it is up); else
``nats://127.0.0.1:4222``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

from gpushare.flags import DEFAULT_NATS_URL

STACK_FILE = Path(".gpushare") / "stack.json"
"""Written by ``gpushare up`` into its data directory while the stack runs."""


def stack_file(data_dir: Path) -> Path:
    return data_dir / STACK_FILE.name


def write_stack_file(data_dir: Path, **facts: str) -> Path:
    """Record a running stack's addresses for the operator commands run beside it."""
    path = stack_file(data_dir)
    path.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return path


def running_stack(cwd: Path) -> dict[str, str]:
    """What ``gpushare up`` recorded in ``cwd``'s ``.gpushare/`` ({} when none is up)."""
    try:
        facts = json.loads((cwd / STACK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(facts, dict):
        return {}
    return {str(key): str(value) for key, value in facts.items()}


def default_nats_url(environ: Mapping[str, str], cwd: Path) -> str:
    if environ.get("GPUSHARE_NATS_URL"):
        return environ["GPUSHARE_NATS_URL"]
    return running_stack(cwd).get("nats_url", DEFAULT_NATS_URL)


def add_target_flags(
    parser: argparse.ArgumentParser,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> None:
    """``--nats`` (resolved as the module says) and ``--json``."""
    environ = os.environ if environ is None else environ
    url = default_nats_url(environ, Path.cwd() if cwd is None else cwd)
    parser.add_argument(
        "--nats",
        default=url,
        help="NATS URL(s), comma-separated (default: GPUSHARE_NATS_URL, else the stack "
        f"`gpushare up` runs here, else {DEFAULT_NATS_URL}; now %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (lines) instead of text")
