"""gpushare scoring DRA pods on the real kube-scheduler: a second, scoring-only extender
stanza (``prioritize-claims``, no managedResources, no bind) and ``--dra-scoring``. The
scheduler's DRA allocator still takes the first card that fits; our prioritize ranks the
nodes by what our policy makes of that card (``docs/dra.md``)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpushare.cli.stack import CRDS_DIR, Stack
from gpushare.core.dra import DEVICE_CLASS
from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from gpushare.kube import bringup as stack_kube
from tests.k8s.pods import eventually
from tests.k8s.scheduling import read_pod, score_decisions
from tests.k8s.test_dra import DEPLOY_DRA, claim_pod, template


@pytest.fixture(scope="module")
def control_plane(k8s_binaries: K8sBinaries, extender_port: int) -> Iterator[ControlPlane]:
    """This module's control plane: gpushare's usual stanza, and a scoring-only one that
    kube-scheduler asks about every pod (its pods' claims name no resource of ours)."""
    url = extender_url(extender_port)
    claims = ExtenderStanza(
        url,
        filter_verb="",
        prioritize_verb="prioritize-claims",
        bind_verb="",
        managed_resources=(),
        ignorable=True,
    )
    with ControlPlane(binaries=k8s_binaries, extenders=[ExtenderStanza(url), claims]) as plane:
        stack_kube.install_crds(plane.kubeconfig, sorted(CRDS_DIR.glob("*.yaml")))
        yield plane


def test_dra_pods_go_where_our_policy_scores_the_schedulers_first_fit_best(
    k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api
) -> None:
    stack = k8s_stack(
        ["dra-a=16384,16384", "dra-b=16384,16384"],
        real_kubelet=False,
        extra_env={"GPUSHARE_FRONT_DOOR": "dra"},
        # binpack: the fuller node scores higher, so the test can tell our score decided
        service_args={"allocator": ["--dra-scoring", "--policy", "binpack"]},
    )
    resources = client.CustomObjectsApi(k8s_api.api_client)
    group = ("resource.k8s.io", "v1")
    resources.create_cluster_custom_object(
        *group, "deviceclasses", yaml.safe_load(Path(DEPLOY_DRA).read_text())
    )
    try:
        eventually(
            lambda: (
                len(resources.list_cluster_custom_object(*group, "resourceslices")["items"]) == 2
            ),
            "both nodes' ResourceSlices",
        )
        for name, memory in (("gpu-12g", "12Gi"), ("gpu-4g", "4Gi")):
            resources.create_namespaced_custom_object(
                *group, "default", "resourceclaimtemplates", template(name, memory)
            )
        k8s_api.create_namespaced_pod("default", claim_pod("big", "gpu-12g"))
        first = placed(k8s_api, "big")
        other = ({"dra-a", "dra-b"} - {first}).pop()
        # the log must hold the claim before the next pod is scored on it
        eventually(
            lambda: score_ready(stack, first), "the big claim in the allocator's fold", timeout=30
        )

        k8s_api.create_namespaced_pod("default", claim_pod("small", "gpu-4g"))
        # first fit puts 4 GiB on card 0 of either node; binpack scores `first` fuller
        assert placed(k8s_api, "small") == first
        # the allocator publishes its records in batches, a moment after the calls
        (scored,) = eventually(
            lambda: [d for d in score_decisions(stack, "small") if d.scores.get(first)],
            "the record of small's prioritize",
        )
        assert scored.policy == "dra:binpack"
        assert scored.scores[first] > scored.scores[other]
    finally:
        resources.delete_cluster_custom_object(*group, "deviceclasses", DEVICE_CLASS)


def placed(k8s_api: client.CoreV1Api, name: str) -> str:
    """The node kube-scheduler bound pod ``name`` to (it binds DRA pods itself)."""
    return str(
        eventually(lambda: read_pod(k8s_api, name)["spec"].get("nodeName"), f"pod {name} bound")
    )


def score_ready(stack: Stack, node: str) -> bool:
    """Whether the allocator's /inspect shows a claim on ``node``."""
    with urllib.request.urlopen(f"{stack.extender_url}/inspect", timeout=5) as reply:
        nodes = json.loads(reply.read())["nodes"]
    return any(entry["name"] == node and entry.get("claim_count") for entry in nodes)
