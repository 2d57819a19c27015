"""``make bench-log``'s reconcile stall is measured on API pods that agree with the fold."""

from __future__ import annotations

from datetime import timedelta

from benchmarks.log_replay import T0, allocation_events, api_pods, inventories
from gpushare.core.reconciliation import Context, reconcile
from gpushare.core.state import fold_events


def test_the_api_pods_agree_with_the_fold_so_a_pass_corrects_nothing() -> None:
    events = [*inventories(50, 4), *allocation_events(500, 50, 4)]
    state = fold_events(list(enumerate(events, start=1)))
    pods = api_pods(state)
    live = sum(len(node.pods) for node in state.nodes.values())
    assert len(pods) == live > 0
    context = Context(now=T0 + timedelta(days=1), bind_timeout=timedelta(seconds=60))
    corrections = reconcile(state, pods, None, context)
    assert (corrections.adoptions, corrections.releases, corrections.repairs) == ((), (), ())
    assert corrections.discrepancies == ()
