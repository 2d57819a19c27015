"""The second scheduler's kube-scheduler follows the cluster: its tag is one parameter
(``images:`` in the overlay), documented, and its default is the Kubernetes release the
real-Kubernetes tier runs (``tests/k8s/build/go.mod``, and the built binaries' VERSION)."""

from __future__ import annotations

import re

import pytest
import yaml

from gpushare.embedded.k8s_binaries import K8sBinaries, K8sBinariesMissing
from tests.deploy.manifests import DEPLOY, ROOT, containers, named, render

IMAGE = "registry.k8s.io/kube-scheduler"
OVERLAY = DEPLOY / "overlays" / "second-scheduler"
GO_MOD = ROOT / "tests" / "k8s" / "build" / "go.mod"


def release_under_test() -> str:
    """The k8s.io/kubernetes release the real-Kubernetes tier builds (``v1.36.3``)."""
    match = re.search(r"^require k8s\.io/kubernetes (v\d+\.\d+\.\d+)$", GO_MOD.read_text(), re.M)
    assert match, f"no `require k8s.io/kubernetes` in {GO_MOD}"
    return match[1]


def default_tag() -> str:
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    [entry] = [image for image in kustomization["images"] if image["name"] == IMAGE]
    assert set(entry) == {"name", "newTag"}
    return str(entry["newTag"])


def test_the_default_is_the_release_the_real_kubernetes_tier_runs() -> None:
    assert default_tag() == release_under_test()


def test_the_default_is_the_version_of_the_built_binaries() -> None:
    try:
        version = K8sBinaries.find().version
    except K8sBinariesMissing as error:
        pytest.skip(f"real Kubernetes binaries: {error}")
    if version is None:
        pytest.skip("release binaries without a VERSION file")
    assert default_tag() == version


@pytest.mark.parametrize("overlay", ["second-scheduler", "dev"])
def test_the_parameter_sets_the_deployments_image(overlay: str) -> None:
    """The Deployment names the image without a tag: the overlay's ``images:`` is the one
    place the version is set (and ``kustomize edit set image`` changes)."""
    deployment = (OVERLAY / "deployment.yaml").read_text()
    assert re.search(rf"image: {re.escape(IMAGE)}(\s|$)", deployment)
    scheduler = named(render(overlay), "Deployment", "gpushare-scheduler")
    [container] = containers(scheduler)
    assert container["image"] == f"{IMAGE}:{default_tag()}"


def test_the_readme_says_to_set_it_to_the_clusters_version() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert f"default, `{release_under_test()}`" in readme
    assert "Set it to your cluster's version" in readme
    assert f"kustomize edit set image {IMAGE}:" in readme
