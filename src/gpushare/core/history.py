"""The allocation log read as history: what ``gpushare audit`` and ``gpushare explain`` show.

Pure: the commands read the streams and hand the stored records in. This module picks
the events asked about (by node, pod and time), says in one line what each one means,
and assembles one pod's story: every event and extender decision about it, grouped per
pod UID (a name can be reused), each reservation's cards and outcome, and where the pod
stands now, with why.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import NamedTuple

import msgspec

from gpushare.core.events import (
    AllocationCorrected,
    AllocationEvent,
    AnyDecision,
    BindFailed,
    ClaimAllocated,
    ClaimReleased,
    ClaimShare,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    NodesFiltered,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import ContainerShare, PodRef
from gpushare.core.state import core_by_card, memory_by_card


class LoggedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One allocation event as stored: its stream sequence and the time it was stored."""

    seq: int
    time: datetime
    event: AllocationEvent


class LoggedDecision(msgspec.Struct, frozen=True, kw_only=True):
    """One extender decision record as stored in the decision stream."""

    seq: int
    time: datetime
    decision: AnyDecision


def pods_named(event: AllocationEvent) -> tuple[str, ...]:
    """The ``namespace/name`` of every pod an event is about (none for a node-wide fact)."""
    if isinstance(event, ForeignCardsHeld):
        return tuple(pod for hold in event.holds for pod in hold.pods)
    return tuple(pod.key for pod in _pods_of(event))


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """Which events an operator asked for; ``None`` asks nothing of that field."""

    node: str | None = None
    pod: str | None = None
    """``namespace/name``."""
    since: datetime | None = None
    """Stored at or after this time."""

    def admits(self, logged: LoggedEvent) -> bool:
        if self.node is not None and logged.event.node != self.node:
            return False
        if self.since is not None and logged.time < self.since:
            return False
        return self.pod is None or self.pod in pods_named(logged.event)


def select_events(logged: Iterable[LoggedEvent], selection: Selection) -> Iterator[LoggedEvent]:
    return (entry for entry in logged if selection.admits(entry))


class Summary(NamedTuple):
    """One event in the words of the audit table's columns."""

    kind: str
    pod: str
    reservation: str
    detail: str


def describe_shares(shares: Iterable[ContainerShare]) -> str:
    """``GPU0 8138 MiB, GPU1 4069 MiB 50 % core``: what a reservation holds per card."""
    shares = tuple(shares)
    index = {share.card_uuid: share.card_index for share in shares}
    core = core_by_card(shares)
    parts = []
    for uuid, mib in sorted(memory_by_card(shares).items(), key=lambda item: index[item[0]]):
        percent = f" {core[uuid]} % core" if core.get(uuid) else ""
        parts.append(f"GPU{index[uuid]} {mib} MiB{percent}")
    return ", ".join(parts)


def _detail(event: AllocationEvent) -> str:
    if isinstance(event, PodReserved):
        by = f", by {event.reserved_by}" if event.reserved_by else ""
        return f"{describe_shares(event.shares)} (policy {event.policy}{by})"
    if isinstance(event, BindFailed):
        return event.reason
    if isinstance(event, PodReleased):
        return f"{event.reason}: {event.detail}" if event.detail else event.reason
    if isinstance(event, ContainerAssigned):
        return f"container {event.container} on {', '.join(event.card_uuids)}"
    if isinstance(event, AllocationCorrected):
        return f"{event.reason}; now {describe_shares(event.shares)}"
    if isinstance(event, ForeignCardsHeld):
        holds = [f"{h.card_uuid} by {h.resource} ({', '.join(h.pods)})" for h in event.holds]
        return "; ".join(holds) or "none held"
    if isinstance(event, DiscrepancyFound):
        return f"{event.kind}: {event.detail}"
    if isinstance(event, ClaimAllocated):
        return _claim_detail(event)
    if isinstance(event, ClaimReleased):
        return f"claim {event.claim.key}: {event.reason}"
    return ""  # PodBound: the event says it all


def _keys(pods: Iterable[PodRef]) -> str:
    return ", ".join(pod.key for pod in pods)


def _claim_detail(event: ClaimAllocated) -> str:
    """``claim ns/c: GPU0 4096 MiB, reserved for ns/a, ns/b (ns/x left)``: every pod using
    the claim's cards, since one claim may be shared by several."""
    said = f"claim {event.claim.key}: {describe_shares(claim_container_shares(event))}"
    said += f", reserved for {_keys(event.pods) or 'no pod'}"
    return f"{said} ({_keys(event.left)} left)" if event.left else said


def summarize(event: AllocationEvent) -> Summary:
    """The pods column names the pods an event is for; pods that left a shared claim are
    only in its detail."""
    pods = _keys(event.pods) if isinstance(event, ClaimAllocated) else ", ".join(pods_named(event))
    if isinstance(event, PodReserved | ClaimAllocated):
        reservation = event.id
    elif isinstance(event, ClaimReleased):
        reservation = event.allocation_id
    elif isinstance(event, ForeignCardsHeld):
        reservation = ""
    else:
        reservation = event.reservation_id
    return Summary(type(event).__name__, pods, reservation, _detail(event))


DRA_POLICY = "dra"
"""The policy a claim's story shows: kube-scheduler chose the card (Dynamic Resource
Allocation), not one of ours."""


def claim_container_shares(event: ClaimAllocated) -> tuple[ContainerShare, ...]:
    """A claim's shares as the containers' shares the stories show (one per request)."""
    return tuple(_as_container_share(event.claim.name, share) for share in event.shares)


def _as_container_share(claim: str, share: ClaimShare) -> ContainerShare:
    return ContainerShare(
        container=f"{claim}/{share.request}",
        card_index=share.card_index,
        card_uuid=share.card_uuid,
        memory_mib=share.memory_mib,
        core_percent=share.core_percent,
    )


RESERVED = "reserved"
BOUND = "bound"
ASSIGNED = "assigned"
BIND_FAILED = "bind_failed"
RELEASED = "released"
NOT_RESERVED = "not_reserved"
_LIVE = frozenset({RESERVED, BOUND, ASSIGNED})


class ReservationStory(msgspec.Struct, frozen=True, kw_only=True):
    """One reservation of a pod: the cards it chose and how far it came."""

    id: str
    node: str
    seq: int
    time: datetime
    shares: tuple[ContainerShare, ...]
    policy: str
    reserved_by: str
    state: str = RESERVED
    """``reserved``, ``bound``, ``assigned``, ``bind_failed`` or ``released``."""
    assigned: tuple[str, ...] = ()
    """Containers the device plugin has handed their cards to."""
    reason: str = ""
    """Why it ended (bind failure, release reason)."""
    corrected: bool = False

    @property
    def live(self) -> bool:
        return self.state in _LIVE


class PodLife(msgspec.Struct, frozen=True, kw_only=True):
    """Everything recorded about one pod UID, and where it stands now."""

    uid: str
    status: str
    """The state of its current reservation, or ``not_reserved``."""
    why: str
    node: str = ""
    reservations: tuple[ReservationStory, ...] = ()
    events: tuple[LoggedEvent, ...] = ()
    decisions: tuple[LoggedDecision, ...] = ()


class PodStory(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    lives: tuple[PodLife, ...] = ()
    """One per pod UID that bore this name, oldest first."""


def _advance(reservation: ReservationStory, event: AllocationEvent) -> ReservationStory:
    """``reservation`` after ``event`` (an event about it, in log order)."""
    change = msgspec.structs.replace
    if isinstance(event, PodBound):
        return change(reservation, state=BOUND) if reservation.state == RESERVED else reservation
    if isinstance(event, ContainerAssigned):
        assigned = tuple(dict.fromkeys((*reservation.assigned, event.container)))
        wanted = {share.container for share in reservation.shares}
        done = reservation.state == BOUND and wanted <= set(assigned)
        return change(reservation, assigned=assigned, state=ASSIGNED if done else reservation.state)
    if isinstance(event, AllocationCorrected):
        mine = [c.shares for c in event.corrected() if c.reservation_id == reservation.id]
        return change(reservation, shares=mine[0], corrected=True) if mine else reservation
    if isinstance(event, BindFailed):
        return change(reservation, state=BIND_FAILED, reason=event.reason)
    if isinstance(event, PodReleased):
        return change(reservation, state=RELEASED, reason=_detail(event))
    return reservation


def _claim_story(logged: LoggedEvent, event: ClaimAllocated) -> ReservationStory:
    return ReservationStory(
        id=event.id,
        node=event.node,
        seq=logged.seq,
        time=logged.time,
        shares=claim_container_shares(event),
        policy=DRA_POLICY,
        reserved_by="kube-scheduler",
        state=ASSIGNED,
    )


def _follow_claim(
    found: dict[str, ReservationStory],
    using: dict[str, str],
    logged: LoggedEvent,
    event: ClaimAllocated,
    pod_uid: str,
) -> None:
    """Apply a claim's record to the pod's stories (``using``: claim UID → the id of the
    story of the pod's use of it). A record that replaces an earlier one (reserved for
    other pods too, or reallocated) continues the live story, under the new id a release
    will name; one that no longer names the pod (it left a shared claim) ends it."""
    current = using.pop(event.claim.uid, None)
    story = found.get(current) if current is not None else None
    if story is not None and not story.live:
        story = None  # released: a record naming the pod again begins a new story
    if any(pod.uid == pod_uid for pod in event.pods):
        if story is None:
            found[event.id] = _claim_story(logged, event)
        else:
            del found[story.id]
            shares = claim_container_shares(event)
            found[event.id] = msgspec.structs.replace(story, id=event.id, shares=shares)
        using[event.claim.uid] = event.id
    elif story is not None:
        reason = f"claim {event.claim.key} is no longer reserved for it"
        found[story.id] = msgspec.structs.replace(story, state=RELEASED, reason=reason)


def _reservations(events: Iterable[LoggedEvent], pod_uid: str) -> tuple[ReservationStory, ...]:
    found: dict[str, ReservationStory] = {}
    using: dict[str, str] = {}
    for logged in events:
        event = logged.event
        if isinstance(event, PodReserved):
            found[event.id] = ReservationStory(
                id=event.id,
                node=event.node,
                seq=logged.seq,
                time=logged.time,
                shares=event.shares,
                policy=event.policy,
                reserved_by=event.reserved_by,
            )
        elif isinstance(event, ClaimAllocated):
            _follow_claim(found, using, logged, event, pod_uid)
        elif isinstance(event, ClaimReleased):
            if event.allocation_id in found:
                found[event.allocation_id] = msgspec.structs.replace(
                    found[event.allocation_id], state=RELEASED, reason=event.reason
                )
        elif isinstance(event, AllocationCorrected):
            for correction in event.corrected():
                if correction.reservation_id in found:
                    rid = correction.reservation_id
                    found[rid] = _advance(found[rid], event)
        elif not isinstance(event, ForeignCardsHeld) and event.reservation_id in found:
            found[event.reservation_id] = _advance(found[event.reservation_id], event)
    return tuple(sorted(found.values(), key=lambda reservation: reservation.seq))


def _why(reservation: ReservationStory) -> str:
    node, cards = reservation.node, describe_shares(reservation.shares)
    if reservation.state == RESERVED:
        return f"reserved on {node} ({cards}); waiting for the binder to bind it"
    if reservation.state == BOUND:
        done, wanted = len(reservation.assigned), len({s.container for s in reservation.shares})
        return (
            f"bound to {node} ({cards}); {done} of {wanted} containers have their cards, "
            "waiting for the kubelet to admit it"
        )
    if reservation.state == ASSIGNED and reservation.policy == DRA_POLICY:
        return f"allocated on {node} by kube-scheduler through DRA ({cards})"
    if reservation.state == ASSIGNED:
        return f"running on {node}: every container has its card ({cards})"
    if reservation.state == BIND_FAILED:
        return f"binding to {node} failed: {reservation.reason}"
    return f"released from {node}: {reservation.reason}"


def _unreserved_why(decisions: Iterable[LoggedDecision]) -> str:
    filters = [d.decision for d in decisions if isinstance(d.decision, NodesFiltered)]
    if not filters:
        return "never reserved, and no extender decision recorded about it"
    last = filters[-1]
    if not last.passed:
        rejected = len(last.failed) + last.omitted
        return f"never reserved: the last filter passed no node ({rejected} filtered out)"
    return (
        f"not reserved: the last filter passed {len(last.passed) + last.omitted} node(s) "
        f"({', '.join(last.passed)}), but no bind reached gpushare"
    )


def _standing(
    reservations: tuple[ReservationStory, ...], decisions: Iterable[LoggedDecision]
) -> tuple[str, str, str]:
    """(status, why, node): the bound live reservation first, else the latest one."""
    live = [reservation for reservation in reservations if reservation.live]
    if live:
        current = min(live, key=lambda r: (r.state == RESERVED, -r.seq))
    elif reservations:
        current = reservations[-1]
    else:
        return NOT_RESERVED, _unreserved_why(decisions), ""
    why = _why(current)
    others = [reservation.node for reservation in live if reservation is not current]
    if others:
        why += f"; also reserved on {', '.join(others)}"
    if current.corrected:
        why += "; its cards were corrected to what the kubelet handed out"
    return current.state, why, current.node


def _life(uid: str, events: list[LoggedEvent], decisions: list[LoggedDecision]) -> PodLife:
    events.sort(key=lambda logged: logged.seq)
    decisions.sort(key=lambda logged: logged.seq)
    reservations = _reservations(events, uid)
    status, why, node = _standing(reservations, decisions)
    return PodLife(
        uid=uid,
        status=status,
        why=why,
        node=node,
        reservations=reservations,
        events=tuple(events),
        decisions=tuple(decisions),
    )


def _pods_of(event: AllocationEvent) -> tuple[PodRef, ...]:
    if isinstance(event, ClaimAllocated):
        return (*event.pods, *event.left)
    if isinstance(event, ClaimReleased):
        return event.pods
    if isinstance(event, ForeignCardsHeld) or event.pod is None:
        return ()
    if isinstance(event, AllocationCorrected):
        return tuple(correction.pod for correction in event.corrected())
    return (event.pod,)


def tell_story(
    namespace: str,
    name: str,
    events: Iterable[LoggedEvent],
    decisions: Iterable[LoggedDecision],
) -> PodStory:
    """Everything the log and the decision stream say about ``namespace/name``, per UID."""
    key = f"{namespace}/{name}"
    by_uid: dict[str, tuple[list[LoggedEvent], list[LoggedDecision]]] = {}
    first_seen: dict[str, datetime] = {}
    for logged in events:
        for pod in _pods_of(logged.event):
            if pod.key == key:
                by_uid.setdefault(pod.uid, ([], []))[0].append(logged)
                first_seen[pod.uid] = min(first_seen.get(pod.uid, logged.time), logged.time)
    for considered in decisions:
        if considered.decision.pod.key == key:
            uid = considered.decision.pod.uid
            by_uid.setdefault(uid, ([], []))[1].append(considered)
            first_seen[uid] = min(first_seen.get(uid, considered.time), considered.time)
    lives = [_life(uid, *by_uid[uid]) for uid in sorted(by_uid, key=first_seen.__getitem__)]
    return PodStory(namespace=namespace, name=name, lives=tuple(lives))
