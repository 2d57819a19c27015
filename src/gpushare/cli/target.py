"""Which NATS the operator commands (``audit``, ``inspect``, ``explain``) talk to, and how.

``--nats URL`` wins (credentials from the ``GPUSHARE_NATS_*`` environment); else
``--data-dir DIR``, the data directory of a running ``gpushare up``: its ``stack.json``
gives the URL, and the stack's auditor credentials and CA; else ``GPUSHARE_NATS_URL``;
else the stack ``gpushare up`` runs from the current directory (``.gpushare/stack.json``,
read the same way); else ``nats://127.0.0.1:4222``.

A ``--data-dir`` with no ``stack.json``, or whose stack's process is gone or whose NATS
does not answer, is said at once, in one line (:class:`NoStack`). ``--connect-timeout``
and ``--tls-server-name`` bound and steer the connection (:mod:`gpushare.bus.connection`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.bus import credentials as variables
from gpushare.bus.connection import DEFAULT_CONNECT_TIMEOUT_S, ConnectOptions
from gpushare.bus.credentials import NatsCredentials
from gpushare.cli.supervisor import pid_alive, up_pid
from gpushare.flags import DEFAULT_NATS_URL

STACK_FILE = Path(".gpushare") / "stack.json"
"""Written by ``gpushare up`` into its data directory while the stack runs."""
URL_VARIABLE = "GPUSHARE_NATS_URL"
IDENTITY = (variables.USER, variables.PASSWORD, variables.PASSWORD_FILE, variables.CREDS)
"""The variables that say who a command is (they win over the stack's auditor)."""


class NoStack(ConnectionError):
    """No gpushare stack runs where the command was pointed (the message says why)."""


def stack_file(data_dir: Path) -> Path:
    return data_dir / STACK_FILE.name


def write_stack_file(data_dir: Path, **facts: str) -> Path:
    """Record a running stack's addresses for the operator commands run beside it."""
    path = stack_file(data_dir)
    path.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return path


def read_stack(data_dir: Path) -> dict[str, str]:
    """What ``gpushare up`` recorded in ``data_dir`` ({} when nothing is, or unreadable)."""
    try:
        facts = json.loads(stack_file(data_dir).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(facts, dict):
        return {}
    return {str(key): str(value) for key, value in facts.items()}


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines as :func:`gpushare.embedded.secure_bus.env_text` writes them."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and "=" in words[0]:
            name, value = words[0].split("=", 1)
            found[name] = value
    return found


def stack_at(data_dir: Path) -> dict[str, str]:
    """The facts of the stack running in ``data_dir``, or :class:`NoStack` saying why not
    (no ``stack.json``; no NATS URL in it; a recorded ``pid`` that is gone)."""
    path = stack_file(data_dir)
    if not path.exists():
        raise NoStack(
            f"no gpushare stack is running in {data_dir}: no {path.name} there "
            f"(`gpushare up --data-dir {data_dir}` starts one)"
        )
    facts = read_stack(data_dir)
    if not facts.get("nats_url"):
        raise NoStack(f"no gpushare stack is running in {data_dir}: {path} names no NATS URL")
    pids = [int(facts[key]) for key in ("pid", "up_pid") if facts.get(key, "").isdigit()]
    supervisor = up_pid(data_dir)
    for pid in [*pids, *([supervisor] if isinstance(supervisor, int) else [])]:
        if not pid_alive(pid):
            raise NoStack(
                f"no gpushare stack is running in {data_dir}: its process {pid} is gone "
                f"({path} is left from a stack that stopped)"
            )
    return facts


def stack_credentials(facts: Mapping[str, str], environ: Mapping[str, str]) -> NatsCredentials:
    """Who a command is to a stack's NATS: the environment's user when it names one (with
    the stack's CA unless it names one too), else the stack's auditor (``auditor_env``),
    else anonymous over TLS checked against the stack's CA (an ``--insecure`` stack)."""
    chosen = {name: environ[name] for name in IDENTITY if environ.get(name)}
    if chosen.get(variables.USER) or chosen.get(variables.CREDS):
        ca = environ.get(variables.CA) or facts.get("nats_ca", "")
        return NatsCredentials.from_env({**chosen, variables.CA: ca})
    env_file = facts.get("auditor_env", "")
    if env_file:
        try:
            return NatsCredentials.from_env(read_env_file(Path(env_file)))
        except OSError as error:
            raise NoStack(f"cannot read the stack's auditor credentials: {error}") from None
    return NatsCredentials(ca_file=facts.get("nats_ca", ""))


@dataclass(frozen=True)
class Target:
    """Where a command connects, as whom, and how."""

    url: str
    credentials: NatsCredentials = field(default_factory=NatsCredentials)
    options: ConnectOptions = field(default_factory=ConnectOptions)
    stack_dir: Path | None = None
    """The data directory of the stack the URL was read from (None: not from a stack)."""


def resolve_target(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Target:
    """The :class:`Target` the parsed flags name (the order is the module's); raises
    :class:`NoStack` for a ``--data-dir`` where no stack runs."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    options = ConnectOptions(
        timeout_s=getattr(args, "connect_timeout", DEFAULT_CONNECT_TIMEOUT_S),
        tls_server_name=getattr(args, "tls_server_name", "") or "",
        reconnect=bool(getattr(args, "follow", False)),
    )
    if getattr(args, "nats", None):
        return Target(args.nats, NatsCredentials.from_env(environ), options)
    data_dir: Path | None = getattr(args, "data_dir", None)
    if data_dir is not None:
        facts = stack_at(data_dir)
        credentials = stack_credentials(facts, environ)
        return Target(facts["nats_url"], credentials, options, stack_dir=data_dir)
    if environ.get(URL_VARIABLE):
        return Target(environ[URL_VARIABLE], NatsCredentials.from_env(environ), options)
    here = cwd / STACK_FILE.parent
    facts = read_stack(here)
    if facts.get("nats_url"):
        credentials = stack_credentials(facts, environ)
        return Target(facts["nats_url"], credentials, options, stack_dir=here)
    return Target(DEFAULT_NATS_URL, NatsCredentials.from_env(environ), options)


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return seconds


def add_connect_flags(parser: argparse.ArgumentParser) -> None:
    """``--connect-timeout`` and ``--tls-server-name``: how to reach NATS."""
    parser.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help="give up reaching NATS after this long, saying why (default %(default)g)",
    )
    parser.add_argument(
        "--tls-server-name",
        default="",
        metavar="NAME",
        help="check NATS's TLS certificate against NAME instead of the URL's host (a "
        "port-forward to an in-cluster server: its service name)",
    )


def add_target_flags(parser: argparse.ArgumentParser) -> None:
    """``--nats``, ``--data-dir``, the connect flags and ``--json`` (resolved by
    :func:`resolve_target` after parsing)."""
    parser.add_argument(
        "--nats",
        metavar="URL",
        help="NATS URL(s), comma-separated (default: the --data-dir stack's, else "
        f"GPUSHARE_NATS_URL, else the stack `gpushare up` runs here, else {DEFAULT_NATS_URL})",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="the data directory of a running `gpushare up` (reads its stack.json: URL, CA, "
        "the auditor's credentials)",
    )
    add_connect_flags(parser)
    parser.add_argument("--json", action="store_true", help="print JSON (lines) instead of text")
