"""The replay's models of DRA claims: kube-scheduler's first fit, alone or with our scores."""

from __future__ import annotations

from gpushare.core.placement import plan_pod
from gpushare.core.policies.first_fit import FirstFitCards
from gpushare.core.policies.workload import DEFAULT_POLICY
from gpushare.core.view import CardView, NodeView
from gpushare.tracebench.policies import DRA_SCHEDULER, DRA_SCORED, build, resolve
from tests.unit.core.factories import request_of


def node(*free_mib: int) -> NodeView:
    return NodeView(
        cards=tuple(
            CardView(index=i, memory_mib=16000, free_mib=free, free_core=100, model="T4")
            for i, free in enumerate(free_mib)
        )
    )


def test_kube_scheduler_takes_the_first_card_that_fits() -> None:
    """Binpack would take card 2 (the fullest that holds 4000 MiB); first fit takes card 1."""
    view = node(1000, 16000, 5000)
    plan = plan_pod(view, request_of(4000), build(DRA_SCHEDULER, []))
    assert plan is not None
    assert plan.assignment == ((1,),)


def test_the_scheduler_alone_prefers_the_emptiest_node() -> None:
    policy = build(DRA_SCHEDULER, [])
    scores = [
        policy.node_score(plan.score.node)
        for view in (node(16000, 16000), node(4000, 16000))
        if (plan := plan_pod(view, request_of(1000), policy)) is not None
    ]
    assert scores[0] > scores[1]


def test_scored_claims_keep_first_fit_cards_and_take_our_node_scores() -> None:
    policy = build(DRA_SCORED, [])
    assert isinstance(policy, FirstFitCards)
    assert policy.nodes is not None
    assert policy.nodes.name == DEFAULT_POLICY
    plan = plan_pod(node(1000, 16000, 5000), request_of(4000), policy)
    assert plan is not None
    assert plan.assignment == ((1,),)


def test_the_models_are_named_only_when_asked() -> None:
    assert resolve(DRA_SCORED) == (DRA_SCORED,)
    assert DRA_SCHEDULER not in resolve("all")
