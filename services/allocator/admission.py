"""The validating admission webhook: refuse, at creation, a pod gpushare could never place.

Whether a pod's GPU request is valid is the core's call (:func:`read_gpu_request` raises
:class:`InvalidRequest` naming the rule broken); this module only translates an
AdmissionReview into that call and its answer back. Only pods are judged, on CREATE and
on UPDATE of the pod itself (not its subresources, such as ``status``); anything else
is allowed. An UPDATE of a pod that was already invalid is allowed, so that a pod
created before the webhook can still get its labels or finalizers changed.

A denial is ``status: {code: 403, reason: Forbidden, message}`` (controller-runtime's
convention); an unexpected failure is a denial with code 500. A body that is not an
AdmissionReview raises :class:`WireError` (HTTP 400 from the extender's machinery).
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from gpushare.allocator.admission_wire import (
    AdmissionRequest,
    AdmissionResponse,
    Status,
    decode_pod,
    decode_review,
    encode_review,
)
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.wire import WireError
from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import Pod
from gpushare.core.requests import read_gpu_request

log = logging.getLogger(__name__)

ADMISSION_PATH = "/admission/validate"
"""Appended to the extender's ``url_prefix``."""
JUDGED_OPERATIONS = frozenset({"CREATE", "UPDATE"})


def judged(request: AdmissionRequest) -> bool:
    """Whether the webhook has an opinion: a CREATE or UPDATE of a core/v1 Pod itself."""
    kind = request.kind
    return (
        kind.group == ""
        and kind.kind == "Pod"
        and request.operation in JUDGED_OPERATIONS
        and not request.sub_resource
    )


def violation(
    pod: Pod, memory_unit: str, policies: frozenset[str] | None = None
) -> InvalidRequest | None:
    """The rule ``pod`` breaks, if any (a pod asking for no GPU breaks none)."""
    try:
        read_gpu_request(pod, memory_unit, policies)
    except InvalidRequest as error:
        return error
    return None


def deny_message(error: InvalidRequest) -> str:
    return f'gpushare: rule "{error.rule}": {error.detail}'


def review(
    request: AdmissionRequest, memory_unit: str, policies: frozenset[str] | None = None
) -> InvalidRequest | None:
    """The rule that refuses ``request``, or ``None`` to allow it. Raises :class:`WireError`."""
    if not judged(request):
        return None
    pod = decode_pod(request.object, "object")
    if pod is None:
        return None
    broken = violation(pod, memory_unit, policies)
    if broken is None or request.operation != "UPDATE":
        return broken
    old = decode_pod(request.old_object, "oldObject")
    if old is not None and violation(old, memory_unit, policies) is not None:
        return None  # already invalid before this update: not the update's doing
    return broken


class AdmissionReviewer:
    """Answers AdmissionReview bodies, counting decisions in the allocator's registry."""

    def __init__(
        self,
        settings: AllocatorSettings,
        metrics: AllocatorMetrics,
        policies: frozenset[str] | None = None,
    ) -> None:
        self._memory_unit = settings.memory_unit
        self._policies = policies
        self.decisions = Counter(
            "gpushare_admission_decisions",
            "Answers of the validating admission webhook, by result and rule broken.",
            ["result", "rule"],
            registry=metrics.registry,
        )

    def decide(self, request: AdmissionRequest) -> AdmissionResponse:
        log.debug(
            "admission %s: %s %s %s/%s",
            request.uid,
            request.operation,
            request.kind.kind,
            request.namespace,
            request.name,
        )
        try:
            broken = review(request, self._memory_unit, self._policies)
        except WireError:
            raise
        except Exception as error:
            log.exception("admission %s failed", request.uid)
            self.decisions.labels("error", "internal").inc()
            message = f"gpushare allocator internal error: {error}"
            status = Status(code=500, reason="InternalError", message=message)
            return AdmissionResponse(uid=request.uid, allowed=False, status=status)
        if broken is None:
            self.decisions.labels("allowed", "none").inc()
            return AdmissionResponse(uid=request.uid, allowed=True)
        log.info(
            "admission %s: denied %s/%s: %s", request.uid, request.namespace, request.name, broken
        )
        self.decisions.labels("denied", broken.rule).inc()
        status = Status(code=403, reason="Forbidden", message=deny_message(broken))
        return AdmissionResponse(uid=request.uid, allowed=False, status=status)

    async def answer(self, body: bytes) -> bytes:
        """AdmissionReview JSON in, AdmissionReview JSON out. Raises :class:`WireError`."""
        return encode_review(self.decide(decode_review(body)))
