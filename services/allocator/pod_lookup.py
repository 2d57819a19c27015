"""Finding the pod bind is asked about: kube-scheduler sends only its names and UID.

Filter remembered the pod's request (:class:`PodCache`); when it did not (another
replica filtered it, or this one restarted) the pod is read through the optional
:class:`PodSource`, and must still be the pod bind names (same UID) and ask for GPU memory.
"""

from __future__ import annotations

from gpushare.allocator.outcomes import BindAnswer
from gpushare.allocator.pod_cache import PodCache, RememberedPod, remembered
from gpushare.allocator.pod_source import PodSource
from gpushare.allocator.wire import ExtenderBindingArgs
from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import Pod
from gpushare.core.requests import GPU_MEM, read_gpu_request

UNKNOWN_POD = "unknown_pod"
INVALID_REQUEST = "invalid_request"


class PodLookup:
    def __init__(self, pods: PodCache, source: PodSource | None, memory_unit: str) -> None:
        self._pods = pods
        self._source = source
        self._memory_unit = memory_unit

    async def find(self, args: ExtenderBindingArgs) -> RememberedPod | BindAnswer:
        """The pod's request, or the bind answer that explains why there is none."""
        cached = self._pods.get(args.pod_uid)
        if cached is not None:
            return cached
        if self._source is None:
            return BindAnswer(
                UNKNOWN_POD,
                f"pod {args.pod_namespace}/{args.pod_name} ({args.pod_uid}) was not seen by this "
                "allocator's filter, and no --kubeconfig is set to read it",
            )
        pod = await self._source.read_pod(args.pod_namespace, args.pod_name)
        found = self._check(args, pod)
        if isinstance(found, RememberedPod):
            self._pods.remember(found)
        return found

    def _check(self, args: ExtenderBindingArgs, pod: Pod | None) -> RememberedPod | BindAnswer:
        key = f"{args.pod_namespace}/{args.pod_name}"
        if pod is None:
            return BindAnswer(UNKNOWN_POD, f"pod {key} does not exist")
        if pod.metadata.uid != args.pod_uid:
            return BindAnswer(
                UNKNOWN_POD,
                f"pod {key} was replaced: it has uid {pod.metadata.uid}, bind asked for "
                f"{args.pod_uid}",
            )
        try:
            request = read_gpu_request(pod, self._memory_unit)
        except InvalidRequest as error:
            return BindAnswer(
                INVALID_REQUEST, f"invalid GPU request, rule {error.rule!r}: {error.detail}"
            )
        if not request.wants_gpu:
            return BindAnswer(
                INVALID_REQUEST,
                f"pod {key} asks for no GPU; gpushare binds only GPU pods "
                f"(list gpushare's resources, e.g. {GPU_MEM}, in the extender's "
                "managedResources)",
            )
        return remembered(pod, request)
