"""The pod-resources comparison: the kubelet's device IDs against the log."""

from __future__ import annotations

from gpushare.node_agent.device_table import build_device_table
from gpushare.node_agent.matching import Asks
from gpushare.node_agent.reconciling import KubeletContainer, compare_with_log
from tests.unit.node_agent.builders import (
    assign,
    card,
    inventory,
    node_state,
    reserve,
    reserve_and_bind,
    share,
)

GPU0, GPU1 = card(0), card(1)
TABLE = build_device_table([GPU0, GPU1], "GiB")
POD = reserve("p", share("setup", GPU1, 1024, init=True), share("app", GPU1, 2048))
EVENTS = [inventory(GPU0, GPU1), *reserve_and_bind(POD), assign(POD, "setup", GPU1)]


def held(container: str, *device_ids: str, pod: str = "p") -> KubeletContainer:
    return KubeletContainer("ns", pod, container, device_ids)


def test_agreement_finds_nothing() -> None:
    node = node_state([*EVENTS, assign(POD, "app", GPU1)])
    assert compare_with_log(node, TABLE, [held("app", *TABLE.ids_of(GPU1)[:2])]) == []


def test_ids_on_another_card_are_a_mismatch() -> None:
    node = node_state([*EVENTS, assign(POD, "app", GPU1)])
    (finding,) = compare_with_log(node, TABLE, [held("app", *TABLE.ids_of(GPU0)[:2])])
    assert finding.kind == "card_mismatch"
    assert (finding.pod, finding.container) == ("ns/p", "app")
    assert GPU0.uuid in finding.detail
    assert GPU1.uuid in finding.detail


def test_a_container_the_log_does_not_hold_is_unknown() -> None:
    node = node_state(EVENTS)
    (finding,) = compare_with_log(node, TABLE, [held("c", *TABLE.ids_of(GPU0)[:1], pod="other")])
    assert finding.kind == "unknown_to_log"
    assert finding.pod == "ns/other"


def test_an_assigned_app_container_the_kubelet_does_not_list_is_missing() -> None:
    node = node_state([*EVENTS, assign(POD, "app", GPU1)])
    (finding,) = compare_with_log(node, TABLE, [])
    assert (finding.kind, finding.container) == ("missing_from_kubelet", "app")


def test_init_containers_are_not_expected_in_pod_resources() -> None:
    assert compare_with_log(node_state(EVENTS), TABLE, []) == []


MEM = "aliyun.com/gpu-mem"
CORE = "gpushare.io/gpu-core"
TABLES = {name: build_device_table([GPU0, GPU1], "GiB", name) for name in (MEM, CORE)}
ASKS = Asks(
    by_reservation={"reserve-q": {"mem": (MEM, CORE), "core": (CORE,)}},
    advertised=frozenset(TABLES),
)
BOTH = reserve("q", share("mem", GPU1, 1024, core=30), share("core", GPU0, 0, core=20))
BOTH_EVENTS = [inventory(GPU0, GPU1), *reserve_and_bind(BOTH)]


def held_as(container: str, resource: str, *device_ids: str) -> KubeletContainer:
    return KubeletContainer("ns", "q", container, device_ids, resource)


def test_only_the_keyed_resource_says_which_card() -> None:
    node = node_state([*BOTH_EVENTS, assign(BOTH, "mem", GPU1), assign(BOTH, "core", GPU0)])
    held = [
        held_as("mem", MEM, *TABLES[MEM].ids_of(GPU1)[:1]),
        held_as("mem", CORE, *TABLES[CORE].ids_of(GPU0)[:30]),  # counted only: any card
        held_as("core", CORE, *TABLES[CORE].ids_of(GPU0)[:20]),
    ]
    assert compare_with_log(node, TABLES, held, ASKS) == []


def test_a_keyed_resource_on_another_card_is_a_mismatch() -> None:
    node = node_state([*BOTH_EVENTS, assign(BOTH, "mem", GPU1), assign(BOTH, "core", GPU0)])
    held = [
        held_as("mem", MEM, *TABLES[MEM].ids_of(GPU1)[:1]),
        held_as("core", CORE, *TABLES[CORE].ids_of(GPU1)[:20]),
    ]
    (finding,) = compare_with_log(node, TABLES, held, ASKS)
    assert (finding.kind, finding.container) == ("card_mismatch", "core")


def test_a_container_unknown_to_the_log_is_reported_once() -> None:
    held = [held_as("x", MEM, *TABLES[MEM].ids_of(GPU0)[:1]), held_as("x", CORE, "gpu-0")]
    findings = compare_with_log(node_state([inventory(GPU0)]), TABLES, held, ASKS)
    assert [f.kind for f in findings] == ["unknown_to_log"]


def test_ids_of_seed_000s_plugin_name_their_card_by_uuid() -> None:
    """Pods the old gpushare device plugin served keep its IDs (``<UUID>-_-<n>``)."""
    node = node_state([*EVENTS, assign(POD, "app", GPU1)])
    old = (f"{GPU1.uuid}-_-0", f"{GPU1.uuid}-_-1")
    assert compare_with_log(node, TABLE, [held("app", *old)]) == []
    (moved,) = compare_with_log(node, TABLE, [held("app", f"{GPU0.uuid}-_-0")])
    assert (moved.kind, moved.kubelet_cards) == ("card_mismatch", (GPU0.uuid,))
    (unknown,) = compare_with_log(node, TABLE, [held("app", "nothing-7")])
    assert (unknown.kind, unknown.kubelet_cards) == ("card_mismatch", ())
