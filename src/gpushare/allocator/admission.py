"""The validating admission webhook: refuse, at creation, a pod gpushare could never place.

Whether a pod's GPU request is valid is the core's call (:func:`validate_pod` returns
the :class:`InvalidRequest` naming the rule broken, the same judgement filter and bind
make, worded alike by :func:`violation_message`); this module only translates an
AdmissionReview into that call and its answer back. Only pods are judged, on CREATE and
on UPDATE of the pod itself (not its subresources, such as ``status``); anything else
is allowed. An UPDATE of a pod that was already invalid is allowed, so that a pod
created before the webhook can still get its labels or finalizers changed.

A denial is ``status: {code: 403, reason: Forbidden, message}`` (controller-runtime's
convention); an unexpected failure is a denial with code 500.

Whatever the body, the answer is an ``admission.k8s.io/v1`` AdmissionReview with HTTP
200: the kube-apiserver reads any other answer (a 400, ``[]``) as a failed call, and
the webhook's ``failurePolicy: Fail`` then denies with an opaque error. A body that is
no AdmissionReview (not JSON, nested too deep, wrong apiVersion, an ``object`` that is no
Pod) is denied with ``status.code`` 400 (``BadRequest``) and the reason; one over the
allocator's body limit with 413 (``RequestEntityTooLarge``), from the body-limit
middleware (:func:`too_large_review`). The ``uid`` is echoed whenever it can be read
(:func:`~gpushare.allocator.admission_wire.read_uid`), else left empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter

from gpushare.allocator.admission_wire import (
    AdmissionRequest,
    AdmissionResponse,
    Status,
    decode_pod,
    decode_review,
    encode_review,
    read_uid,
)
from gpushare.allocator.limits import Oversized, Refusal, describe
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.wire import WireError
from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import Pod
from gpushare.core.requests import PodRequest, validate_pod, violation_message

log = logging.getLogger(__name__)

ADMISSION_PATH = "/admission/validate"
"""Appended to the extender's ``url_prefix``."""
JUDGED_OPERATIONS = frozenset({"CREATE", "UPDATE"})
BAD_REQUEST = Status(code=400, reason="BadRequest")
TOO_LARGE = Status(code=413, reason="RequestEntityTooLarge")
INTERNAL = Status(code=500, reason="InternalError")


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
    """The rule ``pod`` breaks, if any (a pod asking for no GPU breaks none): the core's
    :func:`validate_pod`, the same judgement filter and bind make."""
    judged = validate_pod(pod, memory_unit, policies)
    return None if isinstance(judged, PodRequest) else judged


def deny_message(error: InvalidRequest) -> str:
    return violation_message(error)


def refused(uid: str, kind: Status, message: str) -> AdmissionResponse:
    """A denial that judged no pod: ``kind``'s code and reason, with ``message``."""
    status = Status(code=kind.code, reason=kind.reason, message=message)
    return AdmissionResponse(uid=uid, allowed=False, status=status)


def too_large_review(oversized: Oversized) -> Refusal:
    """The webhook's answer to a body over the limit (for :class:`~.limits.BodyLimit`):
    HTTP 200, an AdmissionReview denying it, with the uid if the body's head names it."""
    message = f"gpushare: {describe(oversized)}"
    return Refusal(200, encode_review(refused(read_uid(oversized.head), TOO_LARGE, message)))


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


def answer_review(
    body: bytes,
    decide: Callable[[AdmissionRequest], AdmissionResponse],
    *,
    verb: str,
    metrics: AllocatorMetrics,
    count_error: Callable[[], None],
) -> bytes:
    """One webhook's answer to any body: ``decide``'s on an AdmissionReview, a denial
    with code 400 and the reason on anything else, 500 on a failure of ``decide`` (its
    own errors it catches itself; this is the last resort). ``verb`` names the webhook
    in logs and in ``gpushare_bad_requests``."""
    uid = ""
    try:
        request = decode_review(body)
        uid = request.uid
        return encode_review(decide(request))
    except WireError as error:
        uid = uid or read_uid(body)
        log.info("%s %s: 400 %s", verb, uid, error)
        metrics.bad_requests.labels(verb).inc()
        message = f"gpushare: malformed admission request: {error}"
        return encode_review(refused(uid, BAD_REQUEST, message))
    except Exception as error:
        log.exception("%s %s failed", verb, uid)
        count_error()
        message = f"gpushare allocator internal error: {error}"
        return encode_review(refused(uid, INTERNAL, message))


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
        self._metrics = metrics
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
            return refused(request.uid, INTERNAL, f"gpushare allocator internal error: {error}")
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
        """AdmissionReview JSON in, AdmissionReview JSON out, whatever the body."""
        return answer_review(
            body,
            self.decide,
            verb="admission",
            metrics=self._metrics,
            count_error=self.decisions.labels("error", "internal").inc,
        )
