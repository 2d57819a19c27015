"""The Kubernetes pod resource model as the kubelet applies it (KEP-753): init containers
run one at a time, native sidecars (``restartPolicy: Always``) run beside everything
started after them, app containers add up; and shapes no device plugin can serve are
refused with their rule (issue 36, defects 2 and 3)."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.errors import InvalidRequest
from gpushare.core.fit import check_fit
from gpushare.core.model import ContainerShare
from gpushare.core.placement import reserve
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import GPU_MEM, read_gpu_request
from gpushare.core.state import ClusterState, memory_by_card
from tests.unit.core.factories import T0, V100, inventory, make_card, pod_dict, pod_ref


def container(name: str, limits: dict[str, str], restart: str | None = None) -> dict[str, Any]:
    made: dict[str, Any] = {"name": name, "image": "x", "resources": {"limits": limits}}
    if restart is not None:
        made["restartPolicy"] = restart
    return made


def mem(mib: int) -> dict[str, str]:
    return {GPU_MEM: str(mib)}


def share(
    name: str, mib: int, card: int = 0, *, init: bool = False, sidecar: bool = False
) -> ContainerShare:
    return ContainerShare(
        container=name,
        card_index=card,
        card_uuid=f"GPU-{card}",
        memory_mib=mib,
        init=init,
        sidecar=sidecar,
    )


def test_an_init_container_with_restart_policy_always_is_a_sidecar_not_an_init() -> None:
    pod = pod_from_dict(
        pod_dict(
            [container("app", mem(8000))],
            [container("setup", mem(2000)), container("proxy", mem(6000), restart="Always")],
        )
    )
    setup, proxy, app = read_gpu_request(pod).containers
    assert (setup.init, setup.sidecar) == (True, False)
    assert (proxy.init, proxy.sidecar) == (False, True)
    assert (app.init, app.sidecar) == (False, False)
    assert read_gpu_request(pod).memory_mib == 14000
    assert "proxy (sidecar): 6000 MiB" in read_gpu_request(pod).describe()
    assert "setup (init): 2000 MiB" in read_gpu_request(pod).describe()


@pytest.mark.parametrize(
    ("shares", "held"),
    [
        pytest.param([share("i", 9000, init=True), share("a", 3000)], 9000, id="init-alone"),
        pytest.param([share("s", 6000, sidecar=True), share("a", 8000)], 14000, id="sidecar+app"),
        pytest.param(
            [share("s", 6000, sidecar=True), share("i", 9000, init=True), share("a", 1000)],
            15000,
            id="init-beside-an-earlier-sidecar",
        ),
        pytest.param(
            [share("i", 9000, init=True), share("s", 6000, sidecar=True), share("a", 1000)],
            9000,
            id="init-before-the-sidecar-starts",
        ),
        pytest.param(
            [share("s", 6000, sidecar=True), share("i", 9000, 1, init=True), share("a", 1000)],
            7000,
            id="init-on-another-card",
        ),
    ],
)
def test_a_card_holds_the_pods_peak_as_the_kubelet_runs_it(
    shares: list[ContainerShare], held: int
) -> None:
    assert memory_by_card(shares).get("GPU-0", 0) == held


def test_a_native_sidecar_counts_for_the_pods_whole_life_so_the_card_is_not_oversold() -> None:
    """Issue 36, defect 2: a 6,000 MiB sidecar beside an 8,000 MiB app on one 16,276 MiB
    card holds 14,000 MiB, so a further 4,000 MiB pod does not fit there."""
    state = ClusterState()
    state.apply(inventory("n", (make_card(0, V100, node="n"),)))
    pod = pod_from_dict(
        pod_dict([container("app", mem(8000))], [container("log", mem(6000), restart="Always")])
    )
    event = reserve(state.node("n"), pod_ref("p"), read_gpu_request(pod), reservation_id="r", at=T0)
    assert event is not None
    assert [(s.container, s.sidecar, s.memory_mib) for s in event.shares] == [
        ("log", True, 6000),
        ("app", False, 8000),
    ]
    node = state.apply(event, 1)
    assert sum(node.used_mib.values()) == 14000
    another = read_gpu_request(pod_from_dict(pod_dict([container("c", mem(4000))])))
    assert not check_fit(node, another, T0).fits


def share_of(mib: int) -> dict[str, str]:
    """A gpushare.io share: 10 % of the core and ``mib`` MiB, on any card."""
    return {"gpushare.io/gpu-core": "10", "gpushare.io/gpu-memory": f"{mib}Mi"}


def test_an_init_container_fits_beside_the_sidecars_started_before_it_or_not_at_all() -> None:
    """A 12,000 MiB init container after a 6,000 MiB sidecar needs 18,000 MiB on one card:
    on one V100 the pod does not fit; on two the init container goes on the other card."""
    pod = pod_from_dict(
        pod_dict(
            [
                container(
                    "app", {"koordinator.sh/gpu-core": "10", "koordinator.sh/gpu-memory": "1000Mi"}
                )
            ],
            [
                container("log", share_of(6000), restart="Always"),
                container("load", share_of(12000)),
            ],
        )
    )
    wanted = read_gpu_request(pod)
    one = ClusterState()
    one.apply(inventory("n", (make_card(0, V100, node="n"),)))
    assert reserve(one.node("n"), pod_ref("p"), wanted, reservation_id="r", at=T0) is None
    two = ClusterState()
    two.apply(inventory("n", (make_card(0, V100, node="n"), make_card(1, V100, node="n"))))
    event = reserve(two.node("n"), pod_ref("p"), wanted, reservation_id="r", at=T0)
    assert event is not None
    cards = {s.container: s.card_index for s in event.shares}
    assert cards["load"] != cards["log"]
    node = two.apply(event, 1)
    app_beside_log = 1000 if cards["app"] == cards["log"] else 0
    assert node.used_mib[f"GPU-n-{cards['log']}"] == 6000 + app_beside_log
    assert node.used_mib[f"GPU-n-{cards['load']}"] == 12000  # the app (1000) runs after it


@pytest.mark.parametrize("resource", ["gpushare.io/gpu-memory", "koordinator.sh/gpu-memory"])
def test_a_memory_amount_alone_is_refused_since_no_device_plugin_hands_out_its_card(
    resource: str,
) -> None:
    """Issue 36, defect 3: the kubelet admits such a pod and starts it without a GPU."""
    alone = pod_from_dict(pod_dict([container("c", {resource: "4Gi"})]))
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(alone)
    assert caught.value.rule == "memory-without-device-resource"
    assert resource in caught.value.detail
    core = resource.rsplit("/", 1)[0] + "/gpu-core"
    with_core = pod_from_dict(pod_dict([container("c", {resource: "4Gi", core: "30"})]))
    (served,) = read_gpu_request(with_core).containers
    assert (served.memory_mib, served.core_percent) == (4096, 30)


CORE = {"gpushare.io/gpu-core": "30"}


@pytest.mark.parametrize(
    ("init", "later", "refused"),
    [
        pytest.param(CORE, CORE, True, id="init-then-app-same-resource"),
        pytest.param({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"}, True, id="whole-cards"),
        pytest.param(mem(2000), mem(3000), False, id="aliyun-share-one-card"),
        pytest.param(CORE, {"koordinator.sh/gpu-core": "30"}, False, id="other-resource"),
        pytest.param({}, CORE, False, id="init-without-gpu"),
    ],
)
def test_an_init_container_whose_ids_the_kubelet_would_hand_on_is_refused(
    init: dict[str, str], later: dict[str, str], refused: bool
) -> None:
    """The kubelet gives a later container asking the same resource the IDs of a
    run-to-completion init container first (``devicesToReuse``): it would run on the
    init container's cards, not the ones the log plans (a generated shape found it)."""
    pod = pod_from_dict(pod_dict([container("app", later)], [container("setup", init)]))
    if not refused:
        read_gpu_request(pod)
        return
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(pod)
    assert caught.value.rule == "init-container-ids-reused"
    assert "'setup'" in caught.value.detail
    assert "'app'" in caught.value.detail


def test_a_sidecar_started_before_an_init_container_keeps_its_ids_to_itself() -> None:
    """A sidecar's IDs are never handed on, and an init container after it hands its own
    to later containers only: the same resource in both is served."""
    pod = pod_from_dict(
        pod_dict(
            [container("app", mem(1000))],
            [container("log", CORE, restart="Always"), container("setup", CORE)],
        )
    )
    roles = [(c.container, c.init, c.sidecar) for c in read_gpu_request(pod).containers]
    assert roles == [("log", False, True), ("setup", True, False), ("app", False, False)]
