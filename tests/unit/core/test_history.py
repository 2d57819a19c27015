"""The allocation log read as history: selection, one-line summaries, and a pod's story."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pytest

from gpushare.core.events import (
    AllocationCorrected,
    AllocationEvent,
    BindFailed,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    NodesFiltered,
    NodesScored,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.history import (
    LoggedDecision,
    LoggedEvent,
    Selection,
    Summary,
    describe_shares,
    select_events,
    summarize,
    tell_story,
)
from gpushare.core.model import ContainerShare, PodRef
from tests.unit.core.factories import T0, later, make_card

WEB = PodRef(namespace="default", name="web", uid="u1")
WEB_AGAIN = PodRef(namespace="default", name="web", uid="u2")
OTHER = PodRef(namespace="default", name="db", uid="u9")


def share(
    index: int = 0, mib: int = 8138, container: str = "main", core: int = 0
) -> ContainerShare:
    card = make_card(index, node="n1")
    return ContainerShare(
        container=container,
        card_index=index,
        card_uuid=card.uuid,
        memory_mib=mib,
        core_percent=core,
    )


def reserved(
    rid: str = "r1",
    node: str = "n1",
    pod: PodRef = WEB,
    shares: Sequence[ContainerShare] = (share(),),
) -> PodReserved:
    return PodReserved(
        id=rid, at=T0, node=node, pod=pod, shares=tuple(shares), reserved_by="allocator-a"
    )


def bound(rid: str = "r1", node: str = "n1", pod: PodRef = WEB) -> PodBound:
    return PodBound(id=f"b-{rid}", at=T0, node=node, pod=pod, reservation_id=rid)


def assigned(container: str = "main", rid: str = "r1", pod: PodRef = WEB) -> ContainerAssigned:
    return ContainerAssigned(
        id=f"a-{rid}-{container}",
        at=T0,
        node="n1",
        pod=pod,
        reservation_id=rid,
        container=container,
        card_uuids=("GPU-n1-0",),
    )


def failed(rid: str = "r1", node: str = "n1", reason: str = "pod not found") -> BindFailed:
    return BindFailed(id=f"f-{rid}", at=T0, node=node, pod=WEB, reservation_id=rid, reason=reason)


def released(rid: str = "r1", pod: PodRef = WEB, detail: str = "") -> PodReleased:
    return PodReleased(
        id=f"x-{rid}",
        at=T0,
        node="n1",
        pod=pod,
        reservation_id=rid,
        reason="deleted",
        detail=detail,
    )


def foreign(*pods: str) -> ForeignCardsHeld:
    hold = ForeignHold(card_uuid="GPU-n1-1", resource="nvidia.com/gpu", pods=pods)
    return ForeignCardsHeld(id="h", at=T0, node="n1", holds=(hold,))


def log(*events: AllocationEvent) -> list[LoggedEvent]:
    """Events at sequences 1, 2, ..., stored one second apart."""
    return [LoggedEvent(seq=i, time=later(i), event=e) for i, e in enumerate(events, 1)]


def filter_record(
    passed: Sequence[str] = (), rejected: dict[str, str] | None = None, pod: PodRef = WEB
) -> NodesFiltered:
    return NodesFiltered(
        id="d",
        at=T0,
        pod=pod,
        allocator="allocator-a",
        request="main: 8138 MiB",
        passed=tuple(passed),
        failed=rejected or {},
    )


def decisions(*records: NodesFiltered | NodesScored, at: float = 0.5) -> list[LoggedDecision]:
    return [
        LoggedDecision(seq=i, time=later(at + i / 10), decision=record)
        for i, record in enumerate(records, 1)
    ]


PODLESS = DiscrepancyFound(id="d", at=T0, node="n1", kind="unknown_to_log", detail="?")

# -- selection ----------------------------------------------------------------------------

SELECTIONS = [
    ("nothing asked", Selection(), reserved(), T0, True),
    ("its node", Selection(node="n1"), reserved(), T0, True),
    ("another node", Selection(node="n2"), reserved(), T0, False),
    ("its pod", Selection(pod="default/web"), bound(), T0, True),
    ("another pod", Selection(pod="default/db"), bound(), T0, False),
    ("a pod holding a foreign card", Selection(pod="ml/train"), foreign("ml/train"), T0, True),
    ("a discrepancy about no pod", Selection(pod="default/web"), PODLESS, T0, False),
    ("stored after since", Selection(since=T0), reserved(), later(1), True),
    ("stored exactly at since", Selection(since=T0), reserved(), T0, True),
    ("stored before since", Selection(since=later(1)), reserved(), T0, False),
    ("node and pod", Selection(node="n1", pod="default/web"), reserved(), T0, True),
    ("node right, pod wrong", Selection(node="n1", pod="default/db"), reserved(), T0, False),
]


@pytest.mark.parametrize(
    ("selection", "event", "stored", "admitted"),
    [case[1:] for case in SELECTIONS],
    ids=[case[0] for case in SELECTIONS],
)
def test_selection(
    selection: Selection, event: AllocationEvent, stored: datetime, admitted: bool
) -> None:
    assert selection.admits(LoggedEvent(seq=1, time=stored, event=event)) is admitted


def test_select_events_keeps_log_order() -> None:
    entries = log(reserved(), reserved("r2", pod=OTHER), bound(), bound("r2", pod=OTHER))
    picked = select_events(entries, Selection(pod="default/db"))
    assert [entry.seq for entry in picked] == [2, 4]


# -- one line per event -------------------------------------------------------------------

SUMMARIES = [
    (
        reserved(shares=(share(0, 8138), share(1, 4069, "side", core=50))),
        Summary(
            "PodReserved",
            "default/web",
            "r1",
            "GPU0 8138 MiB, GPU1 4069 MiB 50 % core (policy binpack, by allocator-a)",
        ),
    ),
    (bound(), Summary("PodBound", "default/web", "r1", "")),
    (failed(), Summary("BindFailed", "default/web", "r1", "pod not found")),
    (
        assigned(),
        Summary("ContainerAssigned", "default/web", "r1", "container main on GPU-n1-0"),
    ),
    (released(), Summary("PodReleased", "default/web", "r1", "deleted")),
    (
        released(detail="pod gone from the API"),
        Summary("PodReleased", "default/web", "r1", "deleted: pod gone from the API"),
    ),
    (
        AllocationCorrected(
            id="c", at=T0, node="n1", pod=WEB, reservation_id="r1", shares=(share(1),), reason="x"
        ),
        Summary("AllocationCorrected", "default/web", "r1", "x; now GPU1 8138 MiB"),
    ),
    (
        foreign("ml/a", "ml/b"),
        Summary("ForeignCardsHeld", "ml/a, ml/b", "", "GPU-n1-1 by nvidia.com/gpu (ml/a, ml/b)"),
    ),
    (
        ForeignCardsHeld(id="h", at=T0, node="n1", holds=()),
        Summary("ForeignCardsHeld", "", "", "none held"),
    ),
    (
        DiscrepancyFound(
            id="d",
            at=T0,
            node="n1",
            kind="card_mismatch",
            detail="kubelet says GPU1",
            pod=WEB,
            reservation_id="r1",
        ),
        Summary("DiscrepancyFound", "default/web", "r1", "card_mismatch: kubelet says GPU1"),
    ),
]


@pytest.mark.parametrize(("event", "summary"), SUMMARIES, ids=[s[1].kind for s in SUMMARIES])
def test_summarize(event: AllocationEvent, summary: Summary) -> None:
    assert summarize(event) == summary


def test_describe_shares_adds_up_containers_per_card_in_card_order() -> None:
    shares = (share(1, 1000, "a"), share(0, 2000, "b"), share(1, 500, "c"))
    assert describe_shares(shares) == "GPU0 2000 MiB, GPU1 1500 MiB"


# -- a pod's story ------------------------------------------------------------------------

STORIES = [
    (
        "reserved, waiting for the binder",
        log(reserved()),
        "reserved",
        "n1",
        "reserved on n1 (GPU0 8138 MiB); waiting for the binder to bind it",
    ),
    (
        "bound, waiting for the kubelet",
        log(reserved(shares=(share(), share(1, 100, "side"))), bound(), assigned()),
        "bound",
        "n1",
        "1 of 2 containers have their cards",
    ),
    (
        "every container assigned",
        log(reserved(), bound(), assigned()),
        "assigned",
        "n1",
        "running on n1: every container has its card (GPU0 8138 MiB)",
    ),
    (
        "the binding failed",
        log(reserved(), failed()),
        "bind_failed",
        "n1",
        "binding to n1 failed: pod not found",
    ),
    (
        "released with a detail",
        log(reserved(), bound(), assigned(), released(detail="phase Succeeded")),
        "released",
        "n1",
        "released from n1: deleted: phase Succeeded",
    ),
    (
        "a failed bind then a bind elsewhere",
        log(reserved(), failed(), reserved("r2", "n2"), bound("r2", "n2")),
        "bound",
        "n2",
        "bound to n2",
    ),
    (
        "bound on one node while a retry reserved another",
        log(reserved(), bound(), reserved("r2", "n2")),
        "bound",
        "n1",
        "also reserved on n2",
    ),
    (
        "cards corrected by a reconciler",
        log(
            reserved(),
            bound(),
            AllocationCorrected(
                id="c",
                at=T0,
                node="n1",
                pod=WEB,
                reservation_id="r1",
                shares=(share(1),),
                reason="",
            ),
        ),
        "bound",
        "n1",
        "(GPU1 8138 MiB); 0 of 1 containers have their cards, waiting for the kubelet to admit "
        "it; its cards were corrected to what the kubelet handed out",
    ),
    (
        "an event of an unknown reservation changes nothing",
        log(reserved(), bound("r-other")),
        "reserved",
        "n1",
        "waiting for the binder",
    ),
]


@pytest.mark.parametrize(
    ("events", "status", "node", "why"), [s[1:] for s in STORIES], ids=[s[0] for s in STORIES]
)
def test_where_a_pod_stands(events: list[LoggedEvent], status: str, node: str, why: str) -> None:
    story = tell_story("default", "web", events, [])
    (life,) = story.lives
    assert (life.uid, life.status, life.node) == ("u1", status, node)
    assert why in life.why
    assert life.events == tuple(events)


UNRESERVED = [
    (
        "nothing but a filter that passed no node",
        [filter_record((), {"n1": "full", "n2": "full"})],
        "never reserved: the last filter passed no node (2 filtered out)",
    ),
    (
        "a filter that passed nodes",
        [filter_record(("n1", "n2"), {"n3": "full"})],
        "not reserved: the last filter passed 2 node(s) (n1, n2), but no bind reached gpushare",
    ),
    (
        "the last filter counts",
        [filter_record(("n1",)), filter_record((), {"n1": "full"})],
        "the last filter passed no node (1 filtered out)",
    ),
    (
        "only scores",
        [NodesScored(id="s", at=T0, pod=WEB, policy="binpack", scores={"n1": 3})],
        "never reserved, and no extender decision recorded about it",
    ),
]


@pytest.mark.parametrize(
    ("records", "why"), [u[1:] for u in UNRESERVED], ids=[u[0] for u in UNRESERVED]
)
def test_a_pod_never_reserved_says_what_the_filter_said(
    records: list[NodesFiltered | NodesScored], why: str
) -> None:
    (life,) = tell_story("default", "web", [], decisions(*records)).lives
    assert (life.status, life.node, life.reservations) == ("not_reserved", "", ())
    assert why in life.why


def test_nothing_recorded_is_an_empty_story() -> None:
    story = tell_story(
        "default", "web", log(reserved(pod=OTHER)), decisions(filter_record(pod=OTHER))
    )
    assert story.lives == ()


def test_a_reused_name_is_told_per_uid_oldest_first() -> None:
    events = log(
        reserved(),
        bound(),
        released(),
        reserved("r2", pod=WEB_AGAIN),
        reserved("r9", pod=OTHER),
    )
    records = decisions(filter_record(("n1",)), filter_record(("n1",), pod=WEB_AGAIN), at=0)
    story = tell_story("default", "web", reversed(events), records)
    first, second = story.lives
    assert (first.uid, first.status) == ("u1", "released")
    assert [e.seq for e in first.events] == [1, 2, 3]
    assert [d.decision.pod.uid for d in first.decisions] == ["u1"]
    assert (second.uid, second.status) == ("u2", "reserved")
    assert [e.seq for e in second.events] == [4]
    assert [d.decision.pod.uid for d in second.decisions] == ["u2"]


def test_each_reservation_keeps_its_cards_policy_and_outcome() -> None:
    events = log(reserved(), failed(), reserved("r2", "n2", shares=(share(1, 100),)), bound("r2"))
    (life,) = tell_story("default", "web", events, []).lives
    first, second = life.reservations
    assert (first.id, first.node, first.seq, first.state, first.reason) == (
        "r1",
        "n1",
        1,
        "bind_failed",
        "pod not found",
    )
    assert (second.id, second.node, second.state, second.policy, second.reserved_by) == (
        "r2",
        "n2",
        "bound",
        "binpack",
        "allocator-a",
    )
    assert second.shares == (share(1, 100),)
    assert second.time == later(3)


def test_foreign_holds_and_podless_discrepancies_are_not_part_of_a_pods_story() -> None:
    events = log(foreign("default/web"), PODLESS, reserved())
    (life,) = tell_story("default", "web", events, []).lives
    assert [e.seq for e in life.events] == [3]
