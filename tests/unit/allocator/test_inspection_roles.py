"""``/inspect`` names each container on a card with how the kubelet runs it (issue 36)."""

from __future__ import annotations

from gpushare.allocator.inspection import inspect_node
from gpushare.core.placement import reserve
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import read_gpu_request
from gpushare.core.state import ClusterState
from tests.unit.core.factories import T0, inventory, make_card, pod_dict, pod_ref


def test_inspect_lists_init_containers_sidecars_and_apps_with_their_role() -> None:
    limits = {"limits": {"aliyun.com/gpu-mem": "2000"}}
    pod = pod_dict(
        [{"name": "app", "image": "x", "resources": limits}],
        [
            {"name": "setup", "image": "x", "resources": limits},
            {"name": "proxy", "image": "x", "resources": limits, "restartPolicy": "Always"},
        ],
    )
    state = ClusterState()
    state.apply(inventory("n", (make_card(0, node="n"),)))
    request = read_gpu_request(pod_from_dict(pod))
    event = reserve(state.node("n"), pod_ref("p"), request, reservation_id="r", at=T0)
    assert event is not None
    node = state.apply(event, 1)
    [card] = inspect_node(node, T0)["devs"]
    [entry] = card["pods"]
    assert [(c["name"], c["role"], c["mib"]) for c in entry["containers"]] == [
        ("setup", "init", 2000),
        ("proxy", "sidecar", 2000),
        ("app", "app", 2000),
    ]
    assert entry["mib"] == card["used_mib"] == 4000  # the sidecar and the app, together
