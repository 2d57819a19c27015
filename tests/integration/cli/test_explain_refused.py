"""``gpushare explain`` of a pod the kubelet refused: the kubelet's reason and message, not
only ``terminated: Failed`` (the binder's release carries them: ``phase_detail``)."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog
from gpushare.cli import explain
from gpushare.core.events import PodReleased
from gpushare.core.pods import phase_detail, pod_from_dict
from gpushare.embedded.nats_server import NatsServer
from tests.integration.cli.running import WEB, now, run_main, web_lifecycle

pytestmark = pytest.mark.integration

REFUSED = {
    "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
    "status": {
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": "Pod was rejected: Allocate failed due to no gpushare reservation for "
        "container main, which is unexpected",
        "containerStatuses": [
            {"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ],
    },
}


def test_the_detail_of_a_finished_pod_is_its_phase_and_the_kubelets_words() -> None:
    assert phase_detail(pod_from_dict(REFUSED)) == (
        "Failed: UnexpectedAdmissionError: Pod was rejected: Allocate failed due to no "
        "gpushare reservation for container main, which is unexpected; "
        "container main: ContainerCreating"
    )
    done = {"status": {"phase": "Succeeded", "containerStatuses": [{"name": "c", "state": {}}]}}
    assert phase_detail(pod_from_dict(done)) == "Succeeded"
    crashed = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"reason": "OOMKilled"}}},
                {"name": "side", "state": {"terminated": {"reason": "Error", "message": "x"}}},
            ],
        }
    }
    assert phase_detail(pod_from_dict(crashed)) == (
        "Failed; container main: OOMKilled; container side: Error: x"
    )


async def test_explain_says_why_the_kubelet_refused_the_pod(
    js: JetStreamContext, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await web_lifecycle(js)
    detail = phase_detail(pod_from_dict(REFUSED))
    await AllocationLog(js).append(
        PodReleased(
            id="x-web",
            at=now(),
            node="N3",
            pod=WEB,
            reservation_id="r-web",
            reason="terminated",
            detail=detail,
        )
    )
    ran = await run_main(explain.main, ["default/web"], nats_server.url, capsys)
    assert ran.code == 0
    assert any(
        "terminated: Failed: UnexpectedAdmissionError: Pod was rejected: Allocate failed" in line
        for line in ran.lines
    ), ran.out
