"""Nodes: the ``aliyun.com/gpu-count`` extended resource the binder maintains, which
nodes exist (for the reconciler), and one node's labels and taints (for the allocator's
bind checks)."""

from __future__ import annotations

import msgspec

from gpushare.core.constraints import Node
from gpushare.core.requests import GPU_COUNT
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import NotFound
from gpushare.kube.pods import merge_patch


async def set_node_gpu_count(kube: KubeClient, node: str, count: int) -> None:
    """Set capacity and allocatable ``aliyun.com/gpu-count`` on ``node``'s status.

    Raises :class:`gpushare.kube.errors.NotFound` when the node is not registered.
    Other capacity entries are left alone (a merge patch of the two maps).
    """
    quantity = str(count)
    body = {"status": {"capacity": {GPU_COUNT: quantity}, "allocatable": {GPU_COUNT: quantity}}}
    await merge_patch(kube, "patch_node_status", f"/api/v1/nodes/{node}/status", body)


RELEASED_ANNOTATION = "gpushare.io/released"
"""Set on a Node after each release there (the release's id), and once more a moment
later (``<id>/again``, for allocators that folded the release after kube-scheduler's
retry): a change of a node's annotations is what makes kube-scheduler retry the pods the
extender turned down (its queueing hint for extenders), now that the card has room in
the allocators' fold too."""


async def annotate_release(kube: KubeClient, node: str, release_id: str) -> None:
    """Write the id of the latest release on ``node`` into its annotations."""
    body = {"metadata": {"annotations": {RELEASED_ANNOTATION: release_id}}}
    await merge_patch(kube, "patch_node", f"/api/v1/nodes/{node}", body)


_node = msgspec.json.Decoder(Node)


async def get_node(kube: KubeClient, name: str) -> Node | None:
    """The node as the API has it now (labels, taints, cordon), or None if it does not exist."""
    try:
        raw = await kube.request("read_node", "GET", f"/api/v1/nodes/{name}")
    except NotFound:
        return None
    return _node.decode(raw.body)


async def node_exists(kube: KubeClient, node: str) -> bool:
    try:
        await kube.request("read_node", "GET", f"/api/v1/nodes/{node}")
    except NotFound:
        return False
    return True


class _Meta(msgspec.Struct, frozen=True):
    name: str = ""


class _Node(msgspec.Struct, frozen=True):
    metadata: _Meta = _Meta()


class _NodeList(msgspec.Struct, frozen=True):
    items: tuple[_Node, ...] = ()


_node_list = msgspec.json.Decoder(_NodeList)


async def list_node_names(kube: KubeClient) -> frozenset[str]:
    """The name of every node the API has (read raw: only the names are decoded)."""
    raw = await kube.call_raw(kube.core.list_node)
    return frozenset(node.metadata.name for node in _node_list.decode(raw.body).items)
