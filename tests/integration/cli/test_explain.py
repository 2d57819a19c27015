"""``gpushare explain`` over decisions a real allocator recorded while serving HTTP."""

from __future__ import annotations

import json
import re
from contextlib import aclosing
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from gpushare.bus.connection import connect
from gpushare.bus.decisions import DecisionRecorder
from gpushare.bus.log import MSG_ID, AllocationLog
from gpushare.bus.reading import Record, read_records
from gpushare.bus.subjects import DECISION_STREAM, decision_subject
from gpushare.cli import explain
from gpushare.core.events import (
    ContainerAssigned,
    NodesFiltered,
    NodesScored,
    PodReleased,
    decode_decision,
)
from gpushare.core.model import PodRef
from gpushare.embedded.nats_server import NatsServer
from tests.integration.allocator.doubles import BinderDouble
from tests.integration.allocator.serving import allocator_settings, extender, publish
from tests.integration.cli.running import now, run_main
from tests.unit.allocator.builders import binding_args, gpu_pod, names_args, seed_000_filter_cluster

NAMES = ["N1", "N2", "N3"]
PREFIX = "/gpushare-scheduler"


async def decisions_stored(js: JetStreamContext, name: str, count: int) -> list[Record]:
    """The first ``count`` decision records about default/``name``, waiting for them."""
    found: list[Record] = []
    records = read_records(js, DECISION_STREAM, decision_subject("default", name), follow=True)
    async with aclosing(records) as stream:
        async for record in stream:
            found.append(record)
            if len(found) == count:
                return found
    return found


async def schedule(nc: Client, js: JetStreamContext, pod: dict[str, Any]) -> str:
    """kube-scheduler's three calls for ``pod`` (bind on N3); returns bind's error."""
    recorder = DecisionRecorder(nc)
    settings = allocator_settings(policy="binpack")
    async with (
        extender(js, settings, decisions=recorder) as (http, _),
        BinderDouble(js),
    ):
        passed = (await http.post(f"{PREFIX}/filter", content=names_args(pod, NAMES))).json()
        if not passed["NodeNames"]:
            return "nothing passed"
        await http.post(f"{PREFIX}/prioritize", content=names_args(pod, passed["NodeNames"]))
        bound = await http.post(f"{PREFIX}/bind", content=binding_args(pod, "N3"))
    error: str = bound.json()["Error"]
    return error


async def admit_and_release(js: JetStreamContext, pod: PodRef, reservation_id: str) -> None:
    log = AllocationLog(js)
    common: dict[str, Any] = {
        "at": now(),
        "node": "N3",
        "pod": pod,
        "reservation_id": reservation_id,
    }
    await log.append(
        ContainerAssigned(id="a-web", container="main0", card_uuids=("GPU-N3-0",), **common)
    )
    await log.append(PodReleased(id="x-web", reason="deleted", detail="pod deleted", **common))


async def test_the_story_of_a_pod_scheduled_through_the_extender(
    nc: Client, js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await publish(js, seed_000_filter_cluster())
    assert await schedule(nc, js, gpu_pod("web", 8138, uid="uid-1")) == ""
    filtered, scored = await decisions_stored(js, "web", 2)
    record = decode_decision(filtered.data)
    assert isinstance(record, NodesFiltered)
    stored = await js.get_msg(DECISION_STREAM, filtered.seq)
    assert stored.headers == {MSG_ID: record.id}
    assert isinstance(decode_decision(scored.data), NodesScored)

    ran = await run_main(explain.main, ["default/web"], nats_server.url, capsys)
    assert ran.code == 0
    text = ran.out
    assert ran.lines[0] == "default/web (uid uid-1)"
    assert ran.lines[1].startswith("  now: bound: bound to N3 (GPU0 8138 MiB); 0 of 1 containers")
    assert re.fullmatch(
        r"  reservation reserve:uid-1:N3:\d+ on N3 \(log seq \d+, policy binpack, "
        r"by allocator-a\): bound",
        ran.lines[2],
    )
    assert ran.lines[3] == "    container main0: GPU0 8138 MiB (GPU-N3-0)"
    assert "filter by allocator-a: request main0: 8138 MiB; passed N3" in text
    assert "N2 filtered out: " in text
    assert "the most free on any card is 4069 MiB" in text
    assert "N1 filtered out: " in text
    assert "prioritize by allocator-a, policy binpack: N3=" in text
    assert "PodReserved on N3: GPU0 8138 MiB (policy binpack, by allocator-a)" in text
    assert "PodBound on N3" in text


async def test_json_and_a_reused_name(
    nc: Client, js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await publish(js, seed_000_filter_cluster())
    assert await schedule(nc, js, gpu_pod("web", 8138, uid="uid-1")) == ""
    ran = await run_main(explain.main, ["default/web", "--json"], nats_server.url, capsys)
    (life,) = json.loads(ran.out)["lives"]
    reservation_id = life["reservations"][0]["id"]
    await admit_and_release(
        js, PodRef(namespace="default", name="web", uid="uid-1"), reservation_id
    )
    # The same name again, a new pod: N3's card is free again, but it asks more than any card.
    assert await schedule(nc, js, gpu_pod("web", 20000, uid="uid-2")) == "nothing passed"
    await decisions_stored(js, "web", 3)

    ran = await run_main(explain.main, ["web", "--json"], nats_server.url, capsys)
    assert ran.code == 0
    document = json.loads(ran.out)
    assert (document["namespace"], document["name"], document["undecodable"]) == (
        "default",
        "web",
        [],
    )
    first, second = document["lives"]
    assert (first["uid"], first["status"], first["node"]) == ("uid-1", "released", "N3")
    assert first["why"] == "released from N3: deleted: pod deleted"
    assert [e["event"]["type"] for e in first["events"]] == [
        "PodReserved",
        "PodBound",
        "ContainerAssigned",
        "PodReleased",
    ]
    assert [d["decision"]["type"] for d in first["decisions"]] == ["NodesFiltered", "NodesScored"]
    assert first["reservations"][0]["shares"][0]["card_index"] == 0
    assert (second["uid"], second["status"]) == ("uid-2", "not_reserved")
    assert second["why"] == "never reserved: the last filter passed no node (3 filtered out)"
    assert second["decisions"][0]["decision"]["failed"].keys() == set(NAMES)

    text = await run_main(explain.main, ["default/web"], nats_server.url, capsys)
    assert "default/web (uid uid-2)" in text.lines
    assert (
        "  now: not_reserved: never reserved: the last filter passed no node (3 filtered out)"
        in text.lines
    )


async def test_a_pod_nobody_heard_of(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await publish(js, seed_000_filter_cluster())
    ran = await run_main(explain.main, ["default/ghost"], nats_server.url, capsys)
    assert ran.code == 1
    assert ran.lines == [
        "default/ghost: no allocation event and no extender decision recorded about it"
    ]


async def test_an_undecodable_decision_is_shown_not_fatal(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await js.publish(
        decision_subject("default", "web"), b'{"type": "NodesFiltered", "name": "web"}'
    )
    ran = await run_main(explain.main, ["default/web"], nats_server.url, capsys)
    assert ran.code == 1
    assert ran.lines[1].startswith("undecodable record on gpushare.decisions.default.web (seq 1): ")
    assert "missing required field" in ran.lines[1]


async def test_a_nats_outage_neither_fails_nor_holds_up_the_extender(
    js: JetStreamContext, nats_server: NatsServer
) -> None:
    """The recorder's connection is gone: filter still answers, the record is counted as lost."""
    await publish(js, seed_000_filter_cluster())
    lost = await connect(nats_server.url, name="lost")
    await lost.close()
    recorder = DecisionRecorder(lost)
    async with extender(js, decisions=recorder) as (http, _):
        response = await http.post(
            f"{PREFIX}/filter", content=names_args(gpu_pod("web", 8138), NAMES)
        )
        assert response.json()["NodeNames"] == ["N3"]
        response = await http.post(
            f"{PREFIX}/prioritize", content=names_args(gpu_pod("web", 8138), NAMES)
        )
        assert response.status_code == 200
    assert (recorder.published, recorder.dropped) == (0, 2)
    assert (await js.stream_info(DECISION_STREAM)).state.messages == 0
