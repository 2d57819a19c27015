"""``gpushare audit`` against a real nats-server: table, JSON lines, filters, follow, Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from datetime import timedelta

import pytest
from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog
from gpushare.bus.subjects import allocation_subject
from gpushare.cli import audit
from gpushare.core.events import PodReserved
from gpushare.core.model import PodRef
from gpushare.embedded.nats_server import NatsServer
from tests.integration.allocator.serving import publish
from tests.integration.cli.running import WEB, Sink, now, run_main, share, web_lifecycle
from tests.unit.allocator.builders import seed_000_filter_cluster

HEADER = ["SEQ", "TIME", "NODE", "EVENT", "POD", "RESERVATION", "DETAIL"]


async def seeded(js: JetStreamContext) -> None:
    """Seed 000's three nodes (6 occupants: seqs 1-6), then default/web on N3 (7-9)."""
    await publish(js, seed_000_filter_cluster())
    await web_lifecycle(js)


def cells(line: str) -> list[str]:
    return line.split(None, 6)


async def test_the_log_as_a_table(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(audit.main, [], nats_server.url, capsys)
    assert ran.code == 0
    assert ran.lines[0].split() == HEADER
    assert len(ran.lines) == 1 + 9
    first = cells(ran.lines[1])
    assert first[0] == "1"
    assert first[2:] == [
        "N1",
        "PodReserved",
        "occupants/N1-gpu0-occupant",
        "reserve-N1-gpu0-occupant",
        "GPU0 16276 MiB (policy binpack)",
    ]
    assert cells(ran.lines[7])[2:] == [
        "N3",
        "PodReserved",
        "default/web",
        "r-web",
        "GPU0 8138 MiB (policy binpack, by allocator-a)",
    ]
    assert cells(ran.lines[8])[2:] == ["N3", "PodBound", "default/web", "r-web"]
    assert cells(ran.lines[9])[3:] == [
        "ContainerAssigned",
        "default/web",
        "r-web",
        "container main on GPU-N3-0",
    ]
    assert ran.lines[1].index("PodReserved") == ran.lines[0].index("EVENT")  # aligned


async def test_json_lines(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(audit.main, ["--json"], nats_server.url, capsys)
    rows = [json.loads(line) for line in ran.lines]
    assert [row["seq"] for row in rows] == list(range(1, 10))
    assert set(rows[6]) == {"seq", "time", "subject", "event"}
    assert rows[6]["subject"] == "gpushare.alloc.N3.allocator"
    assert rows[6]["event"]["type"] == "PodReserved"
    assert rows[6]["event"]["pod"] == {"namespace": "default", "name": "web", "uid": "uid-web"}
    assert rows[6]["time"].endswith("Z")


@pytest.mark.parametrize(
    ("args", "seqs"),
    [
        (["--node", "N2"], [3, 4]),
        (["--pod", "default/web"], [7, 8, 9]),
        (["--node", "N3", "--pod", "occupants/N3-gpu1-occupant"], [6]),
        (["--node", "N9"], []),
        (["--since", "1h"], list(range(1, 10))),
        (["--since", (now() + timedelta(hours=1)).isoformat()], []),
    ],
    ids=["node", "pod", "node-and-pod", "unknown-node", "since-a-duration", "since-the-future"],
)
async def test_filters(
    js: JetStreamContext,
    nats_server: NatsServer,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    seqs: list[int],
) -> None:
    await seeded(js)
    ran = await run_main(audit.main, [*args, "--json"], nats_server.url, capsys)
    assert [json.loads(line)["seq"] for line in ran.lines] == seqs
    table = await run_main(audit.main, args, nats_server.url, capsys)
    assert [int(line.split()[0]) for line in table.lines[1:]] == seqs


async def test_since_a_time_between_two_events(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await publish(js, seed_000_filter_cluster())
    between = now()
    await web_lifecycle(js)
    ran = await run_main(audit.main, ["--since", between.isoformat()], nats_server.url, capsys)
    assert [line.split()[0] for line in ran.lines[1:]] == ["7", "8", "9"]


async def test_an_undecodable_message_is_a_row_with_its_error(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await web_lifecycle(js)
    await js.publish(allocation_subject("gpu.node-1"), b'{"type": "PodReserved", "id": 7}')
    ran = await run_main(audit.main, [], nats_server.url, capsys)
    assert ran.code == 0
    row = cells(ran.lines[4])
    assert row[:1] + row[2:4] == ["4", "gpu.node-1", "undecodable"]
    assert "Expected `str`, got `int`" in ran.lines[4]
    as_json = await run_main(audit.main, ["--json"], nats_server.url, capsys)
    last = json.loads(as_json.lines[-1])
    assert set(last) == {"seq", "time", "subject", "error"}
    assert last["subject"] == "gpushare.alloc.gpu~node-1.allocator"


async def reserve(js: JetStreamContext, name: str, node: str = "N1") -> None:
    pod = WEB if name == "web" else PodRef(namespace="default", name=name, uid=name)
    event = PodReserved(id=f"r-{name}", at=now(), node=node, pod=pod, shares=(share(node, 0, 1),))
    await AllocationLog(js).append(event)


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
async def test_follow_prints_what_is_logged_from_then_on(
    js: JetStreamContext, as_json: bool
) -> None:
    await reserve(js, "before")
    args = audit.parse_args(["--follow", "--pod", "default/web", *(["--json"] if as_json else [])])
    out = Sink()
    task = asyncio.create_task(audit.audit(js, args, out))
    try:
        if not as_json:
            await out.wait_for(lambda lines: len(lines) == 1)  # the header: the backlog is shown
            assert out.lines[0].split() == HEADER
        await reserve(js, "other")
        await reserve(js, "web", node="N2")
        await out.wait_for(lambda lines: any("r-web" in line for line in lines))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    followed = out.lines if as_json else out.lines[1:]
    assert len(followed) == 1
    if as_json:
        assert json.loads(followed[0])["seq"] == 3
    else:
        assert cells(followed[0])[0] == "3"
        assert cells(followed[0])[2:5] == ["N2", "PodReserved", "default/web"]


async def test_ctrl_c_ends_follow_with_exit_status_0(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpushare.cli.main",
        "audit",
        "--follow",
        "--nats",
        nats_server.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        header = await process.stdout.readline()  # the backlog is shown: it is following now
        assert header.decode().split() == HEADER
        await reserve(js, "web")
        row = await process.stdout.readline()
        assert cells(row.decode())[3:5] == ["PodReserved", "default/web"]
        process.send_signal(signal.SIGINT)
        _, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    assert b"Traceback" not in err


async def test_no_nats_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    ran = await run_main(audit.main, [], "nats://127.0.0.1:1", capsys)
    assert ran.code == 1
    assert ran.err.startswith("gpushare audit: cannot reach NATS at nats://127.0.0.1:1")


async def test_a_closed_pipe_ends_follow_with_exit_status_0(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """``gpushare audit --follow | head -n 1``: the next event finds the pipe closed."""
    command = f"{sys.executable} -m gpushare.cli.main audit --follow --nats {nats_server.url}"
    shell = await asyncio.create_subprocess_exec(
        "/bin/bash",
        "-c",
        f"{command} | head -n 1; exit ${{PIPESTATUS[0]}}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert shell.stdout is not None
        printed = await asyncio.wait_for(shell.stdout.readline(), timeout=30)
        assert printed.decode().split() == HEADER  # head printed it and exits
        for attempt in range(30):  # a line written before head is gone still fits the pipe
            await reserve(js, f"web-{attempt}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shell.wait(), timeout=1)
                break
        _, err = await asyncio.wait_for(shell.communicate(), timeout=30)
    finally:
        if shell.returncode is None:
            shell.kill()
            await shell.wait()
    assert shell.returncode == 0, err.decode()
    assert err == b""


async def test_a_nats_without_gpushares_streams_is_a_clear_error(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = await run_main(audit.main, [], nats_server.url, capsys)
    assert ran.code == 1
    assert ran.err.startswith("gpushare audit: not a gpushare NATS: ")
