"""Rendering deploy/ overlays with ``kubectl kustomize`` and finding objects in them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("second-scheduler", "default-scheduler", "dev")
"""Every overlay under deploy/overlays; a test checks none is missing here."""
PRODUCTION = ("second-scheduler", "default-scheduler")
"""Overlays meant for real clusters: two replicas and a budget for every Deployment."""
NAMESPACE = "gpushare-system"

Obj = dict[str, Any]


def kubectl() -> str:
    """The kubectl binary; its absence is a failure, never a skip (CI has v1.32)."""
    found = shutil.which("kubectl")
    if found is None:
        raise AssertionError(
            "kubectl is not on PATH: the deploy tests render overlays with "
            "`kubectl kustomize` (v1.32 at /usr/bin/kubectl on CI)"
        )
    return found


@cache
def _render(path: Path) -> tuple[Obj, ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed:\n{result.stderr}")
    return tuple(obj for obj in yaml.safe_load_all(result.stdout) if obj)


def render(overlay: str) -> tuple[Obj, ...]:
    """Every object ``deploy/overlays/<overlay>`` renders to."""
    return _render(DEPLOY / "overlays" / overlay)


def of_kind(objects: tuple[Obj, ...], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def named(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(objects: tuple[Obj, ...]) -> list[Obj]:
    kinds = {"Deployment", "StatefulSet", "DaemonSet"}
    return [obj for obj in objects if obj["kind"] in kinds]


def containers(workload: Obj) -> Iterator[Obj]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) selects ``labels``."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def scheduler_config(overlay: str) -> Obj:
    """The KubeSchedulerConfiguration of an overlay: the second scheduler's ConfigMap,
    or the default scheduler's file."""
    if overlay == "default-scheduler":
        path = DEPLOY / "overlays" / "default-scheduler" / "scheduler-config.yaml"
        loaded: Obj = yaml.safe_load(path.read_text())
        return loaded
    [config_map] = [
        obj
        for obj in of_kind(render(overlay), "ConfigMap")
        if obj["metadata"]["name"].startswith("gpushare-scheduler-config")
    ]
    return yaml.safe_load(config_map["data"]["config.yaml"])
