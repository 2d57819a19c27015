"""The DRA front door's pure part: slices from inventory, claims into the ledger, the
extender's refusal of DRA nodes and the CDI spec a prepared claim gets."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpushare.core.cdi import CDI_KIND, cdi_device_id, cdi_spec
from gpushare.core.dra import DEVICE_CLASS, DRIVER, card_index_of, mib_quantity, resource_slice
from gpushare.core.dra_claims import (
    CLAIM,
    TEMPLATE,
    UnknownDevice,
    claim_node,
    claim_ref,
    claim_request,
    claim_shares,
    ledger_changes,
    reserved_for,
)
from gpushare.core.events import ClaimAllocated, ClaimReleased, ClaimShare
from gpushare.core.fit import check_fit
from gpushare.core.history import LoggedEvent, pods_named, summarize, tell_story
from gpushare.core.model import CardLink, ClaimRef, PodRef
from gpushare.core.placement import reserve
from gpushare.core.pods import pod_from_dict
from gpushare.core.state import ClusterState, fold_events
from tests.unit.core.factories import T0, inventory, later, make_card, pod_ref, request_of

CARDS = (make_card(0, node="n"), make_card(1, node="n", healthy=False, health_reason="XID 79"))
MIB = 1024 * 1024


def claim(results: list[dict[str, Any]], node: str = "n") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p-gpu", "uid": "claim-1"},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }


def result(device: str = "gpu-0", **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "n", "device": device}
    if consumed:
        out["consumedCapacity"] = consumed
        out["shareID"] = "4a1f"
    return out


def test_the_slice_publishes_healthy_cards_shareable_by_memory_and_cores() -> None:
    links = (CardLink(a=0, b=1, path="NVLINK", nvlinks=4), CardLink(a=0, b=2, path="PIX"))
    body = resource_slice("n", (*CARDS, make_card(2, node="n")), links, generation=3)
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, "n")
    assert spec["pool"] == {"name": "n", "generation": 3, "resourceSliceCount": 1}
    assert [device["name"] for device in spec["devices"]] == ["gpu-0", "gpu-2"]  # 1 unhealthy
    first = spec["devices"][0]
    assert first["allowMultipleAllocations"] is True
    assert first["attributes"]["uuid"] == {"string": CARDS[0].uuid}
    assert first["attributes"]["nvlinkPeers"] == {"string": "1"}  # the PCIe peer is not one
    memory = first["capacity"]["memory"]
    assert memory["value"] == mib_quantity(CARDS[0].memory_mib)
    assert memory["requestPolicy"]["validRange"] == {"min": "1Mi", "step": "1Mi"}
    assert first["capacity"]["cores"]["value"] == "100"


@pytest.mark.parametrize(
    ("mib", "quantity"),
    [(16384, "16Gi"), (16276, "16276Mi"), (1, "1Mi"), (1024, "1Gi"), (2**20, "1Ti")],
)
def test_quantities_are_written_as_the_apiserver_writes_them_back(mib: int, quantity: str) -> None:
    assert mib_quantity(mib) == quantity


@pytest.mark.parametrize(
    ("name", "index"), [("gpu-0", 0), ("gpu-12", 12), ("gpu-", None), ("cpu-1", None), ("x", None)]
)
def test_device_names(name: str, index: int | None) -> None:
    assert card_index_of(name) == index


def test_a_claim_consumes_what_kube_scheduler_wrote() -> None:
    body = claim([result(memory="4Gi", cores="20"), {**result(), "driver": "other.example.com"}])
    (share,) = claim_shares(body, CARDS)
    assert share == ClaimShare(
        request="gpu",
        device="gpu-0",
        card_index=0,
        card_uuid=CARDS[0].uuid,
        memory_mib=4096,
        core_percent=20,
        share_id="4a1f",
    )
    assert claim_node(body) == "n"
    assert claim_ref(body) == ClaimRef(namespace="ns", name="p-gpu", uid="claim-1")
    assert reserved_for(body) == (PodRef(namespace="ns", name="p", uid="pod-1"),)


def test_a_result_without_consumed_capacity_takes_the_whole_card() -> None:
    (share,) = claim_shares(claim([result()]), CARDS)
    assert (share.memory_mib, share.core_percent) == (CARDS[0].memory_mib, 100)


def test_bytes_round_up_to_whole_mib() -> None:
    (share,) = claim_shares(claim([result(memory=str(MIB + 1))]), CARDS)
    assert share.memory_mib == 2


def test_a_device_the_node_lacks_is_an_error() -> None:
    with pytest.raises(UnknownDevice, match="gpu-7"):
        claim_shares(claim([result("gpu-7", memory="1Gi")]), CARDS)


def test_an_unallocated_claim_has_no_node() -> None:
    assert claim_node({"metadata": {}, "status": {}}) is None


def allocated(memory_mib: int, uid: str = "claim-1", node: str = "n") -> ClaimAllocated:
    return ClaimAllocated(
        id=f"alloc-{uid}",
        at=later(1),
        node=node,
        claim=ClaimRef(namespace="ns", name=uid, uid=uid),
        shares=(
            ClaimShare(
                request="gpu",
                device="gpu-0",
                card_index=0,
                card_uuid=CARDS[0].uuid,
                memory_mib=memory_mib,
                core_percent=10,
            ),
        ),
    )


def dra_state() -> ClusterState:
    state = ClusterState()
    state.apply(msgspec.structs.replace(inventory("n", CARDS), front_door="dra"))
    return state


def test_claims_count_on_their_cards_and_release_frees_them() -> None:
    state = dra_state()
    state.apply(allocated(4096), 1)
    state.apply(allocated(2048, uid="claim-2"), 2)
    node = state.node("n")
    assert node.used_mib[CARDS[0].uuid] == 6144
    assert node.used_core[CARDS[0].uuid] == 20
    assert node.view.cards[0].free_mib == CARDS[0].memory_mib - 6144
    claim_1 = ClaimRef(namespace="ns", name="claim-1", uid="claim-1")
    stale = ClaimReleased(
        id="x0", at=later(2), node="n", claim=claim_1, allocation_id="other", reason="deleted"
    )
    state.apply(stale, 3)  # names another allocation of the claim: nothing changes
    assert state.node("n").used_mib[CARDS[0].uuid] == 6144
    state.apply(
        ClaimReleased(
            id="x1",
            at=later(3),
            node="n",
            claim=claim_1,
            allocation_id="alloc-claim-1",
            reason="deleted",
        ),
        4,
    )
    assert state.node("n").used_mib[CARDS[0].uuid] == 2048
    assert set(state.node("n").claims) == {"claim-2"}


def test_the_extender_places_nothing_on_a_dra_node() -> None:
    state = dra_state()
    node = state.node("n")
    verdict = check_fit(node, request_of(1000), T0)
    assert not verdict.fits
    assert verdict.unresolvable
    assert verdict.kind == "dra_node"
    assert "gpushare.io/front-door=dra" in verdict.reason
    assert node.max_free_mib == 0
    assert reserve(node, pod_ref("p"), request_of(1000), reservation_id="r", at=T0) is None


def test_the_cdi_spec_gives_the_card_and_its_limits() -> None:
    share = allocated(4096).shares[0]
    spec = cdi_spec("claim-1", [share], {card.uuid: card for card in CARDS})
    assert spec["kind"] == CDI_KIND
    (device,) = spec["devices"]
    assert cdi_device_id("claim-1", share) == f"{CDI_KIND}={device['name']}"
    env = device["containerEdits"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={CARDS[0].uuid}" in env
    assert "GPUSHARE_MEMORY_LIMIT_MIB=4096" in env
    assert "GPUSHARE_CORE_PERCENT=10" in env


def test_the_ledger_records_new_claims_and_releases_gone_ones() -> None:
    state = dra_state()
    body = claim([result(memory="4Gi")])
    changes = ledger_changes({"claim-1": body}, state, T0)
    (event,) = changes.events
    assert isinstance(event, ClaimAllocated)
    assert (event.node, event.claim.uid, event.pods[0].uid) == ("n", "claim-1", "pod-1")
    assert event.id == ledger_changes({"claim-1": body}, state, later(9)).events[0].id
    state.apply(event, 1)
    assert ledger_changes({"claim-1": body}, state, T0).events == []  # already recorded
    (released,) = ledger_changes({}, state, T0).events
    assert isinstance(released, ClaimReleased)
    assert (released.allocation_id, released.reason) == (event.id, "deleted")
    unallocated = {**body, "status": {}}
    (dealloc,) = ledger_changes({"claim-1": unallocated}, state, T0).events
    assert isinstance(dealloc, ClaimReleased)
    assert dealloc.reason == "deallocated"


def test_the_ledger_ignores_extender_nodes_and_reports_unknown_devices() -> None:
    extender = ClusterState()
    extender.apply(inventory("n", CARDS))
    assert ledger_changes({"claim-1": claim([result(memory="1Gi")])}, extender, T0) == ([], [])
    changes = ledger_changes({"claim-1": claim([result("gpu-9", memory="1Gi")])}, dra_state(), T0)
    assert changes.events == []
    (problem,) = changes.problems
    assert "gpu-9" in problem


def test_a_claims_story_is_told_like_a_reservations() -> None:
    pod = PodRef(namespace="ns", name="p", uid="pod-1")
    event = msgspec.structs.replace(allocated(4096), pods=(pod,))
    ended = ClaimReleased(
        id="x",
        at=later(5),
        node="n",
        claim=event.claim,
        allocation_id=event.id,
        reason="deleted",
        pods=(pod,),
    )
    logged = [LoggedEvent(seq=1, time=later(1), event=event)]
    (life,) = tell_story("ns", "p", logged, []).lives
    assert life.status == "assigned"
    assert life.why.startswith("allocated on n by kube-scheduler through DRA")
    assert summarize(event).reservation == event.id
    logged.append(LoggedEvent(seq=2, time=later(5), event=ended))
    (life,) = tell_story("ns", "p", logged, []).lives
    assert (life.status, life.why) == ("released", "released from n: deleted")


def test_a_pods_claims_become_a_request_placement_can_plan() -> None:
    def exactly(**fields: Any) -> dict[str, Any]:
        return {"devices": {"requests": [{"name": "gpu", "exactly": fields}]}}

    specs = {
        (TEMPLATE, "ns", "t"): exactly(
            deviceClassName=DEVICE_CLASS,
            count=2,
            capacity={"requests": {"memory": "8Gi", "cores": "20"}},
        ),
        (CLAIM, "ns", "whole"): exactly(deviceClassName=DEVICE_CLASS),
        (CLAIM, "ns", "theirs"): exactly(deviceClassName="gpu.nvidia.com"),
    }
    pod = pod_from_dict(
        {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "containers": [{"name": "c"}],
                "resourceClaims": [
                    {"name": "a", "resourceClaimTemplateName": "t"},
                    {"name": "b", "resourceClaimName": "whole"},
                    {"name": "c", "resourceClaimName": "theirs"},
                ],
            },
        }
    )
    request = claim_request(pod, lambda kind, ns, name: specs.get((kind, ns, name)))
    assert request is not None
    asked = [(c.memory_mib, c.memory_ratio, c.core_percent, c.cards) for c in request.containers]
    assert asked == [(8192, 0, 20, 1), (8192, 0, 20, 1), (0, 100, 0, 1)]
    assert claim_request(pod, lambda *_: None) is None  # not seen yet: nothing to score
    theirs = msgspec.structs.replace(
        pod, spec=msgspec.structs.replace(pod.spec, resource_claims=pod.spec.resource_claims[2:])
    )
    assert claim_request(theirs, lambda kind, ns, name: specs.get((kind, ns, name))) is None


def ref(name: str) -> PodRef:
    return PodRef(namespace="ns", name=name, uid=f"uid-{name}")


def reserved_claim(*names: str) -> dict[str, Any]:
    """The claim allocated 4 GiB of GPU0, reserved for the pods ``names``."""
    body = claim([result(memory="4Gi")])
    body["status"]["reservedFor"] = [
        {"resource": "pods", "name": name, "uid": f"uid-{name}"} for name in names
    ]
    return body


SHARED_CLAIM = [
    # reservedFor, then what the record names: pods, and pods that left
    (("a",), ("a",), ()),
    (("a", "b"), ("a", "b"), ()),
    (("b",), ("b",), ("a",)),
    ((), (), ("b",)),
    (("a",), ("a",), ()),  # a returns: the same pods as the first record, another record
]


def test_a_shared_claims_reserved_for_is_followed_and_counted_once() -> None:
    state = dra_state()
    logged: list[tuple[int, ClaimAllocated]] = []
    for seq, (reserved, pods, left) in enumerate(SHARED_CLAIM, start=1):
        body = reserved_claim(*reserved)
        (event,) = ledger_changes({"claim-1": body}, state, later(seq)).events
        assert isinstance(event, ClaimAllocated)
        assert (event.pods, event.left) == (tuple(map(ref, pods)), tuple(map(ref, left)))
        assert event.shares == claim_shares(body, CARDS)
        state.apply(event, seq)
        logged.append((seq, event))
        node = state.node("n")
        assert node.claims["claim-1"].pods == event.pods
        assert node.claims["claim-1"].allocation_id == event.id
        assert node.used_mib[CARDS[0].uuid] == 4096  # one claim, however many pods
        assert node.containers[CARDS[0].uuid] == 1
        assert ledger_changes({"claim-1": body}, state, later(seq)).events == []  # recorded
    assert len({event.id for _, event in logged}) == len(logged)  # none a duplicate to drop
    assert dict(fold_events(logged).node("n").claims) == dict(state.node("n").claims)
    (released,) = ledger_changes({}, state, later(9)).events
    assert isinstance(released, ClaimReleased)
    assert (released.allocation_id, released.pods) == (logged[-1][1].id, (ref("a"),))
    state.apply(released, len(logged) + 1)
    assert state.node("n").used_mib.get(CARDS[0].uuid, 0) == 0


def test_replicas_recording_the_same_change_write_the_same_id() -> None:
    state = dra_state()
    (first,) = ledger_changes({"claim-1": reserved_claim("a")}, state, T0).events
    state.apply(first, 1)
    joined = [
        ledger_changes({"claim-1": reserved_claim("a", "b")}, state, later(n)).events[0]
        for n in (1, 2)
    ]
    assert joined[0].id == joined[1].id != first.id


def shared_claim_log() -> list[LoggedEvent]:
    """:data:`SHARED_CLAIM`'s first four records, then the claim deleted, as logged."""
    state = dra_state()
    logged: list[LoggedEvent] = []
    for seq, (reserved, _, _) in enumerate(SHARED_CLAIM[:4], start=1):
        (event,) = ledger_changes({"claim-1": reserved_claim(*reserved)}, state, later(seq)).events
        state.apply(event, seq)
        logged.append(LoggedEvent(seq=seq, time=later(seq), event=event))
    (released,) = ledger_changes({}, state, later(5)).events
    return [*logged, LoggedEvent(seq=5, time=later(5), event=released)]


def test_audit_names_every_pod_of_a_shared_claim() -> None:
    rows = [summarize(logged.event) for logged in shared_claim_log()]
    assert [row.pod for row in rows] == ["ns/a", "ns/a, ns/b", "ns/b", "", ""]
    assert [row.detail.split(", reserved ")[-1] for row in rows[:4]] == [
        "for ns/a",
        "for ns/a, ns/b",
        "for ns/b (ns/a left)",
        "for no pod (ns/b left)",
    ]
    assert rows[1].detail == "claim ns/p-gpu: GPU0 4096 MiB, reserved for ns/a, ns/b"
    assert [pods_named(logged.event) for logged in shared_claim_log()][2] == ("ns/b", "ns/a")


def test_explain_tells_each_pods_use_of_a_shared_claim() -> None:
    logged = shared_claim_log()
    # pod, the seqs of the records naming it (all explain reads), the last one it is in
    for name, seqs, last_in in (("a", [1, 2, 3], 2), ("b", [2, 3, 4], 3)):
        mine = [entry for entry in logged if f"ns/{name}" in pods_named(entry.event)]
        assert [entry.seq for entry in mine] == seqs
        (life,) = tell_story("ns", name, mine, []).lives
        (reservation,) = life.reservations  # one use of the claim, from joining to leaving
        assert (reservation.seq, reservation.id) == (seqs[0], logged[last_in - 1].event.id)
        assert [share.memory_mib for share in reservation.shares] == [4096]
        assert (life.status, life.why) == (
            "released",
            "released from n: claim ns/p-gpu is no longer reserved for it",
        )
        while_shared = tell_story("ns", name, [e for e in mine if e.seq <= 2], []).lives[0]
        assert while_shared.status == "assigned"
        assert while_shared.why == "allocated on n by kube-scheduler through DRA (GPU0 4096 MiB)"
