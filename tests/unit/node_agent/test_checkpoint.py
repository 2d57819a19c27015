"""The kubelet's device checkpoint, as every kubelet version since 1.10 writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.node_agent.checkpoint import parse_checkpoint, read_checkpoint
from gpushare.node_agent.foreign import ForeignDevices

OURS = ("aliyun.com/gpu-mem",)


def checkpoint(*entries: dict[str, object]) -> bytes:
    data = {"PodDeviceEntries": list(entries), "RegisteredDevices": {"nvidia.com/gpu": ["GPU-a"]}}
    return json.dumps({"Data": data, "Checksum": 12345}).encode()


def entry(resource: str, ids: object, uid: str = "uid-1") -> dict[str, object]:
    return {
        "PodUID": uid,
        "ContainerName": "cuda",
        "ResourceName": resource,
        "DeviceIDs": ids,
        "AllocResp": "CgA=",
    }


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        pytest.param({"0": ["GPU-a"], "1": ["GPU-b"]}, ("GPU-a", "GPU-b"), id="per-numa-node"),
        pytest.param({"-1": ["GPU-a"]}, ("GPU-a",), id="no-topology"),
        pytest.param(["GPU-a", "GPU-b"], ("GPU-a", "GPU-b"), id="plain-list-before-1.20"),
    ],
)
def test_device_ids_in_every_layout(ids: object, expected: tuple[str, ...]) -> None:
    (found,) = parse_checkpoint(checkpoint(entry("nvidia.com/gpu", ids)), OURS)
    assert found == ForeignDevices("uid-1", "cuda", "nvidia.com/gpu", expected)


def test_our_own_resources_and_empty_entries_are_left_out() -> None:
    raw = checkpoint(
        entry("aliyun.com/gpu-mem", {"0": ["abc-1"]}),
        entry("nvidia.com/gpu", {"0": []}, uid="empty"),
        entry("nvidia.com/gpu", None, uid="null"),
    )
    assert parse_checkpoint(raw, OURS) == []


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"{half", id="half-written"),
        pytest.param(b'{"Data": {"PodDeviceEntries": {"x": 1}}}', id="wrong-shape"),
    ],
)
def test_an_unreadable_checkpoint_raises_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match="unreadable device checkpoint"):
        parse_checkpoint(raw, OURS)


def test_a_checkpoint_without_entries_holds_nothing() -> None:
    assert parse_checkpoint(b'{"Data": {}, "Checksum": 0}', OURS) == []


async def test_reading_a_missing_or_bad_file_gives_none(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    assert await read_checkpoint(path, OURS) is None
    path.write_bytes(b"not json")
    assert await read_checkpoint(path, OURS) is None
    path.write_bytes(checkpoint(entry("nvidia.com/gpu", ["GPU-a"])))
    assert await read_checkpoint(path, OURS) == [
        ForeignDevices("uid-1", "cuda", "nvidia.com/gpu", ("GPU-a",))
    ]
