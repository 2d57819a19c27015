"""filter and prioritize: request body in, response body out, no HTTP types.

Bodies are decoded with msgspec straight from bytes (no per-request Pydantic): at
thousands of node names per call, decoding and encoding are most of the cost.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from functools import partial
from typing import Any

import msgspec
from opentelemetry.trace import Span

from gpushare.allocator.assumed import AssumedPlacements
from gpushare.allocator.filtering import (
    NO_PLAN,
    NodeVerdicts,
    RejectionMemo,
    ScoreMemo,
    best_at,
    filter_nodes,
    kube_scores,
    node_values,
    only_the_holder,
    ranked_first,
    reject_all,
    score_nodes,
)
from gpushare.allocator.fit_index import FitIndex
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.placing import Placer
from gpushare.allocator.pod_cache import PodCache, remembered
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.wire import (
    ExtenderArgs,
    ExtenderFilterResult,
    HostPriority,
    NodeList,
    WireError,
    decode,
    encode,
    node_name,
)
from gpushare.bus.decisions import Recorder, nodes_filtered, nodes_scored
from gpushare.bus.follow import LogFollower
from gpushare.core.constraints import stated_preferences
from gpushare.core.dra_claims import ClaimSpecs, claim_request
from gpushare.core.events import AnyDecision, NodesFiltered
from gpushare.core.fit import FitVerdict
from gpushare.core.model import PodRef
from gpushare.core.placement import Plan, can_place, plan_pod, with_placed
from gpushare.core.pods import Pod
from gpushare.core.policies import Policy
from gpushare.core.policies.base import Assignment
from gpushare.core.policies.first_fit import FirstFitCards
from gpushare.core.ports import Clock
from gpushare.core.requests import PodRequest, validate_pod, violation_message
from gpushare.core.view import NodeView
from gpushare.telemetry.extender import record_scores, record_verdicts, verb_span
from gpushare.telemetry.pods import fail

log = logging.getLogger(__name__)

NOT_READY = "gpushare allocator is still replaying the allocation log; try again"
RANKED_IN_RECORD = 32
"""The nodes filter's choice records the scores of: the winner and the runners-up that
show why it won (prioritize records up to ``MAX_NODES``; kube-scheduler acts on its)."""
BINDING_IN_FLIGHT = "binding_in_flight"
"""The metrics' kind of a node that fits on the fold but not once the pods kube-scheduler
is binding there are counted."""
FEW_BUSY = 8
"""Up to this many nodes with pods being bound, each is looked for in the passed list
(a scan in C); past it, the passed list is walked once against them."""


class Candidates(msgspec.Struct, frozen=True):
    """The nodes kube-scheduler asks about, by name, and their raw items in Nodes mode."""

    names: list[str]
    items: list[msgspec.Raw] | None = None


def read_args(body: bytes) -> tuple[Pod, Candidates, ExtenderArgs]:
    """Decode ExtenderArgs; raises :class:`WireError` when it is not one."""
    args = decode(body, ExtenderArgs)
    if args.pod is None:
        raise WireError("ExtenderArgs has no Pod")
    if args.node_names is not None:
        return args.pod, Candidates(args.node_names), args
    items = args.nodes.items if args.nodes is not None else []
    return args.pod, Candidates([node_name(item) for item in items], items), args


def _passed_nodes(args: ExtenderArgs, candidates: Candidates, passed: list[str]) -> NodeList | None:
    if args.nodes is None or candidates.items is None:
        return None
    keep = set(passed)
    items = [
        item for name, item in zip(candidates.names, candidates.items, strict=True) if name in keep
    ]
    return NodeList(metadata=args.nodes.metadata, items=items)


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    """The node filter answers alone for a GPU pod (``choose_in_filter``), and why."""

    node: str
    score: int
    """Its 0..10, as prioritize would have answered."""
    policy: str
    ranked: list[str]
    """The nodes that passed valued highest (the record's, at most ``RANKED_IN_RECORD``)..."""
    scores: list[int]
    """... and their 0..10."""
    unranked: int
    """The nodes that passed beyond those."""
    planned: Assignment | None = None
    """The cards the pod is planned on there (``None``: no plan was found)."""


def filter_result(
    args: ExtenderArgs, candidates: Candidates, verdicts: NodeVerdicts, choice: Choice | None
) -> ExtenderFilterResult:
    """Answer in the mode the request came in: NodeNames (nodeCacheCapable) or Nodes.
    With a choice only the chosen node passes; the others that fit are left out of the
    answer, not failed: they are not why the pod would be unschedulable."""
    names_mode = args.node_names is not None or args.nodes is None
    passed = verdicts.passed if choice is None else [choice.node]
    return ExtenderFilterResult(
        nodes=_passed_nodes(args, candidates, passed),
        node_names=passed if names_mode else None,
        failed_nodes=_printable(verdicts.failed),
        failed_and_unresolvable_nodes=_printable(verdicts.unresolvable),
    )


def _printable(reasons: dict[str, str]) -> dict[str, str]:
    """The reasons with every ``%`` spelled ``percent``: kube-scheduler v1.36 passes its
    FailedScheduling message to ``Eventf`` as the format string (``schedule_one.go``,
    ``handleSchedulingFailure``), so ``10 % core`` reached ``kubectl describe`` as
    ``10 %!c(MISSING)ore``."""
    return {
        node: reason.replace(" % ", " percent ").replace("%", " percent")
        for node, reason in reasons.items()
    }


class ExtenderVerbs:
    def __init__(
        self,
        follower: LogFollower,
        settings: AllocatorSettings,
        *,
        pods: PodCache,
        metrics: AllocatorMetrics,
        clock: Clock,
        placer: Placer | None = None,
        decisions: Recorder | None = None,
        claim_specs: ClaimSpecs | None = None,
        assumed: AssumedPlacements | None = None,
    ) -> None:
        self._placer = placer or Placer(settings)
        self._claim_specs = claim_specs
        self._first_fit: FirstFitCards | None = None
        self._decisions = decisions
        self._follower = follower
        self._settings = settings
        self._pods = pods
        self._metrics = metrics
        self._clock = clock
        self._memo = RejectionMemo()
        self._scores = ScoreMemo()
        follower.listen(self._scores.changes.listener())
        self._index = FitIndex()
        follower.listen(self._index.changed)
        self._assumed = assumed if assumed is not None else AssumedPlacements()
        follower.listen(self._assumed.on_event)

    def filter(self, body: bytes) -> bytes:
        pod, candidates, args = read_args(body)
        with _span("filter", pod, candidates) as span:
            if not self._follower.ready.is_set():
                fail(span, NOT_READY)
                return encode(ExtenderFilterResult(error=NOT_READY))
            request = self._request(pod)
            verdicts = self._verdicts(pod, request, candidates.names)
            views = self._with_binding_in_flight(pod, request, verdicts)
            record_verdicts(span, len(verdicts.passed), verdicts.failed, verdicts.unresolvable)
            self._metrics.count_filter_failures(verdicts.kinds)
            choice = self._choice(pod, request, verdicts.passed, views)
            if choice is not None and isinstance(request, PodRequest):
                self._assumed.assume(
                    pod.metadata.uid,
                    choice.node,
                    request,
                    self._clock.monotonic(),
                    choice.planned,
                )
            answer = encode(filter_result(args, candidates, verdicts, choice))
            self._record_filter(pod, request, verdicts, choice)
            if choice is not None:
                record_scores(span, [choice.node], [choice.score])
                self._record_scores(
                    pod,
                    choice.policy,
                    choice.ranked,
                    choice.scores,
                    verb="filter",
                    unranked=choice.unranked,
                )
            return answer

    def _with_binding_in_flight(
        self, pod: Pod, request: PodRequest | str, verdicts: NodeVerdicts
    ) -> dict[str, NodeView]:
        """The nodes that passed on the fold, judged again with the pods filter placed
        there and bind has not reserved yet (``allocator.assumed``): those where the pod
        no longer fits are failed, and the views of the others with those pods placed
        are returned, by node, for the choice."""
        busy = self._assumed.nodes()
        if not (busy and isinstance(request, PodRequest) and request.wants_gpu):
            return {}
        passed = verdicts.passed
        if len(busy) <= FEW_BUSY:  # a scan of the list per busy node, in C
            flagged = [name for name in busy if name in passed]
        else:
            flagged = [name for name in passed if name in busy]
        now = self._clock.monotonic()
        nodes = self._follower.state.nodes
        max_per_card = self._placer.max_per_card
        views: dict[str, NodeView] = {}
        failed: set[str] = set()
        for name in flagged:
            others = self._assumed.on(name, now, besides=pod.metadata.uid)
            if not others:
                continue
            view = with_placed(
                nodes[name].view,
                [other.request for other in others],
                self._placer.policy_for,
                max_per_card=max_per_card,
                planned=[other.planned for other in others],
            )
            if can_place(view, request, max_per_card=max_per_card):
                views[name] = view
                continue
            failed.add(name)
            verdicts.reject(
                name,
                FitVerdict(
                    fits=False,
                    reason=f"no card holds {request.describe()} once the {len(others)} pod(s) "
                    "kube-scheduler is binding to this node are placed",
                    kind=BINDING_IN_FLIGHT,
                ),
            )
        if failed:
            verdicts.passed = [name for name in verdicts.passed if name not in failed]
        return views

    def _choice(
        self,
        pod: Pod,
        request: PodRequest | str,
        passed: list[str],
        views: dict[str, NodeView],
    ) -> Choice | None:
        """The node the policy places ``pod`` best on, when filter may answer it alone:
        a GPU pod, more than one node fits, and the pod's spec states no preference that
        kube-scheduler's scores would weigh. A node in ``views`` is valued as that view
        (with the pods being bound there placed)."""
        if not (
            self._settings.choose_in_filter
            and isinstance(request, PodRequest)
            and request.wants_gpu
            and len(passed) > 1
        ):
            return None
        spec = pod.spec
        if stated_preferences(spec.affinity, spec.topology_spread_constraints):
            return None
        policy = self._placer.policy_for(request)
        values = node_values(
            self._follower.state,
            passed,
            request,
            policy,
            max_per_card=self._placer.max_per_card,
            memo=self._scores,
        )
        max_per_card = self._placer.max_per_card
        plans: dict[str, Plan | None] = {}
        for name, view in views.items():
            plan = plans[name] = plan_pod(view, request, policy, max_per_card=max_per_card)
            values[passed.index(name)] = NO_PLAN if plan is None else plan.score.node
        best = best_at(values)
        if best is None:  # no plan anywhere (a search's leaf limit): let prioritize say
            return None
        chosen = passed[best]
        if chosen in plans:
            plan = plans[chosen]
        else:  # valued from the memo: the value is remembered, the plan is not
            node = self._follower.state.nodes[chosen]
            plan = plan_pod(node.view, request, policy, max_per_card=max_per_card)
        ranked = ranked_first(values, RANKED_IN_RECORD)
        scores = kube_scores([values[at] for at in ranked], policy)
        return Choice(
            node=chosen,
            score=policy.node_score(values[best]),
            policy=policy.name,
            ranked=[passed[at] for at in ranked],
            scores=scores,
            unranked=len(passed) - len(ranked),
            planned=None if plan is None else plan.assignment,
        )

    def prioritize(self, body: bytes) -> bytes:
        pod, candidates, _ = read_args(body)
        with _span("prioritize", pod, candidates) as span:
            return self._prioritize(pod, candidates, span)

    def _prioritize(self, pod: Pod, candidates: Candidates, span: Span) -> bytes:
        request = self._request(pod)
        if not isinstance(request, PodRequest):
            request = PodRequest(containers=())
        policy: Policy = self._placer.policy_for(request)
        return self._scored(pod, candidates, request, policy, span)

    def prioritize_claims(self, body: bytes) -> bytes:
        """prioritize for pods whose DRA claims ask our DeviceClass (the verb of a
        scoring-only extender stanza that kube-scheduler calls for every pod, since no
        resource of a pod names its claims: ``docs/dra.md``); every other pod scores 0."""
        pod, candidates, _ = read_args(body)
        claimed = self._claimed(pod) if pod.spec.resource_claims else None
        if claimed is None:
            return encode([HostPriority(host=name, score=0) for name in candidates.names])
        with _span("prioritize-claims", pod, candidates) as span:
            self._placer.observe(claimed)  # DRA pods are part of the workload too
            policy = self._scheduler_first_fit(claimed)
            return self._scored(pod, candidates, claimed, policy, span)

    def _scored(
        self, pod: Pod, candidates: Candidates, request: PodRequest, policy: Policy, span: Span
    ) -> bytes:
        scores = score_nodes(
            self._follower.state,
            candidates.names,
            request,
            policy,
            max_per_card=self._placer.max_per_card,
            memo=self._scores,
        )
        answer = encode(
            [HostPriority(host=n, score=s) for n, s in zip(candidates.names, scores, strict=True)]
        )
        record_scores(span, candidates.names, scores)
        if request.wants_gpu:
            self._record_scores(pod, policy.name, candidates.names, scores)
        return answer

    def _claimed(self, pod: Pod) -> PodRequest | None:
        """What the pod's DRA claims ask of our DeviceClass (None: nothing, or not known)."""
        if self._claim_specs is None:
            return None
        try:
            return claim_request(pod, self._claim_specs)
        except ValueError as error:  # a quantity the apiserver should not have let in
            log.warning("pod %s: its DRA claims are unreadable: %s", _ref(pod).key, error)
            return None

    def _scheduler_first_fit(self, request: PodRequest) -> FirstFitCards:
        """Our policy judging the card kube-scheduler's DRA allocator will take (the first
        that fits): one object per policy object, so the score memo keeps working."""
        policy = self._placer.policy_for(request)
        if self._first_fit is None or self._first_fit.nodes is not policy:
            self._first_fit = FirstFitCards(
                name=f"dra:{policy.name}", nodes=policy, cpu_thresholds=policy.cpu_thresholds
            )
        return self._first_fit

    def _record_scores(
        self,
        pod: Pod,
        policy: str,
        names: list[str],
        scores: list[int],
        *,
        verb: str = "prioritize",
        unranked: int = 0,
    ) -> None:
        self._record(
            "scored",
            nodes_scored,
            pod,
            policy=policy,
            names=names,
            scores=scores,
            verb=verb,
            unranked=unranked,
        )

    def _record_filter(
        self, pod: Pod, request: PodRequest | str, verdicts: NodeVerdicts, choice: Choice | None
    ) -> None:
        if isinstance(request, PodRequest) and not request.wants_gpu:
            return
        chosen = None if choice is None else choice.node
        self._record("filtered", _filtered, pod, request=request, verdicts=verdicts, chosen=chosen)

    def _record(
        self, kind: str, build: Callable[..., AnyDecision], pod: Pod, **fields: Any
    ) -> None:
        """Queue the call's record for ``explain``, built later, off the answer's path."""
        if self._decisions is None:
            return
        self._decisions.record(
            partial(
                build,
                id=f"{kind}:{uuid.uuid4().hex}",
                at=self._clock.now(),
                pod=_ref(pod),
                allocator=self._settings.replica_id,
                **fields,
            )
        )

    def _verdicts(self, pod: Pod, request: PodRequest | str, names: Sequence[str]) -> NodeVerdicts:
        if isinstance(request, str):
            return reject_all(names, request)
        if not request.wants_gpu:
            return NodeVerdicts(passed=list(names))
        state = self._follower.state
        holder = state.node_of(pod.metadata.uid)
        if holder is not None:
            held = state.nodes[holder].pods[pod.metadata.uid]
            if not held.bound:
                return only_the_holder(names, holder, held.reservation_id)
        self._placer.observe(request)
        now = self._clock.now()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "filter at %s on the fold up to seq %d: pod=%s request=%r nodes=%s",
                now.isoformat(),
                self._follower.applied_seq,
                pod.metadata,
                request,
                names,
            )
        return filter_nodes(
            self._follower.state,
            names,
            request,
            now,
            self._memo,
            max_per_card=self._placer.max_per_card,
            index=self._index,
        )

    def _request(self, pod: Pod) -> PodRequest | str:
        """The pod's GPU request (remembered for bind), or why it is invalid (the rule
        broken, worded as the admission webhook and bind word it)."""
        request = validate_pod(pod, self._settings.memory_unit, self._placer.names)
        if not isinstance(request, PodRequest):
            return violation_message(request)
        if request.wants_gpu:
            self._pods.remember(remembered(pod, request))
        return request


def _span(verb: str, pod: Pod, candidates: Candidates) -> AbstractContextManager[Span]:
    meta = pod.metadata
    return verb_span(verb, meta.namespace, meta.name, meta.uid, len(candidates.names))


def _ref(pod: Pod) -> PodRef:
    meta = pod.metadata
    return PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid)


def _filtered(
    *,
    id: str,
    at: datetime,
    pod: PodRef,
    allocator: str,
    request: PodRequest | str,
    verdicts: NodeVerdicts,
    chosen: str | None,
) -> NodesFiltered:
    return nodes_filtered(
        id=id,
        at=at,
        pod=pod,
        allocator=allocator,
        request=request if isinstance(request, str) else request.describe(),
        passed=verdicts.passed,
        failed=(verdicts.failed, verdicts.unresolvable),
        chosen=chosen,
    )
