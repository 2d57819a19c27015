"""What a pod asks of the GPUs, in every dialect, read from its containers' resources.

One container asks for ``cards`` cards and, on each of them, a compute share
(``core_percent``) and memory, either absolute (``memory_mib``) or as a share of the card
(``memory_ratio``, turned into MiB against the concrete card it lands on). Whole cards
(``exclusive``) take a card's every unit. The dialects:

============================================  ==========================================
``aliyun.com/gpu-mem: N``                      N memory units on one card (seeds 000/001);
                                               all such containers of a pod share a card
``gpushare.io/gpu-core: P``                    P % of one card's compute; above 100 only
                                               multiples of 100 (P/100 whole cards)
``gpushare.io/gpu-memory: Q``                  a quantity of memory (``4Gi``) on one card
``gpushare.io/gpu-memory-ratio: P``            P % of one card's memory (multiples of 100
                                               above 100: whole cards)
``gpushare.io/gpu: P``                         core and memory ratio together (seed 002)
``nvidia.com/gpu: N``                          N whole cards
``koordinator.sh/gpu-core`` (and ``-memory``,  aliases of ``gpushare.io/...``, as are the
``-memory-ratio``), ``kubernetes.io/gpu*``     ``kubernetes.io`` names of seed 002
``vke.volcengine.com/mgpu-core``,              seed 003's mGPU: core percent and memory in
``vke.volcengine.com/mgpu-memory``             MiB, split over the cards the
                                               ``vke.volcengine.com/container-multiple-gpu``
                                               annotation gives each container
============================================  ==========================================

Every rule of seed 003's admission applies to every dialect; :class:`InvalidRequest`
names the rule broken (see ``RULES``). So do the bounds of what a card can hold: no
more than :data:`MAX_CARD_MEMORY_MIB` of memory and 100 % of the core on one card, no
more than :data:`MAX_CARDS_PER_CONTAINER` cards for one container. A request beyond
them fits no node that exists, and keeping every amount that small keeps it far inside
the 64-bit integers of the log's events and of the kubelet.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import ceil

import msgspec

from gpushare.core.errors import InvalidRequest
from gpushare.core.peaks import peak_by_key
from gpushare.core.pods import Container, Pod
from gpushare.core.quantity import parse_quantity

GPU_MEM = "aliyun.com/gpu-mem"
GPU_COUNT = "aliyun.com/gpu-count"
NVIDIA_GPU = "nvidia.com/gpu"

GPUSHARE_CORE = "gpushare.io/gpu-core"
KOORDINATOR_CORE = "koordinator.sh/gpu-core"
KUBERNETES_CORE = "kubernetes.io/gpu-core"
MGPU_CORE = "vke.volcengine.com/mgpu-core"
GPU_CORE_NAMES = (GPUSHARE_CORE, KOORDINATOR_CORE, KUBERNETES_CORE, MGPU_CORE)
"""Compute as a percent of one card."""
GPUSHARE_MEMORY = "gpushare.io/gpu-memory"
KOORDINATOR_MEMORY = "koordinator.sh/gpu-memory"
KUBERNETES_MEMORY = "kubernetes.io/gpu-memory"
GPU_MEMORY_NAMES = (GPUSHARE_MEMORY, KOORDINATOR_MEMORY, KUBERNETES_MEMORY)
"""Memory as a quantity of bytes (``4Gi``)."""
MGPU_MEMORY = "vke.volcengine.com/mgpu-memory"
"""Memory as a count of MiB (``6k`` = 6000 MiB), mGPU's unit."""
GPUSHARE_RATIO = "gpushare.io/gpu-memory-ratio"
KOORDINATOR_RATIO = "koordinator.sh/gpu-memory-ratio"
KUBERNETES_RATIO = "kubernetes.io/gpu-memory-ratio"
GPU_MEMORY_RATIO_NAMES = (GPUSHARE_RATIO, KOORDINATOR_RATIO, KUBERNETES_RATIO)
"""Memory as a percent of one card."""
GPUSHARE_GPU = "gpushare.io/gpu"
KUBERNETES_GPU = "kubernetes.io/gpu"
GPU_SHORTHAND_NAMES = (GPUSHARE_GPU, KUBERNETES_GPU)
"""Core and memory ratio alike, as a percent of one card."""

NATIVE_RENAMES: dict[str, str] = {
    KUBERNETES_GPU: GPUSHARE_GPU,
    KUBERNETES_CORE: GPUSHARE_CORE,
    KUBERNETES_MEMORY: GPUSHARE_MEMORY,
    KUBERNETES_RATIO: GPUSHARE_RATIO,
}
"""Seed 002's name -> the name gpushare reads it under (same unit, same meaning): the
mutating webhook renames them at creation (:mod:`gpushare.core.native_names`)."""

MULTIPLE_GPU_ANNOTATION = "vke.volcengine.com/container-multiple-gpu"
POLICY_ANNOTATION = "gpushare.io/policy"
MODEL_ANNOTATION = "gpushare.io/gpu-model"
"""Card models the pod accepts, ``|``-separated (the trace's ``gpu_spec``)."""

SHARE_RESOURCES = frozenset(
    {GPU_MEM, NVIDIA_GPU, MGPU_MEMORY}.union(
        GPU_CORE_NAMES, GPU_MEMORY_NAMES, GPU_MEMORY_RATIO_NAMES, GPU_SHORTHAND_NAMES
    )
)
"""Every resource name gpushare reads (the extender's ``managedResources``)."""

MEMORY_UNITS_MIB = {"MiB": 1, "GiB": 1024}
MIN_SHARE_MEMORY_MIB = 256
"""Seed 003's MinGPUMemory: less is too little for a CUDA context."""
WHOLE = 100
"""Percent of one card."""
MAX_CARD_MEMORY_MIB = 1024 * 1024
"""1 TiB: more memory than any one card holds. The largest cards shipping hold 288 GB
(NVIDIA B300, AMD Instinct MI355X), so this leaves room for generations to come, while
``aliyun.com/gpu-mem: 99999999999999999999`` (MiB, or GiB with ``--memory-unit GiB``)
is refused at admission instead of failing every filter."""
MAX_CARDS_PER_CONTAINER = 64
"""Most cards one container may ask for: 8 is the usual most on a node, 16 the largest
(HGX-2, DGX-2); 64 leaves room and refuses ``nvidia.com/gpu: 1e18``."""
ALIYUN_GROUP = GPU_MEM
"""All ``aliyun.com/gpu-mem`` containers of a pod share one card (seeds 000/001)."""

RULES: dict[str, str] = {
    "quantity": "a GPU resource is not a valid Kubernetes quantity",
    "requests-equal-limits": "an extended resource's request must equal its limit",
    "non-positive": "a GPU core or memory request must be greater than 0",
    "memory-below-minimum": f"a GPU share needs at least {MIN_SHARE_MEMORY_MIB} MiB of memory",
    "core-not-whole-cards": "a core request above 100 must be a multiple of 100 (whole cards)",
    "ratio-not-whole-cards": "a memory ratio above 100 must be a multiple of 100 (whole cards)",
    "redundant-memory": "whole cards come with all their memory; do not also ask for memory",
    "core-ratio-mismatch": "core and memory ratio ask for different numbers of cards",
    "conflicting-memory": "memory is asked both as an amount and as a ratio",
    "duplicate-dimension": "the same GPU dimension is asked under two names",
    "shorthand-with-dimension": "the gpu shorthand already sets core and memory ratio",
    "whole-cards-with-share": "nvidia.com/gpu asks for whole cards; do not mix it with a share",
    "gpu-count-mismatch": "container-multiple-gpu must give one count per container",
    "invalid-gpu-count": "container-multiple-gpu counts must be whole numbers of at least 1",
    "not-divisible": "core and memory must divide evenly over the container's cards",
    "core-over-100-per-card": "a container cannot have more than 100 % of one card's core",
    "multiple-gpu-without-share": "container-multiple-gpu needs mgpu-core or mgpu-memory",
    "multiple-gpu-with-aliyun": (
        "container-multiple-gpu (mGPU) does not apply to aliyun.com/gpu-mem, whose "
        "containers share one card"
    ),
    "unknown-policy": "the placement policy annotation names no known policy",
    "memory-over-card-maximum": (
        f"a card holds at most {MAX_CARD_MEMORY_MIB} MiB (1 TiB) of memory: no card has more"
    ),
    "memory-without-device-resource": (
        "a memory amount (gpu-memory, a byte quantity) has no device plugin to hand the "
        "card out, so the kubelet would start the container without a GPU; ask it with a "
        "core or memory-ratio resource (gpushare.io/gpu-core) that gives the card"
    ),
    "init-container-ids-reused": (
        "an init container and a later container ask the same device resource: the "
        "kubelet hands the later one the init container's device IDs first"
    ),
    "kubernetes-io-names-need-the-mutating-webhook": (
        "seed 002's kubernetes.io/gpu* names run only once gpushare's mutating webhook has "
        "renamed them gpushare.io/gpu* (deploy/base/webhook/mutating-webhook.yaml); it did "
        "not rename this pod"
    ),
    "too-many-cards": (
        f"a container may ask for at most {MAX_CARDS_PER_CONTAINER} cards: no node has more"
    ),
}


class ContainerRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One container's ask, per card."""

    container: str
    memory_mib: int = 0
    """Memory on each card, absolute; 0 when given as a ratio or not at all."""
    core_percent: int = 0
    """Compute share of each card, in percent."""
    memory_ratio: int = 0
    """Memory on each card as a percent of that card's memory (when ``memory_mib`` is 0)."""
    cards: int = 1
    exclusive: bool = False
    """Whole cards: every unit of each card, and no other container on it."""
    init: bool = False
    """An init container that runs to completion before the next one starts."""
    sidecar: bool = False
    """A native sidecar (init container, ``restartPolicy: Always``): it runs from its
    place among the init containers until the pod ends, so it counts like an app
    container and also beside every init container after it. Never ``init``."""
    group: str = ""
    """Containers of one pod with the same non-empty group go on the same card."""

    def memory_on(self, card_memory_mib: int) -> int:
        """The MiB this container holds on a card of ``card_memory_mib``."""
        if self.exclusive:
            return card_memory_mib
        if self.memory_ratio:
            return card_memory_mib * self.memory_ratio // WHOLE
        return self.memory_mib

    def core_on(self) -> int:
        return WHOLE if self.exclusive else self.core_percent


class PodRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    containers: tuple[ContainerRequest, ...]
    models: tuple[str, ...] = ()
    """Card models the pod accepts; empty = any."""
    policy: str = ""
    """A per-pod placement policy (annotation); empty = the cluster's."""
    cpu_milli: int = 0
    """Host CPU the pod requests (only used where the node's free CPU is known)."""
    host_memory_mib: int = 0

    @property
    def memory_mib(self) -> int:
        """Absolute memory the pod holds at its peak, all cards together (seeds 000/001
        sizing): the app containers with the sidecars, or one init container with the
        sidecars started before it, whichever is more (:func:`~gpushare.core.peaks.peak_by_key`
        over the whole pod)."""
        held = ((None, c.init, c.memory_mib * c.cards) for c in self.containers)
        return peak_by_key(held).get(None, 0)

    @property
    def wants_gpu(self) -> bool:
        return bool(self.containers)

    @property
    def card_count(self) -> int:
        return sum(c.cards for c in self.containers if not c.init)

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything placement depends on, without container names: equal shapes place alike."""
        return (
            tuple(
                (
                    c.memory_mib,
                    c.core_percent,
                    c.memory_ratio,
                    c.cards,
                    c.exclusive,
                    c.init,
                    c.sidecar,
                    c.group,
                )
                for c in self.containers
            ),
            self.models,
            self.cpu_milli,
            self.host_memory_mib,
        )

    @property
    def memory_only(self) -> bool:
        """Seeds 000/001's shape: MiB on one shared card, nothing else asked."""
        return (
            all(
                c.group and c.cards == 1 and not c.exclusive and not c.core_percent
                for c in self.containers
            )
            and not self.models
        )

    def describe(self) -> str:
        """``2 × (50 % core, 4096 MiB)`` per container, for reasons people read."""
        return "; ".join(_describe(container) for container in self.containers)


def _describe(request: ContainerRequest) -> str:
    name = f"{request.container}{_role(request)}"
    if request.exclusive:
        what = "whole card" if request.cards == 1 else f"{request.cards} whole cards"
        return f"{name}: {what}"
    parts = []
    if request.core_percent:
        parts.append(f"{request.core_percent} % core")
    if request.memory_ratio:
        parts.append(f"{request.memory_ratio} % memory")
    elif request.memory_mib:
        parts.append(f"{request.memory_mib} MiB")
    each = ", ".join(parts) or "a share"
    cards = f"{request.cards} cards × " if request.cards > 1 else ""
    return f"{name}: {cards}{each}"


def _role(request: ContainerRequest) -> str:
    """`` (init)`` or `` (sidecar)`` after a container's name; nothing for an app container."""
    return " (init)" if request.init else " (sidecar)" if request.sidecar else ""


def _invalid(rule: str, container: str, detail: str) -> InvalidRequest:
    return InvalidRequest(rule, f"container {container!r}: {detail}")


def _amount(container: Container, resource: str) -> Fraction | None:
    """The container's value of ``resource`` (limit, else request); they must agree."""
    resources = container.resources
    if resources is None:
        return None
    limit = (resources.limits or {}).get(resource)
    request = (resources.requests or {}).get(resource)
    try:
        limit_value = None if limit is None else parse_quantity(limit)
        request_value = None if request is None else parse_quantity(request)
    except ValueError as error:
        raise _invalid("quantity", container.name, f"{resource} {error}") from None
    if limit_value is not None and request_value is not None and limit_value != request_value:
        raise _invalid(
            "requests-equal-limits",
            container.name,
            f"{resource} request {request_value} differs from limit {limit_value}; "
            "extended resources need them equal",
        )
    return limit_value if limit_value is not None else request_value


def _count(container: Container, resource: str) -> int | None:
    """A whole, non-negative count (aliyun.com/gpu-mem, nvidia.com/gpu)."""
    value = _amount(container, resource)
    if value is None:
        return None
    if value < 0 or value.denominator != 1:
        raise _invalid("quantity", container.name, f"{resource} must be a whole count, got {value}")
    return int(value)


def _one_of(container: Container, names: tuple[str, ...]) -> tuple[str, Fraction] | None:
    found = [(name, value) for name in names if (value := _amount(container, name)) is not None]
    if len(found) > 1:
        listed = ", ".join(name for name, _ in found)
        raise _invalid("duplicate-dimension", container.name, f"asks {listed} at once")
    return found[0] if found else None


def _positive_whole(container: str, name: str, value: Fraction) -> int:
    if value <= 0:
        raise _invalid("non-positive", container, f"{name} is {value}, must be greater than 0")
    if value.denominator != 1:
        raise _invalid("quantity", container, f"{name} must be a whole number, got {value}")
    return int(value)


class _Dimensions(msgspec.Struct, kw_only=True):
    """One container's GPU resources, named by dimension, before the rules are applied."""

    core: int | None = None
    memory_mib: int | None = None
    ratio: int | None = None
    memory_bytes: str = ""
    """The byte-quantity resource the memory came from (``gpushare.io/gpu-memory``), if
    any: no device plugin serves it (:data:`RULES` ``memory-without-device-resource``)."""


def _dimensions(container: Container) -> _Dimensions | None:
    """Core %, memory MiB and memory ratio % of a sharing container; None if it asks none."""
    name = container.name
    shorthand = _one_of(container, GPU_SHORTHAND_NAMES)
    core = _one_of(container, GPU_CORE_NAMES)
    ratio = _one_of(container, GPU_MEMORY_RATIO_NAMES)
    memory_bytes = _one_of(container, GPU_MEMORY_NAMES)
    mgpu_memory = _amount(container, MGPU_MEMORY)
    if memory_bytes is not None and mgpu_memory is not None:
        raise _invalid("duplicate-dimension", name, f"asks {memory_bytes[0]} and {MGPU_MEMORY}")
    dims = _Dimensions()
    if shorthand is not None:
        if core or ratio or memory_bytes or mgpu_memory is not None:
            raise _invalid(
                "shorthand-with-dimension", name, f"{shorthand[0]} with core or memory besides"
            )
        dims.core = dims.ratio = _positive_whole(name, shorthand[0], shorthand[1])
    if core is not None:
        dims.core = _positive_whole(name, core[0], core[1])
    if ratio is not None:
        dims.ratio = _positive_whole(name, ratio[0], ratio[1])
    if memory_bytes is not None:
        if memory_bytes[1] <= 0:
            raise _invalid("non-positive", name, f"{memory_bytes[0]} must be greater than 0")
        dims.memory_mib = ceil(memory_bytes[1] / 2**20)
        dims.memory_bytes = memory_bytes[0]
    if mgpu_memory is not None:
        dims.memory_mib = _positive_whole(name, MGPU_MEMORY, mgpu_memory)
    if dims.core is None and dims.ratio is None and dims.memory_mib is None:
        return None
    if dims.memory_mib is not None and dims.ratio is not None:
        raise _invalid("conflicting-memory", name, "asks memory both in MiB and as a ratio")
    return dims


def _whole_cards(name: str, dims: _Dimensions) -> int:
    """How many whole cards the dimensions ask for (0 = a share of one card)."""
    core_cards = ratio_cards = 0
    if dims.core is not None and dims.core >= WHOLE:
        if dims.core % WHOLE:
            raise _invalid(
                "core-not-whole-cards", name, f"core {dims.core} is above 100 but not a multiple"
            )
        core_cards = dims.core // WHOLE
    if dims.ratio is not None and dims.ratio > WHOLE:
        if dims.ratio % WHOLE:
            raise _invalid("ratio-not-whole-cards", name, f"memory ratio {dims.ratio} is above 100")
        ratio_cards = dims.ratio // WHOLE
    if core_cards and dims.memory_mib is not None:
        raise _invalid(
            "redundant-memory", name, f"core {dims.core} asks for whole cards and memory besides"
        )
    if ratio_cards and dims.core is not None and core_cards != ratio_cards:
        raise _invalid(
            "core-ratio-mismatch", name, f"core {dims.core} and memory ratio {dims.ratio} differ"
        )
    if core_cards and dims.ratio is not None and dims.ratio != dims.core:
        # core 200 with memory ratio 100 asks 2 cards and 1 card's memory: refused, not
        # read as 2 whole cards (seed 002 writes whole cards as equal core and ratio)
        raise _invalid(
            "core-ratio-mismatch",
            name,
            f"core {dims.core} asks for {core_cards} whole cards, memory ratio {dims.ratio} "
            f"for another amount; whole cards need the ratio equal to the core ({dims.core})",
        )
    return core_cards or ratio_cards


def _share_request(container: Container, dims: _Dimensions, init: bool) -> ContainerRequest:
    name = container.name
    cards = _whole_cards(name, dims)
    if cards:
        return ContainerRequest(container=name, cards=cards, exclusive=True, init=init)
    memory = dims.memory_mib
    if memory is not None and dims.core is not None and memory < MIN_SHARE_MEMORY_MIB:
        raise _invalid(
            "memory-below-minimum",
            name,
            f"{memory} MiB with a core share; at least {MIN_SHARE_MEMORY_MIB} MiB is needed",
        )
    return ContainerRequest(
        container=name,
        core_percent=dims.core or 0,
        memory_mib=memory or 0,
        memory_ratio=dims.ratio or 0,
        init=init,
    )


def _spread_request(container: Container, dims: _Dimensions, cards: int) -> ContainerRequest:
    """mGPU's multiple-GPU container: the totals split evenly over ``cards`` cards."""
    name = container.name
    core, memory = dims.core, dims.memory_mib
    if core is None and memory is None:
        raise _invalid("multiple-gpu-without-share", name, "needs mgpu-core or mgpu-memory")
    if (core is not None and core % cards) or (memory is not None and memory % cards):
        raise _invalid("not-divisible", name, f"core {core} and memory {memory} over {cards} cards")
    core_each = None if core is None else core // cards
    memory_each = None if memory is None else memory // cards
    if core_each is not None and core_each > WHOLE:
        raise _invalid("core-over-100-per-card", name, f"{core}/{cards} = {core_each} per card")
    if core_each == WHOLE:
        if memory is not None:
            raise _invalid("redundant-memory", name, f"{core}/{cards} is whole cards")
        return ContainerRequest(container=name, cards=cards, exclusive=True)
    if memory_each is not None and memory_each < MIN_SHARE_MEMORY_MIB:
        raise _invalid(
            "memory-below-minimum",
            name,
            f"{memory}/{cards} = {memory_each} MiB per card, under {MIN_SHARE_MEMORY_MIB} MiB",
        )
    return ContainerRequest(
        container=name, cards=cards, core_percent=core_each or 0, memory_mib=memory_each or 0
    )


def _multiple_gpu_counts(pod: Pod) -> tuple[int, ...] | None:
    raw = pod.annotations.get(MULTIPLE_GPU_ANNOTATION)
    if raw is None:
        return None
    containers = pod.spec.containers
    parts = [part.strip() for part in raw.split(",")]
    if len(parts) != len(containers):
        raise InvalidRequest(
            "gpu-count-mismatch",
            f"{MULTIPLE_GPU_ANNOTATION} {_short(raw)!r} gives {len(parts)} counts "
            f"for {len(containers)} containers",
        )
    counts = []
    for part in parts:
        digits = part.lstrip("0")  # int() of 4300 digits and more raises: count them first
        if not (part.isascii() and part.isdigit()) or not digits:
            raise InvalidRequest(
                "invalid-gpu-count",
                f"{MULTIPLE_GPU_ANNOTATION} {_short(raw)!r}: {_short(part)!r} is not ≥ 1",
            )
        if len(digits) > len(str(MAX_CARDS_PER_CONTAINER)) or (
            int(digits) > MAX_CARDS_PER_CONTAINER
        ):
            raise InvalidRequest(
                "too-many-cards",
                f"{MULTIPLE_GPU_ANNOTATION} gives a container {_short(part)} cards, "
                f"more than {MAX_CARDS_PER_CONTAINER}",
            )
        counts.append(int(digits))
    return tuple(counts)


def _short(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:23]}…"


def _container_request(
    container: Container, memory_unit: str, init: bool, cards: int | None
) -> ContainerRequest | None:
    name = container.name
    units = _count(container, GPU_MEM)
    whole = _count(container, NVIDIA_GPU)
    dims = _dimensions(container)
    if whole:
        if units or dims is not None:
            raise _invalid("whole-cards-with-share", name, f"{NVIDIA_GPU} with a share besides")
        return ContainerRequest(container=name, cards=whole, exclusive=True, init=init)
    if units:
        if dims is not None and (dims.memory_mib is not None or dims.ratio is not None):
            raise _invalid("conflicting-memory", name, f"{GPU_MEM} with another memory request")
        return ContainerRequest(
            container=name,
            memory_mib=units * MEMORY_UNITS_MIB[memory_unit],
            core_percent=(dims.core or 0) if dims else 0,
            init=init,
            group=ALIYUN_GROUP,
        )
    native = [name for name in NATIVE_RENAMES if _amount(container, name) is not None]
    if native:
        renamed = ", ".join(NATIVE_RENAMES[name] for name in native)
        raise _invalid(
            "kubernetes-io-names-need-the-mutating-webhook",
            name,
            f"asks {', '.join(native)}; nothing serves kubernetes.io names, so the pod would "
            f"wait Pending or run without a GPU: ask {renamed} instead, or install the "
            "mutating webhook",
        )
    if dims is not None and dims.memory_bytes and dims.core is None and dims.ratio is None:
        raise _invalid(
            "memory-without-device-resource",
            name,
            f"{dims.memory_bytes} alone: no device plugin hands out its card, so the "
            "container would run without a GPU; add a core share (gpushare.io/gpu-core)",
        )
    if dims is None:
        if cards is not None and cards > 1 and not init:
            raise _invalid(
                "multiple-gpu-without-share", name, f"{cards} cards but no mgpu-core or mgpu-memory"
            )
        return None
    if cards is not None and cards > 1 and not init:
        return _spread_request(container, dims, cards)
    return _share_request(container, dims, init)


def _bounded(request: ContainerRequest) -> ContainerRequest:
    """``request``, if a card and a node can hold it: no more than 1 TiB and 100 % of the
    core on each card, no more than 64 cards."""
    name = request.container
    if request.cards > MAX_CARDS_PER_CONTAINER:
        raise _invalid(
            "too-many-cards",
            name,
            f"{_number(request.cards)} cards, more than {MAX_CARDS_PER_CONTAINER}",
        )
    if request.memory_mib > MAX_CARD_MEMORY_MIB:
        raise _invalid(
            "memory-over-card-maximum",
            name,
            f"{_number(request.memory_mib)} MiB on one card; no card holds more than "
            f"{MAX_CARD_MEMORY_MIB} MiB (1 TiB)",
        )
    if request.core_percent > WHOLE:
        raise _invalid(
            "core-over-100-per-card",
            name,
            f"{_number(request.core_percent)} % of one card's core; above 100 ask for whole "
            "cards (gpushare.io/gpu-core without memory)",
        )
    return request


def _number(value: int) -> str:
    """A whole number for a message, cut short when it is absurdly long."""
    return _short(str(value))


def _check_shared_card(requests: Sequence[ContainerRequest]) -> None:
    """The containers of a pod that share one card (``aliyun.com/gpu-mem``) must fit it
    together: the app containers at once, each init container alone."""
    shared: dict[str, int] = {}
    for request in requests:
        if request.group and not request.init:
            shared[request.group] = shared.get(request.group, 0) + request.memory_mib
    for group, memory in shared.items():
        if memory > MAX_CARD_MEMORY_MIB:
            names = ", ".join(
                repr(r.container) for r in requests if r.group == group and not r.init
            )
            raise InvalidRequest(
                "memory-over-card-maximum",
                f"containers {_short(names)} share one card ({group}) and ask "
                f"{_number(memory)} MiB together; no card holds more than "
                f"{MAX_CARD_MEMORY_MIB} MiB (1 TiB)",
            )


def _models(pod: Pod) -> tuple[str, ...]:
    raw = pod.annotations.get(MODEL_ANNOTATION, "")
    return tuple(dict.fromkeys(part.strip() for part in raw.split("|") if part.strip()))


def read_gpu_request(
    pod: Pod, memory_unit: str = "MiB", policies: frozenset[str] | None = None
) -> PodRequest:
    """What ``pod`` asks of the GPUs. Raises :class:`InvalidRequest` naming the rule broken.

    ``policies``, when given, are the names a ``gpushare.io/policy`` annotation may use.
    """
    counts = _multiple_gpu_counts(pod)
    requests: list[ContainerRequest] = []
    for container in pod.spec.init_containers or ():
        sidecar = container.sidecar
        wanted = _container_request(container, memory_unit, not sidecar, None)
        if wanted is not None:
            if sidecar:
                wanted = msgspec.structs.replace(wanted, sidecar=True)
            requests.append(_bounded(wanted))
    for position, container in enumerate(pod.spec.containers):
        cards = counts[position] if counts is not None else None
        wanted = _container_request(container, memory_unit, False, cards)
        if wanted is not None:
            requests.append(_bounded(wanted))
    _check_shared_card(requests)
    _check_no_reused_ids(pod)
    if counts is not None:
        _check_no_aliyun(requests)
    policy = pod.annotations.get(POLICY_ANNOTATION, "").strip()
    if policy and policies is not None and policy not in policies:
        known = ", ".join(sorted(policies))
        raise InvalidRequest("unknown-policy", f"{POLICY_ANNOTATION} {policy!r} (known: {known})")
    return PodRequest(containers=tuple(requests), models=_models(pod), policy=policy)


DEVICE_RESOURCES = frozenset(
    name
    for name in SHARE_RESOURCES
    if name not in GPU_MEMORY_NAMES and not name.startswith("kubernetes.io/")
)
"""The names a device plugin hands IDs out for (not byte quantities, not kubernetes.io)."""


def _device_resources(container: Container) -> frozenset[str]:
    resources = container.resources
    if resources is None:
        return frozenset()
    asked = {*(resources.limits or {}), *(resources.requests or {})}
    return frozenset(asked & DEVICE_RESOURCES)


def _check_no_reused_ids(pod: Pod) -> None:
    """The kubelet hands a run-to-completion init container's device IDs to the next
    containers asking the same resource before any other (``devicemanager``'s
    ``devicesToReuse``), so those run on the init container's cards whatever the log
    planned. Placement does not plan for that yet: such a pod is refused, except
    ``aliyun.com/gpu-mem`` alone, whose containers share one card anyway."""
    in_order: list[Container] = [*(pod.spec.init_containers or ()), *pod.spec.containers]
    for position, init in enumerate(pod.spec.init_containers or ()):
        if init.sidecar:
            continue
        mine = _device_resources(init)
        for other in in_order[position + 1 :]:
            shared = (mine & _device_resources(other)) - {GPU_MEM}
            if shared:
                names = ", ".join(sorted(shared))
                raise InvalidRequest(
                    "init-container-ids-reused",
                    f"init container {init.name!r} and container {other.name!r} both ask "
                    f"{names}: the kubelet gives {other.name!r} the init container's device "
                    "IDs first, so it would run on the init container's cards; ask it in "
                    "one of them only (or aliyun.com/gpu-mem in both: they share one card)",
                )


def _check_no_aliyun(requests: Sequence[ContainerRequest]) -> None:
    """mGPU's per-container card counts do not mix with ``aliyun.com/gpu-mem``, whose
    containers share one card: refused rather than the annotation silently ignored."""
    aliyun = [r.container for r in requests if r.group == ALIYUN_GROUP]
    if aliyun:
        names = ", ".join(repr(name) for name in aliyun)
        raise InvalidRequest(
            "multiple-gpu-with-aliyun",
            f"{MULTIPLE_GPU_ANNOTATION} is mGPU's (mgpu-core / mgpu-memory); containers "
            f"{_short(names)} ask {GPU_MEM}, whose containers share one card",
        )


def validate_pod(
    pod: Pod, memory_unit: str = "MiB", policies: frozenset[str] | None = None
) -> PodRequest | InvalidRequest:
    """The one judgement of a pod's GPU resources and annotations that the admission
    webhook, filter and bind all make: what it asks, or the rule it breaks.

    ``policies`` are the names a ``gpushare.io/policy`` annotation may use; ``None`` means
    every policy gpushare knows (:func:`gpushare.core.policies.policy_names`), so no verb
    can forget to check it.
    """
    if policies is None:
        from gpushare.core.policies import policy_names

        policies = policy_names()
    try:
        return read_gpu_request(pod, memory_unit, policies)
    except InvalidRequest as error:
        return error


def violation_message(error: InvalidRequest) -> str:
    """How every verb words a broken rule: webhook denial, filter reason, bind error."""
    return f'gpushare: rule "{error.rule}": {error.detail}'


def to_units(memory_mib: int, memory_unit: str) -> int:
    """MiB back to the cluster's unit (whole units, rounded down as the device plugin counts)."""
    return memory_mib // MEMORY_UNITS_MIB[memory_unit]
