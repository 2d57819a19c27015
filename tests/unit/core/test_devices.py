"""The Device custom resource, rendered from nodes folded from real events."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpushare.core.device_resource import (
    API_VERSION,
    devices_to_delete,
    render_device,
    render_status,
)
from gpushare.core.events import (
    AnyEvent,
    ClaimAllocated,
    ClaimShare,
    ContainerAssigned,
    ForeignCardsHeld,
    ForeignHold,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import Card, ClaimRef, ContainerShare, PodRef
from gpushare.core.state import ClusterState, NodeState, fold_events
from tests.unit.core.event_streams import history
from tests.unit.core.factories import T0, inventory, make_card

CRD_PATH = Path(__file__).parents[3] / "deploy/base/crds/devices.gpushare.io.yaml"
NODE = "gpu-a"
CARDS = (make_card(0, node=NODE), make_card(1, 32510, node=NODE))
POD = PodRef(namespace="team", name="trainer", uid="uid-1")


def share(card: Card, mib: int, container: str = "main", core: int = 0) -> ContainerShare:
    return ContainerShare(
        container=container,
        card_index=card.index,
        card_uuid=card.uuid,
        memory_mib=mib,
        core_percent=core,
    )


def reserved(pod: PodRef, *shares: ContainerShare) -> PodReserved:
    return PodReserved(id=f"r-{pod.uid}", at=T0, node=NODE, pod=pod, shares=shares)


def claimed(card: Card, mib: int) -> ClaimAllocated:
    """A DRA claim on ``card`` for POD (its Device entry is ``Claimed``)."""
    return ClaimAllocated(
        id="claim-1",
        at=T0,
        node=NODE,
        claim=ClaimRef(namespace=POD.namespace, name="trainer-gpu", uid="claim-uid"),
        shares=(
            ClaimShare(
                request="gpu",
                device=f"gpu-{card.index}",
                card_index=card.index,
                card_uuid=card.uuid,
                memory_mib=mib,
                core_percent=10,
            ),
        ),
        pods=(POD,),
    )


def fold(*events: AnyEvent, cards: Sequence[Card] = CARDS) -> NodeState:
    state = ClusterState()
    state.apply(inventory(NODE, cards))
    for seq, event in enumerate(events, start=1):
        state.apply(event, seq)
    return state.node(NODE)


def test_an_idle_node_shows_every_card_free() -> None:
    device = render_device(fold(), driver_version="550.54.15")
    assert device["apiVersion"] == API_VERSION
    assert device["kind"] == "Device"
    assert device["metadata"]["name"] == NODE
    assert device["spec"] == {"nodeName": NODE}
    status = device["status"]
    assert status["cardCount"] == 2
    assert status["model"] == "Tesla V100-SXM2-16GB"
    assert status["memoryMiB"] == 16276 + 32510
    assert status["allocatedMiB"] == 0
    assert status["healthy"] == "2/2"
    assert status["podCount"] == 0
    assert status["driverVersion"] == "550.54.15"
    assert [card["index"] for card in status["cards"]] == [0, 1]
    assert status["cards"][1] == {
        "index": 1,
        "uuid": f"GPU-{NODE}-1",
        "model": "Tesla V100-SXM2-16GB",
        "memoryMiB": 32510,
        "allocatedMiB": 0,
        "freeMiB": 32510,
        "coreAllocated": 0,
        "containers": 0,
        "healthy": True,
        "pods": [],
    }


def test_a_reservation_shows_its_pod_and_memory_on_its_card() -> None:
    node = fold(reserved(POD, share(CARDS[1], 8000, core=30)))
    status = render_status(node)
    card = status["cards"][1]
    assert card["allocatedMiB"] == 8000
    assert card["freeMiB"] == 32510 - 8000
    assert card["coreAllocated"] == 30
    assert card["pods"] == [
        {
            "namespace": "team",
            "name": "trainer",
            "uid": "uid-1",
            "memoryMiB": 8000,
            "corePercent": 30,
            "containers": ["main"],
            "phase": "Reserved",
        }
    ]
    assert status["cards"][0]["pods"] == []
    assert status["allocatedMiB"] == 8000
    assert status["podCount"] == 1
    assert status["lastSeq"] == 1


@pytest.mark.parametrize(
    ("later", "phase"),
    [
        ((), "Reserved"),
        ((PodBound(id="b", at=T0, node=NODE, pod=POD, reservation_id="r-uid-1"),), "Bound"),
        (
            (
                PodBound(id="b", at=T0, node=NODE, pod=POD, reservation_id="r-uid-1"),
                ContainerAssigned(
                    id="a",
                    at=T0,
                    node=NODE,
                    pod=POD,
                    reservation_id="r-uid-1",
                    container="main",
                    card_uuids=(CARDS[0].uuid,),
                ),
            ),
            "Assigned",
        ),
    ],
)
def test_a_pod_phase_follows_bind_and_assignment(later: tuple[AnyEvent, ...], phase: str) -> None:
    node = fold(reserved(POD, share(CARDS[0], 4000)), *later)
    assert render_status(node)["cards"][0]["pods"][0]["phase"] == phase


def test_a_release_frees_the_card() -> None:
    released = PodReleased(
        id="x", at=T0, node=NODE, pod=POD, reservation_id="r-uid-1", reason="deleted"
    )
    status = render_status(fold(reserved(POD, share(CARDS[0], 4000)), released))
    assert status["cards"][0]["allocatedMiB"] == 0
    assert status["cards"][0]["pods"] == []
    assert status["podCount"] == 0
    assert status["lastSeq"] == 2


def test_containers_of_one_pod_on_one_card_are_one_entry() -> None:
    node = fold(reserved(POD, share(CARDS[0], 1000, "b"), share(CARDS[0], 2000, "a")))
    [entry] = render_status(node)["cards"][0]["pods"]
    assert entry["containers"] == ["a", "b"]
    assert entry["memoryMiB"] == 3000
    assert render_status(node)["cards"][0]["containers"] == 2


def test_pods_are_sorted_by_namespace_and_name() -> None:
    other = PodRef(namespace="alpha", name="zeta", uid="uid-2")
    node = fold(reserved(POD, share(CARDS[0], 1000)), reserved(other, share(CARDS[0], 1000)))
    names = [pod["name"] for pod in render_status(node)["cards"][0]["pods"]]
    assert names == ["zeta", "trainer"]


def test_an_unhealthy_card_shows_why() -> None:
    cards = (
        make_card(0, node=NODE),
        make_card(1, node=NODE, healthy=False, health_reason="XID 79"),
    )
    status = render_status(fold(cards=cards))
    assert status["healthy"] == "1/2"
    assert status["cards"][1]["healthy"] is False
    assert status["cards"][1]["healthReason"] == "XID 79"
    assert "healthReason" not in status["cards"][0]


def test_mixed_models_are_listed_once_each_in_index_order() -> None:
    a100 = Card(index=2, uuid="GPU-a100", model="NVIDIA A100-SXM4-40GB", memory_mib=40536)
    status = render_status(fold(cards=(*CARDS, a100)))
    assert status["model"] == "Tesla V100-SXM2-16GB, NVIDIA A100-SXM4-40GB"


def test_a_foreign_hold_shows_the_card_wholly_allocated() -> None:
    held = ForeignCardsHeld(
        id="f",
        at=T0,
        node=NODE,
        holds=(ForeignHold(card_uuid=CARDS[0].uuid, resource="nvidia.com/gpu", pods=("ns/p",)),),
    )
    card = render_status(fold(held))["cards"][0]
    assert card["allocatedMiB"] == CARDS[0].memory_mib
    assert card["foreign"] == [{"resource": "nvidia.com/gpu", "pods": ["ns/p"]}]


def test_rendering_is_deterministic_and_ignores_heartbeats() -> None:
    node = fold(reserved(POD, share(CARDS[0], 1000)))
    state = ClusterState({NODE: node})
    later = inventory(NODE, CARDS, at=T0.replace(minute=5))
    assert render_device(state.apply(later)) == render_device(node)


def test_a_node_without_inventory_renders_no_cards() -> None:
    status = render_status(NodeState(name="empty"))
    assert status["cardCount"] == 0
    assert status["healthy"] == "0/0"
    assert status["cards"] == []


# --- the CRD in deploy/ --------------------------------------------------------------------


def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def test_the_crd_is_an_apiextensions_v1_definition_of_device() -> None:
    definition = crd()
    assert definition["apiVersion"] == "apiextensions.k8s.io/v1"
    assert definition["kind"] == "CustomResourceDefinition"
    spec = definition["spec"]
    assert definition["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == (
        "gpushare.io",
        "Cluster",
        "Device",
    )
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert version["schema"]["openAPIV3Schema"]["type"] == "object"


def _fields(schema: dict[str, Any], path: str) -> Any:
    """The schema of the field at ``path`` (``.status.cardCount``)."""
    for part in path.strip(".").split("."):
        schema = schema["properties"][part]
    return schema


def test_every_printer_column_names_a_field_of_the_schema() -> None:
    [version] = crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Cards",
        "Model",
        "Memory(MiB)",
        "Allocated(MiB)",
        "Healthy",
        "Pods",
        "Age",
    ]
    for column in columns:
        if column["jsonPath"] != ".metadata.creationTimestamp":
            field = _fields(schema, column["jsonPath"])
            assert field["type"] == column["type"], column


def test_the_schema_accepts_what_the_core_renders() -> None:
    [version] = crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    cards = (make_card(0, node=NODE), make_card(1, node=NODE, healthy=False, health_reason="XID"))
    held = ForeignCardsHeld(
        id="f", at=T0, node=NODE, holds=(ForeignHold(card_uuid=cards[1].uuid, resource="x"),)
    )
    node = fold(
        reserved(POD, share(cards[0], 1000, core=20)), held, claimed(cards[0], 2000), cards=cards
    )
    device = render_device(node, driver_version="550")
    jsonschema.validate(device, schema)
    pods = device["status"]["cards"][0]["pods"]
    assert [(pod["phase"], pod.get("claim")) for pod in pods] == [
        ("Reserved", None),
        ("Claimed", "team/trainer-gpu"),
    ]
    assert device["status"]["cards"][0]["allocatedMiB"] == 3000


def test_the_schema_names_every_field_the_core_renders() -> None:
    """A real apiserver prunes fields its schema does not name: none may be lost."""
    [version] = crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    held = ForeignCardsHeld(
        id="f", at=T0, node=NODE, holds=(ForeignHold(card_uuid=CARDS[1].uuid, resource="x"),)
    )
    cards = (CARDS[0], make_card(1, node=NODE, healthy=False, health_reason="XID"))
    events = (reserved(POD, share(CARDS[0], 1)), held, claimed(CARDS[0], 2))
    device = render_device(fold(*events, cards=cards), "550")

    def check(value: Any, schema: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in schema:
            for key, item in value.items():
                assert key in schema["properties"], f"{path}.{key} is not in the schema"
                check(item, schema["properties"][key], f"{path}.{key}")
        elif isinstance(value, list):
            for item in value:
                check(item, schema["items"], f"{path}[]")

    check(device, schema, "")


def test_the_schema_refuses_a_card_without_its_memory() -> None:
    [version] = crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    device = render_device(fold())
    del device["status"]["cards"][0]["memoryMiB"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(device, schema)


# --- which Devices go ----------------------------------------------------------------------


def test_devices_of_nodes_never_reported_or_gone_from_the_api_and_silent_are_deleted() -> None:
    fresh = fold()
    silent_a_day = T0 + timedelta(days=1)
    nodes = {NODE: fresh, "registered": NodeState(name="registered")}
    assert devices_to_delete(["zz", NODE, "registered", "unknown"], nodes, None, T0) == [
        "registered",
        "unknown",
        "zz",
    ]
    assert devices_to_delete([NODE], nodes, {NODE}, silent_a_day) == []
    assert devices_to_delete([NODE], nodes, set(), T0) == []
    assert devices_to_delete([NODE], nodes, set(), silent_a_day) == [NODE]
    assert devices_to_delete([NODE], nodes, None, silent_a_day) == []


@pytest.mark.parametrize("seed", range(20))
def test_any_history_renders_a_valid_and_consistent_device(seed: int) -> None:
    [version] = crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    state = fold_events(history(random.Random(seed), 120))
    for node in state.nodes.values():
        device = render_device(node, driver_version="550")
        jsonschema.validate(device, schema)
        status = device["status"]
        assert status["allocatedMiB"] == sum(card["allocatedMiB"] for card in status["cards"])
        uids = {pod["uid"] for card in status["cards"] for pod in card["pods"]}
        assert uids == set(node.pods)
        for card in status["cards"]:
            assert sum(pod["memoryMiB"] for pod in card["pods"]) <= card["allocatedMiB"]
        assert render_device(node, driver_version="550") == device
