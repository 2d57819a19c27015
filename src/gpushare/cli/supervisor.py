"""``gpushare up`` keeps its stack running: a service that dies is started again.

A process that exits without being stopped on purpose (a crash, an OOM kill, an operator's
``kill -9``) is logged with why (its exit code or signal) and its log's tail, and started
again with the arguments and environment it had, after a backoff that doubles with each
crash (``backoff``, ``2 * backoff``, ... up to ``max_backoff``). nats-server is restarted
the same way on its port and store. Only a crash loop, ``limit`` crashes of one process
within ``window`` seconds, stops the whole stack (:class:`CrashLoop`, with the reason).

Every change is written to ``<data dir>/services.json`` (:data:`SERVICES_FILE`): each
process's state (``running``, ``restarting``, ``stopped``), pid, restarts, last exit and
metrics port, with ``gpushare up``'s own pid; ``gpushare status`` reads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from gpushare.cli.stack import Stack
from gpushare.embedded.nats_server import exit_reason

SERVICES_FILE = "services.json"
NATS = "nats-server"
DEFAULT_BACKOFF_S = 0.5
DEFAULT_MAX_BACKOFF_S = 30.0
DEFAULT_CRASH_LIMIT = 5
DEFAULT_CRASH_WINDOW_S = 60.0


class CrashLoop(RuntimeError):
    """One process crashed ``limit`` times within ``window`` seconds: the stack stops."""


def services_file(data_dir: Path) -> Path:
    return data_dir / SERVICES_FILE


def pid_alive(pid: object) -> bool:
    """Whether a process of that id exists (one of another user's counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def up_pid(data_dir: Path) -> object:
    """The pid of the ``gpushare up`` that supervises ``data_dir`` (None when none wrote it)."""
    try:
        return json.loads(services_file(data_dir).read_text()).get("up_pid")
    except (OSError, ValueError, AttributeError):
        return None


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class ServiceState:
    """What ``gpushare status`` shows of one process."""

    state: str = "running"
    pid: int | None = None
    restarts: int = 0
    last_exit: str | None = None
    """``killed by SIGKILL``, ``exited with 1``; None while it never died."""
    last_exit_at: str | None = None
    metrics_port: int | None = None


@dataclass
class Supervisor:
    """Watches a started :class:`Stack`; call :meth:`poll` often (every half second)."""

    stack: Stack
    backoff: float = DEFAULT_BACKOFF_S
    max_backoff: float = DEFAULT_MAX_BACKOFF_S
    limit: int = DEFAULT_CRASH_LIMIT
    window: float = DEFAULT_CRASH_WINDOW_S
    out: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    services: dict[str, ServiceState] = field(default_factory=dict)
    crashes: dict[str, deque[float]] = field(default_factory=dict)
    restart_at: dict[str, float] = field(default_factory=dict)
    """When each crashed process is due to start again."""

    def __post_init__(self) -> None:
        for name, process in self.stack.processes.items():
            port = self.stack.metrics_ports.get(name)
            self.services[name] = ServiceState(pid=process.pid, metrics_port=port)
        nats = self.stack.nats.process if self.stack.nats is not None else None
        self.services[NATS] = ServiceState(pid=nats.pid if nats else None)
        self.write()

    @property
    def path(self) -> Path:
        return services_file(self.stack.config.data_dir)

    def poll(self) -> None:
        """Notice crashes, start what is due again; raises :class:`CrashLoop`."""
        changed = False
        for name, code in self._crashed().items():
            self._crash(name, code)
            changed = True
        now = self.clock()
        for name, due in list(self.restart_at.items()):
            if now >= due:
                del self.restart_at[name]
                self._restart(name)
                changed = True
        if changed:
            self.write()

    def _crashed(self) -> dict[str, int]:
        crashed = {n: c for n, c in self.stack.exited().items() if n not in self.restart_at}
        nats = self.stack.nats.process if self.stack.nats is not None else None
        if NATS not in self.restart_at and nats is not None and nats.poll() is not None:
            crashed[NATS] = nats.returncode
        return crashed

    def _crash(self, name: str, code: int) -> None:
        reason = exit_reason(code)
        now = self.clock()
        times = self.crashes.setdefault(name, deque())
        times.append(now)
        while times and now - times[0] > self.window:
            times.popleft()
        state = self.services.setdefault(name, ServiceState())
        state.last_exit, state.last_exit_at, state.pid = reason, now_text(), None
        tail = self.stack.log_tail(name)
        if len(times) >= self.limit:
            state.state = "stopped"
            self.write()
            raise CrashLoop(
                f"{name} is crash-looping: {len(times)} crashes within {self.window:.0f}s "
                f"(last: {reason}); stopping the stack. Its log ends:\n{tail}"
            )
        delay = min(self.max_backoff, self.backoff * 2 ** (len(times) - 1))
        state.state = "restarting"
        if name != NATS:
            self.stack.down.add(name)  # not a failure any more: it is being handled
        self.restart_at[name] = now + delay
        print(
            f"gpushare up: {name} {reason}; restarting it in {delay:.1f}s "
            f"(restart {state.restarts + 1}). Its log ends:\n{tail}",
            file=self.out,
            flush=True,
        )

    def _restart(self, name: str) -> None:
        state = self.services[name]
        if name == NATS:
            try:
                self.stack.restart_nats(hard=True)
            except RuntimeError as error:
                print(f"gpushare up: {NATS} did not start again: {error}", file=self.out)
                self._crash(NATS, 1)
                return
            assert self.stack.nats is not None
            assert self.stack.nats.process is not None
            pid = self.stack.nats.process.pid
        else:
            pid = self.stack.spawn(name, self.stack.argv[name]).pid
        state.state, state.pid = "running", pid
        state.restarts += 1
        print(f"gpushare up: {name} started again (pid {pid})", file=self.out, flush=True)

    def stopped(self) -> None:
        """Record that the whole stack stopped."""
        for state in self.services.values():
            state.state, state.pid = "stopped", None
        self.write(up_pid=None)

    def write(self, up_pid: int | None = -1) -> None:
        """``services.json``, atomically (``gpushare status`` may read it meanwhile)."""
        facts = {
            "up_pid": os.getpid() if up_pid == -1 else up_pid,
            "updated": now_text(),
            "services": {name: asdict(state) for name, state in self.services.items()},
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        temporary.replace(self.path)
