"""The real-Kubernetes tier: real kube-apiserver, kube-scheduler, controller-manager and
kubelets (``gpushare.embedded.k8s_cluster``), with gpushare's services running against them.

Every test under ``tests/k8s`` is marked ``k8s`` here (``-m "not k8s"`` leaves the tier out)
and given a longer timeout. ``make test`` distributes by file (``--dist loadfile``), so one
worker runs a module and starts its control plane once (``loadgroup`` cannot group: with
pytest 9, pytest-xdist 3.8's group suffix on node IDs has no effect). Without the binaries
the tests skip with one line saying what is missing; with ``GPUSHARE_REQUIRE_K8S=1`` (CI)
that is a failure instead.

Fixtures:

* ``k8s_binaries`` / ``kubelet_binaries`` (session): the binaries, without / with what real
  nodes need (kubelet, containerd, runc, busybox, root).
* ``extender_port`` (module): the port the control plane's kube-scheduler calls as its
  extender (``http://127.0.0.1:PORT/gpushare-scheduler``); ``k8s_stack`` puts the first
  allocator there.
* ``control_plane`` (module): a started :class:`ControlPlane` with gpushare's CRDs.
* ``k8s_api`` (function): the official client's ``CoreV1Api`` on it.
* ``real_nodes`` (function): ``real_nodes(name) -> RealNode``, started, stopped after.
* ``k8s_stack`` (function): ``k8s_stack(["node-a=16276,16276"], real_kubelet=True, ...)
  -> Stack``: real kubelets for those nodes (or the test kubelet with ``real_kubelet=False``)
  and the services as processes against the control plane, stopped after;
  ``stack.real_nodes[name]`` is each :class:`RealNode`, ``stack.restart_kubelet(name)``
  restarts one, ``stack.kill("node-agent")`` / ``stack.restart("node-agent")`` the agent
  (each node has its own: ``stack.node_process("node-agent", name)`` with several nodes).
  NATS is secured as ``deploy/`` secures it: ``stack.credentials("auditor")`` reads it.

After each test that used them, every pod is force-deleted and every Node that no running
kubelet serves is deleted, so the next test of the module starts from an empty cluster.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from gpushare.cli.stack import CRDS_DIR, Stack, StackConfig, parse_node
from gpushare.embedded.k8s_binaries import K8sBinaries, K8sBinariesMissing
from gpushare.embedded.k8s_cluster import ControlPlane, RealNode
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from gpushare.embedded.k8s_ports import reserve_ports
from gpushare.kube import bringup as stack_kube

REQUIRE_K8S = "GPUSHARE_REQUIRE_K8S"
HERE = Path(__file__).resolve().parent
TIMEOUT_SECONDS = 300
"""Per test (the suite's default is 120 s): a test's first fixture starts a control plane,
real kubelets take seconds each, and CI machines are shared. A test past its limit ends its
worker without teardown; the next harness to start reaps what it left."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.k8s)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TIMEOUT_SECONDS))


def find_binaries(*, kubelet: bool) -> K8sBinaries:
    """The binaries, or a skip (a failure under ``GPUSHARE_REQUIRE_K8S=1``)."""
    try:
        return K8sBinaries.find(kubelet=kubelet)
    except K8sBinariesMissing as error:
        if os.environ.get(REQUIRE_K8S) == "1":
            pytest.fail(f"{REQUIRE_K8S}=1 but the real Kubernetes tier cannot run: {error}")
        pytest.skip(f"real Kubernetes tier: {error}")


@pytest.fixture(scope="session")
def k8s_binaries() -> K8sBinaries:
    return find_binaries(kubelet=False)


@pytest.fixture(scope="session")
def kubelet_binaries() -> K8sBinaries:
    return find_binaries(kubelet=True)


@pytest.fixture(scope="module")
def extender_port() -> Iterator[int]:
    reservation = reserve_ports(1)
    try:
        yield reservation.ports[0]
    finally:
        reservation.release()


@pytest.fixture(scope="module")
def control_plane(k8s_binaries: K8sBinaries, extender_port: int) -> Iterator[ControlPlane]:
    stanza = ExtenderStanza(extender_url(extender_port))
    with ControlPlane(binaries=k8s_binaries, extenders=[stanza]) as plane:
        stack_kube.install_crds(plane.kubeconfig, sorted(CRDS_DIR.glob("*.yaml")))
        yield plane


def api_client(plane: ControlPlane) -> Any:
    return kube_config.new_client_from_config(str(plane.kubeconfig))


def clean_cluster(plane: ControlPlane) -> None:
    """Force-delete every pod, every Node no running real kubelet serves, every Device."""
    with api_client(plane) as api_client_:
        api = client.CoreV1Api(api_client_)
        for pod in api.list_pod_for_all_namespaces().items:
            with contextlib.suppress(client.ApiException):
                api.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                )
        for node in api.list_node().items:
            if node.metadata.name not in plane.nodes:
                with contextlib.suppress(client.ApiException):
                    api.delete_node(node.metadata.name)
        with contextlib.suppress(client.ApiException):  # the binder's, one per node
            client.CustomObjectsApi(api_client_).delete_collection_cluster_custom_object(
                "gpushare.io", "v1alpha1", "devices"
            )


@pytest.fixture
def k8s_clean(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The control plane, emptied of pods and stale Nodes after the test."""
    try:
        yield control_plane
    finally:
        clean_cluster(control_plane)


@pytest.fixture
def k8s_api(k8s_clean: ControlPlane) -> Iterator[client.CoreV1Api]:
    with api_client(k8s_clean) as api_client_:
        yield client.CoreV1Api(api_client_)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~107 bytes."""
    with tempfile.TemporaryDirectory(prefix="gs-", dir="/tmp") as path:
        yield Path(path)


@pytest.fixture
def real_nodes(
    k8s_clean: ControlPlane, kubelet_binaries: K8sBinaries
) -> Iterator[Callable[[str], RealNode]]:
    started: list[RealNode] = []

    def start(name: str) -> RealNode:
        node = RealNode(k8s_clean, name)
        started.append(node)
        return node.start()

    try:
        yield start
    finally:
        for node in reversed(started):
            node.stop()


@pytest.fixture
def k8s_stack(
    k8s_clean: ControlPlane,
    extender_port: int,
    real_nodes: Callable[[str], RealNode],
    short_tmp: Path,
) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def start(
        nodes: Sequence[str],
        *,
        real_kubelet: bool = True,
        allocators: int = 1,
        binders: int = 1,
        service_args: Mapping[str, list[str]] | None = None,
        extra_env: Mapping[str, str] | None = None,
        dialects: Sequence[str] = (),
        timeout: float = 120.0,
    ) -> Stack:
        simulated = [parse_node(spec) for spec in nodes]
        started = {n.name: real_nodes(n.name) for n in simulated if real_kubelet}
        endpoints = {name: node.endpoints for name, node in started.items()}
        stack = Stack(
            StackConfig(
                data_dir=short_tmp / f"stack-{len(stacks)}",
                nodes=simulated,
                extender_port=extender_port,
                kubeconfig=k8s_clean.kubeconfig,
                kubelet_nodes=endpoints,
                allocators=allocators,
                binders=binders,
                service_args=dict(service_args or {}),
                extra_env=dict(extra_env or {}),
                dialects=tuple(dialects),
                die_with_parent=True,  # a worker ended at its timeout leaves no services
            )
        )
        stack.real_nodes.update(started)  # stack.restart_kubelet(name) restarts them
        stacks.append(stack)
        return stack.start(timeout)

    try:
        yield start
    finally:
        for stack in stacks:
            exited = stack.exited()  # a service that died when it should not have
            print(f"--- exited: {exited or 'none'}", file=sys.stderr)
            for name in stack.processes:  # shown only when the test failed
                print(f"--- {name}'s log ends:\n{stack.log_tail(name, 15)}", file=sys.stderr)
            stack.stop()
