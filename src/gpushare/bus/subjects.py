"""The only home of stream names and subject strings.

Node names are DNS subdomains and may contain dots, which NATS reads as token
separators; a dot becomes ``~`` in a subject token (``~`` is never in a node name).

The allocation log has one subject per node and writer role,
``gpushare.alloc.<node>.<writer>``, so the server's permissions can say who may append
what (only allocators reserve; a node's agent writes only its own node). Every writer
still compare-and-sets on the whole node (``<node>.*``: see :mod:`gpushare.bus.log`).
"""

from __future__ import annotations

from typing import Literal

from gpushare.core.events import (
    AllocationCorrected,
    AllocationEvent,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    PodReserved,
)
from gpushare.core.reconciliation import ADOPTED_POLICY

INVENTORY_STREAM = "GPUSHARE_INVENTORY"
ALLOCATION_STREAM = "GPUSHARE_ALLOCATIONS"
DECISION_STREAM = "GPUSHARE_DECISIONS"
"""The extender's reasoning per pod (filter and prioritize records), kept for a while."""
REJECTED_STREAM = "GPUSHARE_REJECTED"
"""Messages a consumer could not decode: terminated where they were, recorded here."""
BINDER_QUEUE_STREAM = "GPUSHARE_BINDER_QUEUE"
"""The allocation log again, as the binders' work: a stream that sources it, so that the
binders' shared durable consumer lives on a stream where no other user may create,
change, pull from or acknowledge consumers (:mod:`gpushare.bus.permissions`)."""
SNAPSHOT_BUCKET = "GPUSHARE_SNAPSHOTS"
"""The JetStream KV bucket of folded-state snapshots (start-up without a full replay)."""

INVENTORY_PREFIX = "gpushare.inventory"
AGENT_PREFIX = "gpushare.agent"
"""Core NATS request-reply with the node agents (no stream: the answer is about now)."""
ALLOCATION_PREFIX = "gpushare.alloc"
DECISION_PREFIX = "gpushare.decisions"
REJECTED_PREFIX = "gpushare.rejected"

ALL_INVENTORY = f"{INVENTORY_PREFIX}.>"
ALL_ALLOCATIONS = f"{ALLOCATION_PREFIX}.>"
ALL_DECISIONS = f"{DECISION_PREFIX}.>"
ALL_REJECTED = f"{REJECTED_PREFIX}.>"
BINDER_WORK = (f"{ALLOCATION_PREFIX}.*.allocator", f"{ALLOCATION_PREFIX}.*.agent")
"""What the binders' consumer is delivered: the allocators' reservations and the node
agents' corrections. The binders' own events (half of a pod's) are not their work."""


def node_token(node: str) -> str:
    return node.replace(".", "~")


def inventory_subject(node: str) -> str:
    return f"{INVENTORY_PREFIX}.{node_token(node)}"


def agent_ready_subject(node: str) -> str:
    """Where ``node``'s agent answers whether the kubelet can admit our pods now."""
    return f"{AGENT_PREFIX}.{node_token(node)}.ready"


ALL_AGENTS_READY = f"{AGENT_PREFIX}.*.ready"
AGENT_READY = b"ready"
"""The agent's answer when the kubelet can admit our pods now."""
AGENT_WAITING = b"waiting"
"""The agent's answer while a resource is not registered with the kubelet (yet)."""


Writer = Literal["allocator", "binder", "agent"]
"""Who appends to the allocation log: the last token of its subjects."""
WRITERS: tuple[Writer, ...] = ("allocator", "binder", "agent")
NODE_AGENT_REPORTER_PREFIX = "node-agent/"
"""``DiscrepancyFound.reporter`` of a node agent's findings (the binder's read "reconciler")."""


def writer_of(event: AllocationEvent) -> Writer:
    """The role that appends ``event`` (the binder says so itself for its adoptions'
    ``ContainerAssigned``: see :class:`gpushare.bus.log.AllocationLog`)."""
    if isinstance(event, PodReserved):
        return "binder" if event.policy == ADOPTED_POLICY else "allocator"
    if isinstance(event, ContainerAssigned | AllocationCorrected | ForeignCardsHeld):
        return "agent"
    if isinstance(event, DiscrepancyFound):
        agent = event.reporter.startswith(NODE_AGENT_REPORTER_PREFIX)
        return "agent" if agent else "binder"
    return "binder"  # PodBound, BindFailed, PodReleased


def allocation_subject(node: str, writer: Writer = "allocator") -> str:
    """Where ``writer`` appends ``node``'s events (raw test publishes default to an
    allocator's subject)."""
    return f"{ALLOCATION_PREFIX}.{node_token(node)}.{writer}"


def node_allocations(node: str) -> str:
    """Every writer's subject of ``node`` (read filters and the compare-and-set scope)."""
    return f"{ALLOCATION_PREFIX}.{node_token(node)}.*"


def node_of_allocation(subject: str) -> str:
    """The node an allocation subject belongs to (its writer token dropped)."""
    tokens = subject.removeprefix(f"{ALLOCATION_PREFIX}.").split(".")
    return tokens[0].replace("~", ".")


def decision_subject(namespace: str, name: str) -> str:
    """One pod's decision records (a namespace is a DNS label: it has no dots)."""
    return f"{DECISION_PREFIX}.{namespace}.{node_token(name)}"


def rejected_subject(stream: str) -> str:
    return f"{REJECTED_PREFIX}.{stream}"
