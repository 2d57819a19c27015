"""Running an operator command's ``main`` against the per-test nats-server, capturing output."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog
from gpushare.core.events import ContainerAssigned, PodBound, PodReleased, PodReserved
from gpushare.core.model import ContainerShare, PodRef

WEB = PodRef(namespace="default", name="web", uid="uid-web")


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


async def run_main(
    main: Callable[[list[str]], int], args: list[str], url: str, capsys: pytest.CaptureFixture[str]
) -> Ran:
    """``main(args + --nats url)`` in a thread (it runs its own event loop, as from a shell)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, [*args, "--nats", url])
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)


async def stored_messages(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.messages)


def now() -> datetime:
    return datetime.now(UTC)


def share(node: str, index: int, mib: int, container: str = "main") -> ContainerShare:
    return ContainerShare(
        container=container, card_index=index, card_uuid=f"GPU-{node}-{index}", memory_mib=mib
    )


async def web_lifecycle(js: JetStreamContext, node: str = "N3", *, release: bool = False) -> None:
    """``default/web`` reserved on ``node``'s GPU0 (8138 MiB), bound and assigned (released)."""
    log = AllocationLog(js)
    common: dict[str, Any] = {"at": now(), "node": node, "pod": WEB}
    await log.append(
        PodReserved(id="r-web", shares=(share(node, 0, 8138),), reserved_by="allocator-a", **common)
    )
    await log.append(PodBound(id="b-web", reservation_id="r-web", **common))
    await log.append(
        ContainerAssigned(
            id="a-web",
            reservation_id="r-web",
            container="main",
            card_uuids=(f"GPU-{node}-0",),
            **common,
        )
    )
    if release:
        await log.append(
            PodReleased(id="x-web", reservation_id="r-web", reason="deleted", **common)
        )


class Sink(io.StringIO):
    """What a command running as a task (in this event loop) has printed so far."""

    def __init__(self) -> None:
        super().__init__()
        self._written = asyncio.Event()

    def write(self, text: str) -> int:
        self._written.set()
        return super().write(text)

    @property
    def lines(self) -> list[str]:
        return self.getvalue().splitlines()

    async def wait_for(self, condition: Callable[[list[str]], bool]) -> None:
        """Until what was printed satisfies ``condition`` (the test's timeout bounds it)."""
        while not condition(self.lines):
            self._written.clear()
            await self._written.wait()
