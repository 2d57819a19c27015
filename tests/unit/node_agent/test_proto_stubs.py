"""The committed gRPC stubs match proto/, and both kubelet APIs load in one process."""

from __future__ import annotations

from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2 as deviceplugin
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as deviceplugin_grpc
from gpushare.kubelet_api.podresources.v1 import api_pb2 as podresources
from tools import generate_proto


def test_committed_stubs_are_up_to_date() -> None:
    assert generate_proto.main(["--check"]) == 0


def test_both_api_protos_register_under_distinct_names() -> None:
    assert deviceplugin.DESCRIPTOR.name != podresources.DESCRIPTOR.name
    assert deviceplugin.DESCRIPTOR.package == "v1beta1"
    assert podresources.DESCRIPTOR.package == "v1"


def test_method_paths_are_the_kubelets() -> None:
    services = {
        service.full_name: [method.name for method in service.methods]
        for proto in (deviceplugin, podresources)
        for service in proto.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
        "v1.PodResourcesLister": ["List", "GetAllocatableResources", "Get"],
    }
    assert hasattr(deviceplugin_grpc, "DevicePluginServicer")


def test_field_numbers_and_spellings_are_the_kubelets() -> None:
    def numbers(message: object) -> dict[str, int]:
        descriptor = message.DESCRIPTOR  # type: ignore[attr-defined]
        return {field.name: field.number for field in descriptor.fields}

    assert numbers(deviceplugin.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert numbers(deviceplugin.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert numbers(deviceplugin.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert numbers(podresources.ContainerDevices) == {
        "resource_name": 1,
        "device_ids": 2,
        "topology": 3,
    }
    assert numbers(podresources.ClaimResource) == {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
        "share_id": 5,
    }
