"""The mutating admission webhook: seed 002's ``kubernetes.io/gpu*`` names renamed, at CREATE.

Which names become which, and the JSON Patch that renames them, are the core's call
(:func:`~gpushare.core.native_names.rewrite_native_names`, whose doc says why such a pod
could not run as asked); this module only translates an AdmissionReview into that call
and its answer back. The answer always allows: with ``patchType: JSONPatch``, the base64
of the patch and a warning saying what was renamed (kubectl prints it) when there is
something to rename, with nothing else otherwise. Only a CREATE of a core/v1 Pod itself is
rewritten (a pod's resources cannot change once it exists); anything else is allowed
unchanged. The kube-apiserver calls the validating webhook after every mutating one, so
the rewritten pod is judged like any other (:mod:`gpushare.allocator.admission`).

Bodies are handled as the validating webhook handles them: whatever the body, the answer
is an AdmissionReview with HTTP 200; a body that is no AdmissionReview, or whose
``object`` is no Pod, is denied with ``status.code`` 400 and the reason, one over the
body limit with 413 (:func:`~gpushare.allocator.admission.too_large_review`), and an
unexpected failure with 500. The ``uid`` is echoed whenever it can be read.
"""

from __future__ import annotations

import logging

import msgspec
from prometheus_client import Counter

from gpushare.allocator.admission import INTERNAL, answer_review, refused
from gpushare.allocator.admission_wire import (
    AdmissionRequest,
    AdmissionResponse,
    decode_pod,
)
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.wire import WireError
from gpushare.core.native_names import Rewrite, rewrite_native_names

log = logging.getLogger(__name__)

MUTATION_PATH = "/admission/mutate"
"""Appended to the extender's ``url_prefix``."""
JSON_PATCH = "JSONPatch"
"""The only ``patchType`` of ``admission.k8s.io/v1``."""

_encoder = msgspec.json.Encoder()


def rewritten(request: AdmissionRequest) -> Rewrite:
    """The rewrite of the pod ``request`` creates; none for anything else.
    Raises :class:`WireError` when the object is no Pod."""
    kind = request.kind
    if kind.group != "" or kind.kind != "Pod" or request.operation != "CREATE":
        return Rewrite()
    if request.sub_resource:
        return Rewrite()
    pod = decode_pod(request.object, "object")
    return Rewrite() if pod is None else rewrite_native_names(pod)


def warnings_of(rewrite: Rewrite) -> tuple[str, ...]:
    """What kubectl shows the pod's creator: the names renamed, and those left as asked."""
    said = []
    if rewrite.renamed:
        renamed = "; ".join(asked.describe() for asked in rewrite.renamed)
        said.append(f"gpushare: renamed seed 002's kubernetes.io names to gpushare's: {renamed}")
    if rewrite.kept:
        kept = "; ".join(asked.describe() for asked in rewrite.kept)
        said.append(f"gpushare: not renamed, the container asks both names: {kept}")
    return tuple(said)


def answer_of(uid: str, rewrite: Rewrite) -> AdmissionResponse:
    """Allowed, with the patch when there is one."""
    warnings = warnings_of(rewrite)
    if not rewrite.patch:
        return AdmissionResponse(uid=uid, allowed=True, warnings=warnings)
    patch = _encoder.encode(rewrite.patch)
    return AdmissionResponse(
        uid=uid, allowed=True, patch_type=JSON_PATCH, patch=patch, warnings=warnings
    )


class AdmissionMutator:
    """Answers AdmissionReview bodies, counting results in the allocator's registry."""

    def __init__(self, metrics: AllocatorMetrics) -> None:
        self._metrics = metrics
        self.results = Counter(
            "gpushare_admission_mutations",
            "Answers of the mutating admission webhook, by result: renamed (a patch), "
            "unchanged (none), error.",
            ["result"],
            registry=metrics.registry,
        )

    def decide(self, request: AdmissionRequest) -> AdmissionResponse:
        try:
            rewrite = rewritten(request)
        except WireError:
            raise
        except Exception as error:
            log.exception("mutation %s failed", request.uid)
            self.results.labels("error").inc()
            return refused(request.uid, INTERNAL, f"gpushare allocator internal error: {error}")
        if rewrite.renamed:
            log.info(
                "mutation %s: %s/%s: %s",
                request.uid,
                request.namespace,
                request.name,
                "; ".join(asked.describe() for asked in rewrite.renamed),
            )
        self.results.labels("renamed" if rewrite.patch else "unchanged").inc()
        return answer_of(request.uid, rewrite)

    async def answer(self, body: bytes) -> bytes:
        """AdmissionReview JSON in, AdmissionReview JSON out, whatever the body."""
        return answer_review(
            body,
            self.decide,
            verb="mutation",
            metrics=self._metrics,
            count_error=self.results.labels("error").inc,
        )
