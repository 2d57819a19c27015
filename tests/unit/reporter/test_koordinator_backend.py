"""The Koordinator Device backend over a fake read: how often it reads, and what it reports
when the Device is missing, malformed or unreadable."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.kube.errors import TemporaryError
from gpushare.reporter.koordinator import KoordinatorDeviceBackend, KoordinatorDeviceUnavailable

NODE = "gpu-k"


def device(*minors: int, node: str = NODE, health: bool = True) -> dict[str, Any]:
    entries = [
        {
            "type": "gpu",
            "id": f"GPU-{minor}",
            "minor": minor,
            "health": health,
            "resources": {"koordinator.sh/gpu-memory": "16Gi"},
        }
        for minor in minors
    ]
    labels = {"node.koordinator.sh/gpu-driver-version": "550.54.15"}
    return {"metadata": {"name": node, "labels": labels}, "spec": {"devices": entries}}


class FakeApi:
    """Answers each read with the next of ``answers`` (an exception is raised); counts reads."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.reads = 0

    def __call__(self, name: str) -> Any:
        assert name == NODE
        self.reads += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def backend(api: FakeApi, clock: Clock) -> KoordinatorDeviceBackend:
    return KoordinatorDeviceBackend(NODE, api, refresh_seconds=5.0, monotonic=clock)


def test_the_device_is_read_once_per_refresh_period() -> None:
    api, clock = FakeApi(device(0, 1), device(0)), Clock()
    reporter = backend(api, clock)
    assert [c.index for c in reporter.read_cards()] == [0, 1]
    assert (reporter.driver_version(), reporter.read_links(), reporter.mps_enabled()) == (
        "550.54.15",
        (),
        False,
    )
    assert api.reads == 1
    clock.now += 4.9
    assert len(reporter.read_cards()) == 2
    clock.now += 0.1
    assert [c.index for c in reporter.read_cards()] == [0]
    assert api.reads == 2
    assert reporter.source == "koordinator"


def test_an_unreadable_api_keeps_the_last_inventory() -> None:
    api, clock = FakeApi(device(0), TemporaryError("connection refused")), Clock()
    reporter = backend(api, clock)
    first = reporter.read_cards()
    clock.now += 5
    assert reporter.read_cards() == first
    assert api.reads == 2


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(TemporaryError("connection refused"), id="api-down"),
        pytest.param({"kind": "Node", "metadata": {"name": NODE}}, id="not-a-device"),
        pytest.param(device(0, node="other"), id="another-nodes-device"),
    ],
)
def test_with_nothing_read_yet_a_round_is_skipped(answer: Any) -> None:
    reporter = backend(FakeApi(answer), Clock())
    with pytest.raises(KoordinatorDeviceUnavailable, match=NODE):
        reporter.read_cards()


def test_a_missing_device_is_a_node_without_cards() -> None:
    api, clock = FakeApi(device(0), None), Clock()
    reporter = backend(api, clock)
    assert len(reporter.read_cards()) == 1
    clock.now += 5
    assert reporter.read_cards() == ()


def test_an_unhealthy_device_is_reported_so() -> None:
    reporter = backend(FakeApi(device(0, health=False)), Clock())
    (card,) = reporter.read_cards()
    assert (card.healthy, card.health_reason) == (False, "Koordinator: health false")


def test_close_wakes_a_waiting_poll_and_closes_the_client() -> None:
    closed: list[bool] = []
    reporter = KoordinatorDeviceBackend(
        NODE, FakeApi(device(0)), on_close=lambda: closed.append(True)
    )
    reporter.close()
    assert reporter.poll_health_events(30) == []
    reporter.close()
    assert closed == [True]
