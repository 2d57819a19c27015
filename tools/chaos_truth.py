"""The chaos run's verdict, from independent truth: which card each container really got.

Four sources say, each on its own, which card a running container is on and so how full
every card is:

* ``env``: what the container runtime started the container with: the card UUIDs in
  ``NVIDIA_VISIBLE_DEVICES`` (and ``ALIYUN_COM_GPU_MEM_IDX``, which must name the first);
* ``pod-resources``: the device IDs the kubelet's pod-resources API lists for it (every
  ID names its card: ``<8 hex of the card's UUID>-<n>``);
* ``log``: the live allocation of a fresh fold of the allocation log;
* ``annotations``: the pod's ``gpushare.io/allocation`` JSON, its per-container
  ``gpushare.io/gpu-index-container-<name>`` and its ``ALIYUN_COM_GPU_MEM_IDX``.

:func:`judge` finds, with the pod names:

* ``mismatch``: a running container on which the four do not agree (or one of them is
  silent, or contradicts itself);
* ``over capacity``: a card holding more MiB than it has by any one source (the pod's
  requested MiB on the cards that source names; pod-resources counts memory IDs);
* ``admission failed``: a pod bound through gpushare that failed the kubelet's admission
  (``UnexpectedAdmissionError``, ``OutOf<resource>``); ``unfittable`` when not one card
  of its node could ever hold it (the extender should not have bound it);
* ``released while running``: a running pod of which the log holds no allocation;
* ``not started``: a pod bound to a node that the kubelet neither started nor refused
  (the chaos run waits for these; one left at the end never started);
* ``stray container``: the runtime or the kubelet holds cards for a pod the API no longer
  runs there;
* and the log's own invariants (:mod:`gpushare.core.invariants`): ``unallocated``
  (bound, not yet running), ``orphaned``, ``duplicated``, compute ``oversubscribed``,
  ``unknown card``.

Pure: facts in (:mod:`tools.chaos_facts`), :class:`Violation` values out. Reading the
facts is :mod:`tools.chaos_sources`; each source's reading of a container is
:mod:`tools.chaos_readings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpushare.core.annotations import read_allocation
from gpushare.core.invariants import (
    Violation,
    orphaned_allocations,
    oversubscribed_compute,
    unallocated_pods,
    unknown_cards,
)
from gpushare.core.plugin_resources import SOCKETS
from gpushare.core.requests import MEMORY_UNITS_MIB, ContainerRequest
from gpushare.core.state import ClusterState, memory_by_card
from tools.chaos_facts import ApiPod, FaultWindow, HeldDevices, RuntimeContainer, SeenAt
from tools.chaos_readings import (
    NodeCards,
    Reading,
    annotation_readings,
    device_reading,
    env_reading,
    log_reading,
)

MISMATCH = "mismatch"
OVER_CAPACITY = "over capacity"
ADMISSION_FAILED = "admission failed"
UNFITTABLE = "unfittable"
RELEASED_WHILE_RUNNING = "released while running"
STRAY = "stray container"
NOT_STARTED = "not started"
KILLED_MID_CALL = "admission lost to a killed plugin"
"""A pod the kubelet refused because our device plugin died under it: the kubelet never
retries an admission, so no plugin can save a pod whose call was in flight when the
process was SIGKILLed. Reported, within a bound, not a violation
(:func:`admission_failures`)."""
PLUGIN_GONE = (
    "Unavailable",
    "Socket closed",
    "unregistered device",
    "no healthy devices",
    "endpoint has been stopped",
)
"""What the kubelet says when the plugin it calls is not there."""
RESTARTED_ACCOUNTING = (
    "requested number of devices unavailable",
    "Node didn't have enough resource",
    "the device IDs span cards",
)
"""What a kubelet that just restarted says when its own device accounting, rebuilt from
its checkpoint, still counts devices of pods it has not cleaned up yet: excused only in
a run that restarted a kubelet, within the same bound. The last is the plugin's own
refusal of the same shortfall: the kubelet offered only IDs it believes free, too few on
any one card for the container, so whatever we advise spans cards."""
PERMANENT = frozenset({ADMISSION_FAILED, UNFITTABLE, KILLED_MID_CALL})
"""Kinds no waiting heals (a pod that failed admission stays failed)."""

ENV, POD_RESOURCES, LOG, ANNOTATIONS = "env", "pod-resources", "log", "annotations"
SOURCES = (ENV, POD_RESOURCES, LOG, ANNOTATIONS)
OBSERVED = frozenset({ENV, POD_RESOURCES})
"""The sources read from the nodes (the log and the API are always there)."""

GPU_RESOURCES = frozenset(SOCKETS)
"""Every resource the node agent may serve."""

PodKey = tuple[str, str]
"""``(node, "namespace/name")``."""

Readings = dict[PodKey, dict[str, Reading]]
"""Per pod, per container."""


@dataclass(frozen=True)
class Truth:
    """Everything the judge reads, taken at one moment."""

    state: ClusterState
    """A fresh fold of the whole log and every node's last inventory."""
    pods: Sequence[ApiPod]
    runtime: Sequence[RuntimeContainer] = ()
    held: Sequence[HeldDevices] = ()
    failed_admissions: Sequence[ApiPod] = ()
    """Pods seen failing admission during the run (deleted since, some of them)."""
    memory_unit: str = "MiB"
    observed: frozenset[str] = OBSERVED
    """Which of ``env`` and ``pod-resources`` were read (a source not read is not judged)."""
    plugin_faults: Sequence[FaultWindow] = ()
    """When the run SIGKILLed a node agent or restarted a kubelet, until it had started
    it again: the kubelet refuses the pods it admits meanwhile (``PLUGIN_GONE``)."""
    kubelet_restarts: int = 0
    """How many of those were kubelet restarts."""
    seen: SeenAt = field(default_factory=SeenAt)
    """When the run saw each pod bound and refused."""


def _api_index(pods: Iterable[ApiPod]) -> dict[PodKey, ApiPod]:
    """Pods bound to a node and not finished, by (node, key)."""
    return {
        (pod.node, pod.key): pod
        for pod in pods
        if pod.node is not None and pod.facts.alive and not pod.deleting
    }


@dataclass(frozen=True)
class Sources:
    """Every source's readings of one moment, and the node cards they were read against."""

    cards: Mapping[str, NodeCards]
    readings: Mapping[str, Readings]
    """Source → pod → container → reading."""


class _Context:
    """What every source's reading needs: the node cards and each live pod's asks."""

    def __init__(self, truth: Truth) -> None:
        self.cards = {name: NodeCards.of(node.cards) for name, node in truth.state.nodes.items()}
        self.alive = _api_index(truth.pods)
        self.unit_mib = MEMORY_UNITS_MIB[truth.memory_unit]
        self._none = NodeCards.of(())

    def cards_of(self, node: str) -> NodeCards:
        return self.cards.get(node, self._none)

    def ask(self, key: PodKey, container: str) -> ContainerRequest | None:
        pod = self.alive.get(key)
        return pod.asks.get(container) if pod is not None else None


def _env_readings(truth: Truth, context: _Context) -> Readings:
    readings: Readings = {}
    for c in truth.runtime:
        key = (c.node, f"{c.namespace}/{c.pod}")
        ask = context.ask(key, c.container)
        readings.setdefault(key, {})[c.container] = env_reading(
            c.env, ask, context.cards_of(c.node)
        )
    return readings


def _kubelet_readings(truth: Truth, context: _Context) -> Readings:
    ids: dict[PodKey, dict[str, dict[str, list[str]]]] = {}
    for held in truth.held:
        if held.resource in GPU_RESOURCES:
            key = (held.node, f"{held.namespace}/{held.pod}")
            per_resource = ids.setdefault(key, {}).setdefault(held.container, {})
            per_resource.setdefault(held.resource, []).extend(held.device_ids)
    return {
        key: {
            name: device_reading(
                devices, context.ask(key, name), context.cards_of(key[0]), context.unit_mib
            )
            for name, devices in containers.items()
        }
        for key, containers in ids.items()
    }


def _log_readings(truth: Truth) -> Readings:
    return {
        (node.name, allocation.pod.key): {
            share.container: log_reading(allocation, share.container) for share in allocation.shares
        }
        for node in truth.state.nodes.values()
        for allocation in node.pods.values()
    }


def _annotation_readings(context: _Context) -> Readings:
    readings: Readings = {}
    for key, pod in context.alive.items():
        found = annotation_readings(pod, context.cards_of(key[0]))
        if found is not None:
            readings[key] = found
    return readings


def read_sources(truth: Truth) -> Sources:
    """What each source says every container holds."""
    context = _Context(truth)
    return Sources(
        context.cards,
        {
            ENV: _env_readings(truth, context),
            POD_RESOURCES: _kubelet_readings(truth, context),
            LOG: _log_readings(truth),
            ANNOTATIONS: _annotation_readings(context),
        },
    )


def judge(truth: Truth) -> list[Violation]:
    """Every violation the truth shows, grouped by kind."""
    sources = read_sources(truth)
    facts = [pod.facts for pod in truth.pods]
    return [
        *admission_failures(truth, sources),
        *released_while_running(truth),
        *not_started(truth),
        *mismatches(truth, sources),
        *over_capacity(truth, sources),
        *stray_containers(truth, sources),
        *unallocated_pods(truth.state, [pod.facts for pod in truth.pods if not pod.running]),
        *orphaned_allocations(truth.state, facts),
        *oversubscribed_compute(truth.state),
        *unknown_cards(truth.state),
    ]


def _could_fit(pod: ApiPod, cards: NodeCards | None) -> bool:
    """Some cards of the node are big enough for every container (nothing else on them)."""
    if cards is None:
        return True  # no inventory to judge by: the extender had one when it bound
    for ask in pod.asks.values():
        big = [c for c in cards.by_uuid.values() if ask.memory_on(c.memory_mib) <= c.memory_mib]
        if len(big) < ask.cards:
            return False
    return True


def admission_failures(truth: Truth, sources: Sources) -> list[Violation]:
    """Bound GPU pods the kubelet refused: in the API now, or seen refused during the run.

    A refusal that says the plugin was not there is attributed to the fault
    (``KILLED_MID_CALL``) when a fault that took plugins away overlapped the pod's wait
    for admission, from seen bound to seen refused (``_during_a_fault``); so is one by the
    device accounting of a kubelet, in a run that restarted kubelets. Every other refusal
    is a violation.

    Counting instead (one pod per node per fault, as if a kubelet held one admission at
    a time) failed a real-kubelet run: pods bound moments before the kill wait in the
    kubelet's queue, and each is refused "no healthy devices" until the new plugin's
    device list arrives."""
    listed = {pod.facts.uid: pod for pod in truth.pods if pod.failed_admission and pod.asks}
    seen = {pod.facts.uid: pod for pod in truth.failed_admissions if pod.asks}
    failed = {**seen, **listed}
    found: list[Violation] = []
    for uid, pod in sorted(failed.items(), key=lambda item: item[1].key):
        gone = "" if uid in listed else " (seen during the run; deleted since)"
        fits = _could_fit(pod, sources.cards.get(pod.node or ""))
        detail = f"{pod.reason}: {pod.message}{gone}"
        where = f"pod {pod.key} on {pod.node}"
        if not fits:
            detail = f"no card of the node can hold it, yet it was bound; {detail}"
            found.append(Violation(UNFITTABLE, where, detail))
        elif _during_a_fault(truth, uid) and any(sign in pod.message for sign in _excused(truth)):
            found.append(Violation(KILLED_MID_CALL, where, detail))
        else:
            found.append(Violation(ADMISSION_FAILED, where, detail))
    return found


FAULT_GRACE_S = 10.0
"""How long after a fault's end a plugin may still be away: the node agent started again
registers and sends its device list within seconds (more on a loaded machine)."""


def _during_a_fault(truth: Truth, uid: str) -> bool:
    """Whether some fault overlapped the pod's wait for admission: it began before the
    pod was seen refused and ended (give or take ``FAULT_GRACE_S``) after it was seen
    bound. A pod seen neither way is not excused."""
    bound, refused = truth.seen.bound.get(uid), truth.seen.refused.get(uid)
    if bound is None or refused is None:
        return False
    return any(
        fault.start <= refused and bound <= fault.end + FAULT_GRACE_S
        for fault in truth.plugin_faults
    )


def _excused(truth: Truth) -> tuple[str, ...]:
    return PLUGIN_GONE + (RESTARTED_ACCOUNTING if truth.kubelet_restarts else ())


def released_while_running(truth: Truth) -> list[Violation]:
    """Running GPU pods of which the log holds nothing on their node."""
    return [
        Violation(
            RELEASED_WHILE_RUNNING,
            f"pod {pod.key} on {pod.node}",
            "Running, but the log holds no live allocation for it here",
        )
        for pod in truth.pods
        if pod.running and pod.asks and pod.node is not None and not _held(truth, pod)
    ]


def not_started(truth: Truth) -> list[Violation]:
    """Bound GPU pods the kubelet has not started (nor refused): judged only once it has,
    so the run waits for them, and names them if they never start."""
    return [
        Violation(
            NOT_STARTED,
            f"pod {pod.key} on {pod.node}",
            f"bound, but still Pending ({pod.waiting})"
            if pod.waiting
            else "bound, but still Pending",
        )
        for pod in sorted(truth.pods, key=lambda p: p.key)
        if pod.asks and pod.node is not None and pod.facts.phase == "Pending" and not pod.deleting
    ]


def _held(truth: Truth, pod: ApiPod) -> bool:
    return pod.facts.uid in truth.state.node(pod.node or "").pods


def _describe(reading: Reading | None, cards: NodeCards) -> str:
    if reading is None:
        return "nothing"
    names = sorted((cards.name(uuid) for uuid in reading.cards), key=lambda n: (len(n), n))
    described = f"card {'+'.join(names)}" if names else "no card"
    return f"{described} [{reading.note}]" if reading.note else described


def mismatches(truth: Truth, sources: Sources) -> list[Violation]:
    """Running containers on which the sources disagree, are silent or contradict themselves."""
    found: list[Violation] = []
    for pod in sorted(truth.pods, key=lambda p: p.key):
        if not pod.running or not pod.asks or pod.node is None:
            continue
        key: PodKey = (pod.node, pod.key)
        judged = [s for s in SOURCES if s in truth.observed or s in (LOG, ANNOTATIONS)]
        if not _held(truth, pod):
            judged.remove(LOG)  # reported as released while running
        cards = sources.cards.get(pod.node, NodeCards.of(()))
        for container in sorted(name for name, ask in pod.asks.items() if not ask.init):
            said = {s: sources.readings[s].get(key, {}).get(container) for s in judged}
            if _agree(list(said.values())):
                continue
            detail = ", ".join(f"{s} {_describe(r, cards)}" for s, r in said.items())
            where = f"pod {pod.key} container {container} on {pod.node}"
            found.append(Violation(MISMATCH, where, detail))
    return found


def _agree(said: Sequence[Reading | None]) -> bool:
    """Every source spoke, none contradicts itself, and all name the same cards."""
    if any(reading is None or reading.note for reading in said):
        return False
    return len({reading.cards for reading in said if reading is not None}) == 1


def over_capacity(truth: Truth, sources: Sources) -> list[Violation]:
    """Cards holding more MiB than they have, by any one source."""
    found: list[Violation] = []
    for source in SOURCES:
        if source not in truth.observed and source not in (LOG, ANNOTATIONS):
            continue
        used: dict[tuple[str, str], dict[str, int]] = {}
        for (node, pod), containers in sources.readings[source].items():
            for uuid, mib in _pod_mib(source, truth, node, pod, containers).items():
                used.setdefault((node, uuid), {})[pod] = mib
        for (node, uuid), holders in sorted(used.items()):
            cards = sources.cards.get(node, NodeCards.of(()))
            total, held = cards.memory(uuid), sum(holders.values())
            if total and held > total:
                names = ", ".join(f"{pod}({mib})" for pod, mib in sorted(holders.items()))
                detail = f"by {source}: {held} MiB of {total} MiB: {names}"
                where = f"{node} card {cards.name(uuid)} ({uuid})"
                found.append(Violation(OVER_CAPACITY, where, detail))
    return found


def _pod_mib(
    source: str, truth: Truth, node: str, pod: str, containers: Mapping[str, Reading]
) -> dict[str, int]:
    """What one pod holds per card by ``source``. The log and the annotations know every
    container, init containers and sidecars included: a card holds the pod's peak
    (:func:`~gpushare.core.state.memory_by_card`). The runtime and pod-resources show only
    the containers running now (never a finished init container), which add up."""
    if source == LOG:
        allocation = next(
            (a for a in truth.state.node(node).pods.values() if a.pod.key == pod), None
        )
        return dict(log_reading(allocation).mib) if allocation is not None else {}
    if source == ANNOTATIONS:
        annotated = next((p for p in truth.pods if p.key == pod and p.node == node), None)
        held = read_allocation(dict(annotated.facts.annotations)) if annotated else None
        if held is not None:
            return memory_by_card([s for shares in held.containers.values() for s in shares])
    total: dict[str, int] = {}
    for reading in containers.values():
        for uuid, mib in reading.mib.items():
            total[uuid] = total.get(uuid, 0) + mib
    return total


def stray_containers(truth: Truth, sources: Sources) -> list[Violation]:
    """Cards the runtime or the kubelet holds for pods the API does not run on that node."""
    alive = _api_index(truth.pods)
    strays: dict[PodKey, list[str]] = {}
    for source in (ENV, POD_RESOURCES):
        if source not in truth.observed:
            continue
        for key, containers in sources.readings[source].items():
            if key not in alive and any(r.cards for r in containers.values()):
                strays.setdefault(key, []).append(source)
    by_name = {pod.key: pod for pod in truth.pods}
    found: list[Violation] = []
    for (node, name), named in sorted(strays.items()):
        pod = by_name.get(name)
        if pod is None:
            state = "has no such pod"
        elif pod.deleting:
            state = f"is deleting it ({pod.facts.phase})"
        else:
            state = f"has it {pod.facts.phase} on {pod.node or 'no node'}"
        detail = f"{' and '.join(named)} hold cards for it, but the API {state}"
        found.append(Violation(STRAY, f"pod {name} on {node}", detail))
    return found


def count_kinds(violations: Iterable[Violation]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for violation in violations:
        counts[violation.check] = counts.get(violation.check, 0) + 1
    return dict(sorted(counts.items()))
