"""What `gpushare up` (the stack) reads and writes in the Kubernetes API while it starts.

With the official client against whichever API the stack runs on (the stand-in, a real
control plane it started, or a cluster given by kubeconfig). Node quantities are read as
Kubernetes quantities: a real apiserver writes 2000 as ``2k``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpushare.core.quantity import parse_count

log = logging.getLogger(__name__)


def core_api(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]


def allocatable_count(node: Any, resource: str) -> int:
    """``status.allocatable[resource]`` of a client ``V1Node`` as a count (0 when absent)."""
    allocatable = (node.status and node.status.allocatable) or {}
    return parse_count(allocatable.get(resource, "0"))


def nodes_advertising(api: Any, resource: str) -> set[str]:
    """The nodes whose allocatable has some of ``resource``."""
    return {
        node.metadata.name
        for node in api.list_node().items
        if node.metadata and allocatable_count(node, resource) > 0
    }


def kubelet_version(node: Any) -> str:
    """The version a kubelet reported in ``status.nodeInfo`` (empty: the test kubelet's)."""
    info = node.status and node.status.node_info
    return str(info.kubelet_version or "") if info else ""


def served_by_kubelets(kubeconfig: Path, names: Iterable[str]) -> dict[str, str]:
    """Which of ``names`` a real kubelet serves already: name → its kubelet version."""
    wanted = set(names)
    return {
        node.metadata.name: kubelet_version(node)
        for node in core_api(kubeconfig).list_node().items
        if node.metadata and node.metadata.name in wanted and kubelet_version(node)
    }


def install_crds(kubeconfig: Path, paths: Iterable[Path], timeout: float = 60.0) -> None:
    """Create these CustomResourceDefinitions (kept if they exist) and wait until served."""
    import yaml  # PyYAML comes with the kubernetes client
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api = client.ApiextensionsV1Api(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]
    names = []
    for path in paths:
        manifest = yaml.safe_load(path.read_text())
        try:
            api.create_custom_resource_definition(manifest)
        except ApiException as error:
            if error.status != 409:
                raise
        names.append(manifest["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(api.read_custom_resource_definition(name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CustomResourceDefinition {name} not established")
            time.sleep(0.1)
        log.info("CustomResourceDefinition %s established", name)


def _established(crd: Any) -> bool:
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def install_webhooks(kubeconfig: Path, manifests: Iterable[dict[str, Any]]) -> None:
    """Create these Validating- and MutatingWebhookConfigurations, replacing any of the
    same name (a control plane kept from an earlier start)."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api = client.AdmissionregistrationV1Api(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]
    for manifest in manifests:
        kind = "validating" if manifest["kind"] == "ValidatingWebhookConfiguration" else "mutating"
        name = manifest["metadata"]["name"]
        create = getattr(api, f"create_{kind}_webhook_configuration")
        try:
            create(manifest)
        except ApiException as error:
            if error.status != 409:
                raise
            getattr(api, f"delete_{kind}_webhook_configuration")(name)
            create(manifest)
        log.info("%s webhook configuration %s installed", kind, name)
