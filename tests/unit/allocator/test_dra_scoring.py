"""prioritize for pods whose DRA claims ask our DeviceClass: nodes ranked by our policy on
the card kube-scheduler's first fit will take (``docs/dra.md``), over kube-scheduler's JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.dra import DEVICE_CLASS
from gpushare.core.dra_claims import CLAIM, TEMPLATE
from tests.fakes import offline_follower
from tests.unit.allocator.builders import V100, names_args, node_events

PRIORITIZE = "/gpushare-scheduler/prioritize-claims"
SPECS: dict[tuple[str, str, str], dict[str, Any]] = {
    (TEMPLATE, "ml", "gpu-8g"): {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": DEVICE_CLASS,
                        "capacity": {"requests": {"memory": "8Gi"}},
                    },
                }
            ]
        }
    },
    (CLAIM, "ml", "other-vendor"): {
        "devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "nvidia.com"}}]}
    },
}


def specs(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return SPECS.get((kind, namespace, name))


def dra_pod(**claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "infer", "namespace": "ml", "uid": "u-infer"},
        "spec": {
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **claim}],
        },
    }


def dra_node(name: str, used: list[int]) -> list[Any]:
    events = node_events(name, used)
    events[0] = msgspec.structs.replace(events[0], front_door="dra")
    return events


async def scores(pod: dict[str, Any], *, claim_specs: Any = specs) -> list[int]:
    # "empty" has nothing on it; on "half", an 8 GiB claim fills card 0 (the first fit) exactly
    follower = offline_follower([*dra_node("empty", [0, 0]), *dra_node("half", [V100 - 8192, 0])])
    app = create_app(
        follower, AllocatorSettings(replica_id="t"), clock=SYSTEM_CLOCK, claim_specs=claim_specs
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        response = await client.post(PRIORITIZE, content=names_args(pod, ["empty", "half"]))
    assert response.status_code == 200
    return [entry["Score"] for entry in response.json()]


async def test_a_claim_of_our_class_is_scored_by_our_policy() -> None:
    empty, half = await scores(dra_pod(resourceClaimTemplateName="gpu-8g"))
    assert half > empty  # the fuller node, where the card the claim lands on fills up


async def test_pods_without_claims_of_ours_score_nothing() -> None:
    no_claims = dra_pod(resourceClaimTemplateName="gpu-8g")
    del no_claims["spec"]["resourceClaims"]
    assert await scores(no_claims) == [0, 0]


async def test_claims_of_other_classes_or_unknown_ones_score_nothing() -> None:
    assert await scores(dra_pod(resourceClaimName="other-vendor")) == [0, 0]
    assert await scores(dra_pod(resourceClaimTemplateName="not-yet-seen")) == [0, 0]
    assert await scores(dra_pod(resourceClaimTemplateName="gpu-8g"), claim_specs=None) == [0, 0]
