"""The test kubelet's Node status: what a real kubelet reports, so the real scheduler fits pods."""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from pathlib import Path

from gpushare.core.quantity import parse_count, parse_quantity
from gpushare.embedded.kubelet_node import (
    machine_memory_kib,
    machine_resources,
    node_labels,
    status_body,
)


def test_the_status_advertises_pods_cpu_memory_and_devices_with_a_ready_heartbeat() -> None:
    machine = {"cpu": "2", "memory": "1024Ki", "pods": "110"}
    devices = ({"aliyun.com/gpu-mem": "32552"}, {"aliyun.com/gpu-mem": "16276"})
    since = datetime(2026, 1, 1, tzinfo=UTC)
    now = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)

    status = status_body(machine, devices, now, since)["status"]

    assert status["capacity"] == {**machine, "aliyun.com/gpu-mem": "32552"}
    assert status["allocatable"] == {**machine, "aliyun.com/gpu-mem": "16276"}
    [ready] = status["conditions"]
    assert (ready["type"], ready["status"]) == ("Ready", "True")
    assert ready["lastHeartbeatTime"] == "2026-01-01T00:00:10Z"
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_machine_resources_are_valid_quantities_of_this_machine() -> None:
    resources = machine_resources()
    assert parse_count(resources["pods"]) == 110
    assert parse_count(resources["cpu"]) >= 1
    assert parse_quantity(resources["memory"]) > 0


def test_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree: 5 kB\nMemTotal:       16384 kB\n")
    assert machine_memory_kib(meminfo) == 16384
    assert machine_memory_kib(tmp_path / "absent") == 0


def test_nodes_carry_the_well_known_labels() -> None:
    labels = node_labels("gpu-a")
    assert labels["kubernetes.io/hostname"] == "gpu-a"
    assert labels["kubernetes.io/os"] == "linux"
    machine = platform.machine().lower()
    assert labels["kubernetes.io/arch"] == {"x86_64": "amd64", "aarch64": "arm64"}.get(
        machine, machine
    )
