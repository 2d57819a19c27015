"""Finding the pod bind is asked about, and whether it may go to the node bind names.

kube-scheduler sends bind only names, a UID and a node, and so could anyone who reaches
the extender. With a :class:`PodSource` (the allocator has API access: in a cluster it
always has) nothing of the caller's is believed: bind reads the pod and the node from
the API, and refuses when

* the pod does not exist, or is another pod of that name (UID);
* it asks for no GPU or for an invalid one;
* the node does not exist, or the pod's own constraints exclude it
  (:func:`gpushare.core.constraints.exclusion`: nodeName, nodeSelector, required node
  affinity, untolerated taints).

The request reserved is always the API pod's, so a forged filter body (same UID, a
smaller size) cannot shrink it; a disagreement with what filter was told is logged.

Without a source (no kubeconfig: tests, benchmarks, a bare local run) there is nothing to
check against, and bind uses the pod filter remembered, as it was told.
"""

from __future__ import annotations

import logging

from gpushare.allocator.outcomes import BindAnswer
from gpushare.allocator.pod_cache import PodCache, RememberedPod, remembered
from gpushare.allocator.wire import ExtenderBindingArgs
from gpushare.core.constraints import exclusion
from gpushare.core.pods import Pod
from gpushare.core.ports import PodSource
from gpushare.core.requests import GPU_MEM, PodRequest, validate_pod, violation_message

log = logging.getLogger(__name__)

UNKNOWN_POD = "unknown_pod"
INVALID_REQUEST = "invalid_request"
UNKNOWN_NODE = "unknown_node"
NODE_EXCLUDED = "node_excluded"


class PodLookup:
    def __init__(self, pods: PodCache, source: PodSource | None, memory_unit: str) -> None:
        self._pods = pods
        self._source = source
        self._memory_unit = memory_unit
        if source is None:
            log.warning(
                "no Kubernetes API to read pods from (no --kubeconfig): bind trusts the pod "
                "its filter was sent and cannot check the pod's constraints or request"
            )

    async def find(self, args: ExtenderBindingArgs) -> RememberedPod | BindAnswer:
        """The pod's request as the API has it, or the bind answer that says why not."""
        if self._source is None:
            return self._remembered(args)
        key = f"{args.pod_namespace}/{args.pod_name}"
        pod = await self._source.read_pod(args.pod_namespace, args.pod_name, args.pod_uid)
        if pod is None:
            return BindAnswer(UNKNOWN_POD, f"pod {key} does not exist")
        found = self._check(args, pod)
        if isinstance(found, BindAnswer):
            return found
        refused = await self._check_node(self._source, args, pod)
        if refused is not None:
            return refused
        told = self._pods.get(args.pod_uid)
        if told is not None and told.request != found.request:
            log.warning(
                "bind %s/%s: filter was told the pod asks %s, the API says %s; "
                "reserving what the API says",
                args.pod_namespace,
                args.pod_name,
                told.request.describe(),
                found.request.describe(),
                extra={"node": args.node, "pod": key},
            )
        self._pods.remember(found)
        return found

    def _remembered(self, args: ExtenderBindingArgs) -> RememberedPod | BindAnswer:
        cached = self._pods.get(args.pod_uid)
        if cached is not None:
            return cached
        return BindAnswer(
            UNKNOWN_POD,
            f"pod {args.pod_namespace}/{args.pod_name} ({args.pod_uid}) was not seen by this "
            "allocator's filter, and no --kubeconfig is set to read it",
        )

    @staticmethod
    async def _check_node(
        source: PodSource, args: ExtenderBindingArgs, pod: Pod
    ) -> BindAnswer | None:
        """Refuse a node that does not exist or that the pod's own constraints exclude."""
        node = await source.read_node(args.node)
        cannot = f"cannot bind pod {args.pod_namespace}/{args.pod_name} to node {args.node}"
        if node is None:
            return BindAnswer(UNKNOWN_NODE, f"{cannot}: the node does not exist")
        excluded = exclusion(pod.spec, node)
        if excluded is None:
            return None
        return BindAnswer(NODE_EXCLUDED, f"{cannot}: {excluded.describe()}")

    def _check(self, args: ExtenderBindingArgs, pod: Pod) -> RememberedPod | BindAnswer:
        key = f"{args.pod_namespace}/{args.pod_name}"
        if pod.metadata.uid != args.pod_uid:
            return BindAnswer(
                UNKNOWN_POD,
                f"pod {key} was replaced: it has uid {pod.metadata.uid}, bind asked for "
                f"{args.pod_uid}",
            )
        request = validate_pod(pod, self._memory_unit)  # the webhook's and filter's rules
        if not isinstance(request, PodRequest):
            return BindAnswer(INVALID_REQUEST, violation_message(request))
        if not request.wants_gpu:
            return BindAnswer(
                INVALID_REQUEST,
                f"pod {key} asks for no GPU; gpushare binds only GPU pods "
                f"(list gpushare's resources, e.g. {GPU_MEM}, in the extender's "
                "managedResources)",
            )
        return remembered(pod, request)
