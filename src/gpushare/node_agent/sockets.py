"""The unix socket path limit: a path longer than 107 bytes cannot be bound nor connected
to (``sun_path`` holds 108 bytes with its NUL), and gRPC only says it failed to bind, again
at every retry. The node agent refuses to start on such a path instead. Pure."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpushare.node_agent.settings import NodeTarget

UNIX_PATH_MAX = 107
"""The longest unix socket path, in bytes (Linux ``sizeof(sun_path) - 1``)."""


def socket_path_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a unix socket (too long), or None when it can."""
    length = len(os.fsencode(path.absolute()))
    if length <= UNIX_PATH_MAX:
        return None
    return (
        f"unix socket path {path.absolute()} is {length} bytes, over the {UNIX_PATH_MAX}-byte "
        "limit of unix sockets: use a shorter directory"
    )


def target_sockets(target: NodeTarget, resources: Iterable[str]) -> list[Path]:
    """Every unix socket the agent binds or connects to for ``target``."""
    plugins = [target.socket_of(resource) for resource in resources]
    dra = [target.dra_socket, target.dra_registration_socket]
    return [*plugins, target.kubelet_socket, target.pod_resources, *dra]


def socket_problems(targets: Sequence[NodeTarget], resources: Sequence[str]) -> list[str]:
    """Each socket path of ``targets`` that is too long, said why."""
    paths = [path for target in targets for path in target_sockets(target, resources)]
    return [problem for path in paths if (problem := socket_path_problem(path))]
