"""kubectl-inspect-gpushare's tables over folded states (`gpushare inspect`, `kubectl gpushare`)."""

from __future__ import annotations

from gpushare.cli.kubectl_plugin import card_uses, cluster_lines, detail_lines, summary_lines
from gpushare.core.events import (
    AnyEvent,
    ClaimAllocated,
    ClaimShare,
    ContainerAssigned,
    ForeignCardsHeld,
    ForeignHold,
    PodBound,
    PodReserved,
)
from gpushare.core.model import ClaimRef, ContainerShare, PodRef
from gpushare.core.state import ClusterState, NodeState, fold_events
from tests.unit.core.factories import T0, V100, inventory, make_card

N1_CARDS = (make_card(0, node="N1"), make_card(1, node="N1"))
N2_CARDS = (make_card(0, node="N2", memory_mib=32510),)


def reservation(node: str, name: str, *shares: tuple[int, int]) -> PodReserved:
    return PodReserved(
        id=f"r-{name}",
        at=T0,
        node=node,
        pod=PodRef(namespace="default", name=name, uid=f"u-{name}"),
        shares=tuple(
            ContainerShare(
                container=f"c{i}",
                card_index=index,
                card_uuid=f"GPU-{node}-{index}",
                memory_mib=mib,
            )
            for i, (index, mib) in enumerate(shares)
        ),
    )


def cluster(*extra: AnyEvent) -> ClusterState:
    events: list[AnyEvent] = [
        inventory("N1", N1_CARDS),
        inventory("N2", N2_CARDS),
        reservation("N1", "binpack-1", (0, 8138)),
        reservation("N1", "binpack-2", (1, 12207)),
        reservation("N2", "big", (0, 20000)),
        *extra,
    ]
    seqs = range(1, len(events) + 1)
    return fold_events(zip(seqs, events, strict=True))


def nodes(state: ClusterState) -> list[NodeState]:
    return [state.nodes[name] for name in sorted(state.nodes)]


def test_summary_is_seed_000s_table() -> None:
    state = cluster()
    assert summary_lines(nodes(state), "unknown") + cluster_lines(nodes(state)) == [
        "NAME  IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU Memory(MiB)",
        "N1    unknown    8138/16276             12207/16276            20345/32552",
        "N2    unknown    20000/32510            0/0                    20000/32510",
        "-" * 78,
        "Allocated/Total GPU Memory In Cluster:",
        "40345/65062 (62%)",
    ]


def test_details_show_each_pods_mib_on_each_card_and_its_state() -> None:
    bound = PodBound(
        id="b",
        at=T0,
        node="N1",
        pod=PodRef(namespace="default", name="binpack-1", uid="u-binpack-1"),
        reservation_id="r-binpack-1",
    )
    assigned = ContainerAssigned(
        id="a",
        at=T0,
        node="N1",
        pod=bound.pod,
        reservation_id="r-binpack-1",
        container="c0",
        card_uuids=("GPU-N1-0",),
    )
    state = cluster(bound, assigned)
    assert detail_lines([state.nodes["N1"]], "unknown") == [
        "",
        "NAME:       N1",
        "IPADDRESS:  unknown",
        "",
        "NAME       NAMESPACE  GPU0(Allocated)  GPU1(Allocated)  STATE",
        "binpack-1  default    8138             0                assigned",
        "binpack-2  default    0                12207            reserved",
        "Allocated :  20345 (62%)",
        "Total :      32552",
        "-" * 64,
        "",
    ]


def test_a_card_only_the_log_names_is_still_shown_marked() -> None:
    """Today's inventory of N1 lists only GPU0; a past reservation holds GPU1."""
    state = cluster()
    state.apply(inventory("N1", N1_CARDS[:1], at=T0.replace(year=2027)))
    node = state.nodes["N1"]
    uses = card_uses(node)
    assert [(u.label, u.cell) for u in uses] == [("GPU0", "8138/16276"), ("GPU1*", "12207/?")]
    assert uses[1].json() == {
        "index": 1,
        "uuid": "GPU-N1-1",
        "total_mib": None,
        "used_mib": 12207,
        "in_inventory": False,
    }
    summary = summary_lines([node], "unknown")
    assert summary[1].split() == ["N1", "unknown", "8138/16276", "12207/?", "20345/16276"]
    assert "* a card the log names that today's inventory does not list" in summary
    details = detail_lines([node], "unknown")
    assert "GPU1*(Allocated)" in details[4]
    assert details[6].split() == ["binpack-2", "default", "0", "12207", "reserved"]


def test_a_node_gone_from_the_inventory_shows_its_cards_from_the_log() -> None:
    state = fold_events([(1, reservation("gone", "old", (0, 100), (3, 200)))])
    assert [(u.label, u.cell) for u in card_uses(state.nodes["gone"])] == [
        ("GPU0*", "100/?"),
        ("GPU3*", "200/?"),
    ]


def test_cards_held_through_another_device_plugin_are_rows_of_their_own() -> None:
    hold = ForeignHold(card_uuid="GPU-N1-1", resource="nvidia.com/gpu", pods=("ml/train",))
    held = ForeignCardsHeld(id="h", at=T0, node="N1", holds=(hold,))
    state = cluster(held)
    lines = detail_lines([state.nodes["N1"]], "unknown")
    assert lines[7].split() == ["ml/train", "-", "0", str(V100), "held", "via", "nvidia.com/gpu"]
    assert lines[8] == f"Allocated :  {8138 + 12207 + V100} (112%)"


def test_dra_claims_are_rows_of_their_own() -> None:
    claim = ClaimAllocated(
        id="c",
        at=T0,
        node="N1",
        claim=ClaimRef(namespace="ml", name="infer-gpu", uid="k"),
        shares=(
            ClaimShare(
                request="gpu", device="gpu-1", card_index=1, card_uuid="GPU-N1-1", memory_mib=4096
            ),
        ),
        pods=(PodRef(namespace="ml", name="infer", uid="p"),),
    )
    lines = detail_lines([cluster(claim).nodes["N1"]], "unknown")
    assert lines[7].split() == ["infer", "ml", "0", "4096", "dra", "claim", "infer-gpu"]
    assert (
        lines[8]
        == f"Allocated :  {8138 + 12207 + 4096} ({(8138 + 12207 + 4096) * 100 // (2 * V100)}%)"
    )
    assert detail_lines([cluster(claim).nodes["N1"]], "unknown", namespace="default")[7] != lines[7]


def test_an_empty_cluster_is_zero_of_zero() -> None:
    assert cluster_lines([]) == ["Allocated/Total GPU Memory In Cluster:", "0/0 (0%)"]
