from __future__ import annotations

import os
import shutil

import pytest

import tests.k8s.test_scheduler_seed as seed


@pytest.fixture
def k8s_stack(k8s_stack):
    stacks = []

    def start(*a, **k):
        s = k8s_stack(*a, **k)
        stacks.append(s)
        return s

    yield start
    for s in stacks:
        shutil.copytree(s.logs_dir, os.environ["QDIR"] + "/stack")


def test_q(k8s_stack, k8s_api, k8s_clean):
    seed.test_a_pod_the_extender_turned_down_is_retried_once_a_release_frees_its_card(
        k8s_stack, k8s_api, k8s_clean
    )
