"""Events are believed for where they came from, not for what they say.

NATS permissions decide who may publish on which subject (:mod:`.permissions`): a node's
user only on ``gpushare.inventory.<node>`` and ``gpushare.alloc.<node>.agent``, the
allocators on ``gpushare.alloc.*.allocator``, the binders on ``gpushare.alloc.*.binder``.
But a body names a node and a type as well, and the fold files each event under the
node its body names. So before anything folds, binds from or shows an event, the body is
checked against its subject:

* the node in the body must be the subject's node;
* its type must be one the subject's writer role writes (:data:`WRITES`): only
  allocators reserve, only binders bind, release and adopt, only a node's agent assigns
  containers, corrects allocations and reports foreign cards, and only the reporter
  reports inventory.

Anything else raises :class:`RefusedOrigin`, a :class:`msgspec.ValidationError`: every
reader already treats a body that does not validate as one it must not fold (the
follower skips it and counts it, the binders' consumer records it in the rejected
stream, ``audit`` shows the reason). A compromised node can still lie about itself,
never about another node, nor write what its role does not write.

Pure: subjects and bytes in, an event or an error out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from gpushare.bus.subjects import (
    ALLOCATION_PREFIX,
    INVENTORY_PREFIX,
    NODE_AGENT_REPORTER_PREFIX,
    WRITERS,
)
from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    BindFailed,
    ClaimAllocated,
    ClaimReleased,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
    decode_event,
)
from gpushare.core.reconciliation import ADOPTED_POLICY

REPORTER = "reporter"
"""The writer of an inventory subject (a node's reporter)."""


class RefusedOrigin(msgspec.ValidationError):
    """A well-formed event on a subject whose writer may not have written it."""


@dataclass(frozen=True)
class Origin:
    """What a subject says about who wrote a message: the node and the writer role."""

    node: str
    writer: str


def origin_of(subject: str) -> Origin | None:
    """``gpushare.alloc.<node>.<writer>`` or ``gpushare.inventory.<node>``; ``None`` for
    any other shape (a legacy ``gpushare.alloc.<node>`` names no writer)."""
    tokens = subject.split(".")
    prefix = ALLOCATION_PREFIX.split(".")
    if tokens[: len(prefix)] == prefix and len(tokens) == len(prefix) + 2:
        node, writer = tokens[len(prefix) :]
        return Origin(node.replace("~", "."), writer) if writer in WRITERS else None
    prefix = INVENTORY_PREFIX.split(".")
    if tokens[: len(prefix)] == prefix and len(tokens) == len(prefix) + 1:
        return Origin(tokens[-1].replace("~", "."), REPORTER)
    return None


def _agent_finding(event: AnyEvent) -> bool:
    return isinstance(event, DiscrepancyFound) and event.reporter.startswith(
        NODE_AGENT_REPORTER_PREFIX
    )


def _adoption(event: AnyEvent) -> bool:
    return isinstance(event, PodReserved) and event.policy == ADOPTED_POLICY


WRITES: dict[str, Callable[[AnyEvent], bool]] = {
    "allocator": lambda e: isinstance(e, PodReserved) and not _adoption(e),
    "binder": lambda e: (
        isinstance(
            e,
            PodBound
            | BindFailed
            | PodReleased
            | ContainerAssigned
            | ClaimAllocated
            | ClaimReleased,
        )
        or _adoption(e)
        or (isinstance(e, DiscrepancyFound) and not _agent_finding(e))
    ),
    "agent": lambda e: (
        isinstance(e, ContainerAssigned | AllocationCorrected | ForeignCardsHeld)
        or _agent_finding(e)
    ),
    REPORTER: lambda e: isinstance(e, InventoryReported),
}
"""What each writer role may append. The binder writes ``ContainerAssigned`` for the
containers of the pods it adopts; a node agent's findings name it as their reporter."""


def refusal(subject: str, event: AnyEvent) -> str | None:
    """Why ``event`` cannot have come from ``subject``'s writer; ``None`` when it can."""
    origin = origin_of(subject)
    kind = type(event).__name__
    if origin is None:
        return f"{kind} on {subject}, a subject that names no writer"
    if event.node != origin.node:
        return f"{kind} about node {event.node!r} on node {origin.node!r}'s subject {subject}"
    if not WRITES[origin.writer](event):
        return f"{kind} on {subject}: a {origin.writer} does not write it"
    if isinstance(event, DiscrepancyFound) and _agent_finding(event):
        expected = f"{NODE_AGENT_REPORTER_PREFIX}{origin.node}"
        if event.reporter != expected:
            return f"DiscrepancyFound reported by {event.reporter!r} on {subject}"
    return None


def decode_from(subject: str, data: bytes) -> AnyEvent:
    """Decode an event published on ``subject`` and check it came from there.

    Raises :class:`msgspec.MsgspecError`: ``DecodeError``/``ValidationError`` for a bad
    body, :class:`RefusedOrigin` for a good body on the wrong subject."""
    event = decode_event(data)
    reason = refusal(subject, event)
    if reason is not None:
        raise RefusedOrigin(reason)
    return event
