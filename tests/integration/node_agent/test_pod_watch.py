"""The test kubelet's pod watch against a Kubernetes API emulator (kmock)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmock_lib
import pytest
from kubernetes.aio import client
from nats.js import JetStreamContext

from gpushare.embedded.kubelet import EmbeddedKubelet, PodWatcher
from gpushare.node_agent.settings import NodeTarget
from tests.integration.node_agent.conftest import StartAgent, StartKubelet
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu
from tests.unit.node_agent.builders import at

GPU0, GPU1 = gpu(0), gpu(1)


def raw_pod(uid: str, units: int, node: str = "n1", created: str | None = None) -> dict[str, Any]:
    metadata = {"name": uid, "namespace": "ns", "uid": uid}
    if created is not None:
        metadata["creationTimestamp"] = created
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {RESOURCE: str(units)}}}],
        },
        "status": {"phase": "Pending"},
    }


def pod_object(uid: str, units: int, node: str = "n1") -> client.V1Pod:
    return as_v1(raw_pod(uid, units, node))


def as_v1(raw: dict[str, Any]) -> client.V1Pod:
    pod = client.V1Pod.from_dict(raw)
    assert pod is not None
    return pod


@pytest.fixture
async def api(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[client.CoreV1Api]:
    configuration = client.Configuration(host=str(kmock.url))
    async with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


@pytest.fixture
async def serving(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    api: client.CoreV1Api,
) -> EmbeddedKubelet:
    """A test kubelet and its node's agent serving one card, and pod ``good`` (512 MiB)
    bound to the node in the log and in the API, not admitted yet."""
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE)
    await book.bind(await book.reserve("good", [("c", GPU0, 512, False)]))
    await api.create_namespaced_pod("ns", pod_object("good", 512))
    return kubelet


async def test_bound_pods_are_admitted_and_marked_running_or_failed(
    serving: EmbeddedKubelet, api: client.CoreV1Api
) -> None:
    kubelet = serving
    await api.create_namespaced_pod("ns", pod_object("stray", 256))
    await api.create_namespaced_pod("ns", pod_object("elsewhere", 256, node="n2"))

    stop = asyncio.Event()
    watcher = PodWatcher(kubelet, api.api_client)
    task = asyncio.create_task(watcher.run(stop))
    try:
        await kubelet.wait_until(lambda: "good" in kubelet.pods and "stray" in watcher.failed)
        good = await api.read_namespaced_pod("good", "ns")
        stray = await api.read_namespaced_pod("stray", "ns")
        await api.delete_namespaced_pod("good", "ns")
        await kubelet.wait_until(lambda: "good" not in kubelet.pods)
    finally:
        stop.set()
        await task

    assert good.status is not None
    assert stray.status is not None
    assert stray.status.message is not None
    assert good.status.phase == "Running"
    assert stray.status.phase == "Failed"
    assert stray.status.reason == "UnexpectedAdmissionError"
    assert "no bound pod on node n1 waits for 256 MiB" in stray.status.message
    assert "elsewhere" not in kubelet.pods


async def test_a_burst_of_new_pods_is_admitted_oldest_first(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    api: client.CoreV1Api,
) -> None:
    """Admitted in arrival order, the newer pod would take the older one's card."""
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE)
    await book.bind(await book.reserve("new", [("c", GPU1, 512, False)], created=at(5)))
    await book.bind(await book.reserve("old", [("c", GPU0, 512, False)], created=at(1)))
    burst = [
        ("ADDED", raw_pod("new", 512, created="2026-01-01T00:00:05Z")),
        ("ADDED", raw_pod("old", 512, created="2026-01-01T00:00:01Z")),
    ]
    for _, raw in burst:
        await api.create_namespaced_pod("ns", as_v1(raw))

    await PodWatcher(kubelet, api.api_client).handle_batch(burst)

    assert kubelet.pods["old"].envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU0.uuid
    assert kubelet.pods["new"].envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid


async def test_after_a_restart_the_kubelet_holds_its_pods_again_from_its_checkpoint(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    api: client.CoreV1Api,
) -> None:
    """As the kubelet's device manager does: what it admitted before a restart is held
    again (IDs, environment, pod-resources) without calling any plugin."""
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE)
    await book.bind(await book.reserve("p", [("c", GPU0, 512, False)]))
    await api.create_namespaced_pod("ns", pod_object("p", 512))
    stop = asyncio.Event()
    task = asyncio.create_task(PodWatcher(kubelet, api.api_client).run(stop))
    try:
        await kubelet.wait_until(lambda: "p" in kubelet.pods)
    finally:
        stop.set()
        await task
    before = kubelet.pods["p"]
    await kubelet.stop()

    again = await start_kubelet(target)
    assert again.pods == {}
    stop = asyncio.Event()
    task = asyncio.create_task(PodWatcher(again, api.api_client).run(stop))
    try:
        await again.wait_until(lambda: "p" in again.pods)
    finally:
        stop.set()
        await task

    held = again.pods["p"]
    assert held.ids(RESOURCE) == before.ids(RESOURCE)
    assert held.envs("c") == before.envs("c")
    assert [c.name for c in again.pod_resources(held).containers] == ["c"]
    assignments = [e for e in await book.assignments() if e.pod.uid == "p"]
    assert len(assignments) == 1  # no second Allocate


class HangsOnce(PodWatcher):
    """Its first watch never ends and never delivers (a connection that died quietly)."""

    SILENCE_SECONDS = 0.5
    hung = 0

    async def _produce(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        if not self.hung:
            self.hung += 1
            await asyncio.Event().wait()
        await super()._produce(queue)


async def admitted_by(watcher: PodWatcher) -> None:
    """Run ``watcher`` until its kubelet has admitted pod ``good`` (10 s at most)."""
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        await asyncio.wait_for(
            watcher.kubelet.wait_until(lambda: "good" in watcher.kubelet.pods), 10
        )
    finally:
        stop.set()
        await task


async def test_a_watch_that_hangs_is_abandoned_and_the_pods_are_admitted_all_the_same(
    serving: EmbeddedKubelet, api: client.CoreV1Api
) -> None:
    watcher = HangsOnce(serving, api.api_client)
    await admitted_by(watcher)
    assert watcher.hung == 1


class DeafOnce(PodWatcher):
    """Its first watch hangs and swallows the first cancellation it gets (as a library
    does that loses one in ``asyncio.wait_for``, CPython gh-86296): asyncio.timeout
    around it never gave the warning, and the node's pods stayed Pending."""

    SILENCE_SECONDS = 0.5
    deaf = 0
    ended = False

    async def _produce(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        if not self.deaf:
            self.deaf += 1
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.Event().wait()
                await asyncio.Event().wait()  # until cancelled again
            finally:
                self.ended = True
        await super()._produce(queue)


async def test_a_watch_that_swallows_its_cancellation_is_cancelled_until_it_ends(
    serving: EmbeddedKubelet, api: client.CoreV1Api
) -> None:
    watcher = DeafOnce(serving, api.api_client)
    await admitted_by(watcher)
    assert watcher.deaf == 1
    assert watcher.ended  # cancelled again, and it ended


class CancelledOnce(PodWatcher):
    """Its first watch ends with a cancellation that is not the watcher's (a library's)."""

    cancelled = 0

    async def _produce(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        if not self.cancelled:
            self.cancelled += 1
            raise asyncio.CancelledError
        await super()._produce(queue)


async def test_a_watch_cancelled_from_within_is_started_again(
    serving: EmbeddedKubelet, api: client.CoreV1Api
) -> None:
    watcher = CancelledOnce(serving, api.api_client)
    watcher.RETRY_SECONDS = 0.1
    await admitted_by(watcher)
    assert watcher.cancelled == 1


class FailsOnce(PodWatcher):
    """Its first watch fails (the API server reset the connection): awaiting it raised
    the error out of the watcher, which ended without a word, and the node's pods stayed
    Pending while the kubelet went on serving its plugins (seen in the k8s tier)."""

    broke = 0

    async def _produce(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        if not self.broke:
            self.broke += 1
            raise ConnectionResetError("the API server reset the connection")
        await super()._produce(queue)


async def test_a_watch_that_fails_is_logged_and_started_again(
    serving: EmbeddedKubelet, api: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = FailsOnce(serving, api.api_client)
    watcher.RETRY_SECONDS = 0.1
    with caplog.at_level(logging.WARNING, logger="gpushare.embedded.kubelet"):
        await admitted_by(watcher)
    assert watcher.broke == 1
    assert "pod watch failed: the API server reset the connection" in caplog.text
