"""``gpushare inspect`` and ``kubectl gpushare`` against a real nats-server."""

from __future__ import annotations

import json

import pytest
from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.subjects import allocation_subject
from gpushare.cli import inspect, kubectl_plugin
from gpushare.core.events import PodReserved
from gpushare.core.model import PodRef
from gpushare.embedded.nats_server import NatsServer
from tests.integration.allocator.serving import publish
from tests.integration.cli.running import now, run_main, share, web_lifecycle
from tests.unit.allocator.builders import V100, card, inventory, seed_000_filter_cluster

SUMMARY_HEADER = ["NAME", "IPADDRESS", "GPU0(Allocated/Total)", "GPU1(Allocated/Total)"]


async def seeded(js: JetStreamContext) -> None:
    """Seed 000's filter cluster (seqs 1-6); default/web takes N3's free 8138 MiB (7-9)."""
    await publish(js, seed_000_filter_cluster())
    await web_lifecycle(js)


async def test_the_per_card_table_of_seed_000(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(inspect.main, [], nats_server.url, capsys)
    assert ran.code == 0
    assert [line.split() for line in ran.lines] == [
        [*SUMMARY_HEADER, "GPU", "Memory(MiB)"],
        ["N1", "unknown", "16276/16276", "12207/16276", "28483/32552"],
        ["N2", "unknown", "12207/16276", "12207/16276", "24414/32552"],
        ["N3", "unknown", "16276/16276", "16276/16276", "32552/32552"],
        ["-" * len(ran.lines[0])],
        ["Allocated/Total", "GPU", "Memory", "In", "Cluster:"],
        ["85449/97656", "(87%)"],
    ]


async def test_one_node_in_detail(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(inspect.main, ["N3", "-d"], nats_server.url, capsys)
    assert [line.split() for line in ran.lines if line] == [
        ["NAME:", "N3"],
        ["IPADDRESS:", "unknown"],
        ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "STATE"],
        ["N3-gpu0-occupant", "occupants", "8138", "0", "reserved"],
        ["N3-gpu1-occupant", "occupants", "0", str(V100), "reserved"],
        ["web", "default", "8138", "0", "assigned"],
        ["Allocated", ":", "32552", "(100%)"],
        ["Total", ":", "32552"],
        [ran.lines[10]],
        ["Allocated/Total", "GPU", "Memory", "In", "Cluster:"],
        ["32552/32552", "(100%)"],
    ]


async def test_an_unknown_node_is_an_error(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(inspect.main, ["N9"], nats_server.url, capsys)
    assert (ran.code, ran.out) == (1, "")
    assert ran.err == "gpushare inspect: node N9 is unknown to gpushare\n"


async def test_json_is_the_extenders_inspect_shape(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(inspect.main, ["--json"], nats_server.url, capsys)
    document = json.loads(ran.out)
    assert (document["total_mib"], document["used_mib"]) == (97656, 85449)
    assert document["as_of"]["seq"] == 9
    assert document["as_of"]["past"] is False
    n3 = document["nodes"][2]
    assert (n3["name"], n3["last_seq"], n3["stale"]) == ("N3", 9, False)
    gpu0 = n3["devs"][0]
    assert (gpu0["used_mib"], gpu0["free_mib"], gpu0["in_inventory"]) == (V100, 0, True)
    assert [(p["name"], p["mib"], p["state"]) for p in gpu0["pods"]] == [
        ("N3-gpu0-occupant", 8138, "reserved"),
        ("web", 8138, "assigned"),
    ]


async def test_at_a_sequence_replays_the_log_up_to_it(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    ran = await run_main(inspect.main, ["--at", "3"], nats_server.url, capsys)
    assert ran.lines[0].startswith("# allocation log up to seq 3 (")
    assert "a past view shows today's cards" in ran.lines[0]
    assert [line.split()[-1] for line in ran.lines[2:5]] == [
        "28483/32552",
        "12207/32552",
        "0/32552",
    ]
    as_json = json.loads(
        (await run_main(inspect.main, ["--at", "7", "--json"], nats_server.url, capsys)).out
    )
    assert (as_json["as_of"]["seq"], as_json["as_of"]["past"]) == (7, True)
    web = as_json["nodes"][2]["devs"][0]["pods"][1]
    assert (web["name"], web["state"]) == ("web", "reserved")  # bound at 8, assigned at 9


async def test_at_a_time_replays_what_was_stored_until_then(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await publish(js, seed_000_filter_cluster())
    between = now()
    await web_lifecycle(js)
    ran = await run_main(inspect.main, ["N3", "--at", between.isoformat()], nats_server.url, capsys)
    assert ran.lines[0].startswith("# allocation log up to seq 6 (")
    assert ran.lines[2].split()[-1] == "24414/32552"
    before_all = await run_main(
        inspect.main, ["--at", "2000-01-01T00:00:00Z"], nats_server.url, capsys
    )
    assert before_all.lines[0].startswith("# allocation log up to seq 0 (the start)")
    assert [line.split()[-1] for line in before_all.lines[2:5]] == ["0/32552"] * 3


async def test_a_card_gone_from_todays_inventory_still_shows_its_past_allocation(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await publish_inventory(js, inventory("gpu-x", [card("gpu-x", 0), card("gpu-x", 1)]))
    pod = PodRef(namespace="ml", name="train", uid="u-train")
    await AllocationLog(js).append(
        PodReserved(id="r-train", at=now(), node="gpu-x", pod=pod, shares=(share("gpu-x", 1, 500),))
    )
    await publish_inventory(js, inventory("gpu-x", [card("gpu-x", 0)]))  # GPU1 taken out
    ran = await run_main(inspect.main, ["--at", "1"], nats_server.url, capsys)
    assert ran.lines[2].split() == ["gpu-x", "unknown", f"0/{V100}", "500/?", f"500/{V100}"]
    assert "* a card the log names that today's inventory does not list" in ran.lines
    details = await run_main(inspect.main, ["-d"], nats_server.url, capsys)
    assert "GPU1*(Allocated)" in details.out
    as_json = json.loads((await run_main(inspect.main, ["--json"], nats_server.url, capsys)).out)
    gone = as_json["nodes"][0]["devs"][1]
    assert (gone["uuid"], gone["total_mib"], gone["in_inventory"]) == ("GPU-gpu-x-1", None, False)


async def test_kubectl_gpushare_is_gpushare_inspect(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    for args in ([], ["N3", "-d"]):
        plugin = await run_main(kubectl_plugin.main, args, nats_server.url, capsys)
        command = await run_main(inspect.main, args, nats_server.url, capsys)
        assert plugin.code == command.code == 0
        assert plugin.out == command.out


async def test_an_undecodable_record_is_skipped_and_said(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await seeded(js)
    await js.publish(allocation_subject("N3"), b"\xff not json")
    ran = await run_main(inspect.main, [], nats_server.url, capsys)
    assert ran.code == 0
    assert ran.lines[-1] == "85449/97656 (87%)"
    assert ran.err == "gpushare inspect: 1 undecodable log record(s) skipped\n"
