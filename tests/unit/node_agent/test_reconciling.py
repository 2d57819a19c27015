"""The pod-resources comparison: the kubelet's device IDs against the log."""

from __future__ import annotations

from gpushare.node_agent.devices import build_device_table
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
