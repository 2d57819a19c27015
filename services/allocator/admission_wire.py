"""``admission.k8s.io/v1`` AdmissionReview, as msgspec Structs, and its JSON codecs.

Only the fields the webhook reads are declared; the rest of what the kube-apiserver sends
(``userInfo``, ``options``, ``requestKind``...) is ignored. The embedded objects stay raw
JSON until the request is known to be about a pod, then decode straight into
:class:`gpushare.core.pods.Pod`.

The answer carries the request's ``uid``, ``allowed`` and, on a denial, a ``metav1.Status``
whose ``message`` kubectl shows after ``admission webhook "..." denied the request:``.
"""

from __future__ import annotations

import msgspec

from gpushare.allocator.wire import WireError
from gpushare.core.pods import Pod

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_REVIEW = "AdmissionReview"

NULL = msgspec.Raw(b"null")


class GroupVersionKind(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the kube-apiserver asks about one operation on one object."""

    uid: str
    kind: GroupVersionKind
    operation: str
    """``CREATE``, ``UPDATE``, ``DELETE`` or ``CONNECT``."""
    resource: GroupVersionResource = GroupVersionResource()
    sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    object: msgspec.Raw = NULL
    """The object as it would be stored; ``null`` for DELETE."""
    old_object: msgspec.Raw = NULL
    """The object before an UPDATE (or the deleted object); ``null`` for CREATE."""
    dry_run: bool = False


class AdmissionReviewRequest(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str = msgspec.field(name="apiVersion")
    kind: str
    request: AdmissionRequest | None = None


class Status(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The parts of ``metav1.Status`` a webhook sets on a denial."""

    code: int
    reason: str = ""
    message: str = ""


class AdmissionResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    uid: str
    allowed: bool
    status: Status | None = None


class AdmissionReviewResponse(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str = msgspec.field(name="apiVersion")
    kind: str
    response: AdmissionResponse


_review = msgspec.json.Decoder(AdmissionReviewRequest)
_pod = msgspec.json.Decoder(Pod)
_encoder = msgspec.json.Encoder()


def decode_review(body: bytes) -> AdmissionRequest:
    """The request inside an ``admission.k8s.io/v1`` AdmissionReview. Raises :class:`WireError`."""
    try:
        review = _review.decode(body)
    except msgspec.MsgspecError as error:
        raise WireError(f"not a valid AdmissionReview: {error}") from None
    if review.api_version != ADMISSION_V1 or review.kind != ADMISSION_REVIEW:
        raise WireError(
            f"expected apiVersion {ADMISSION_V1} kind {ADMISSION_REVIEW}, "
            f"got {review.api_version} {review.kind}"
        )
    if review.request is None:
        raise WireError("AdmissionReview has no request")
    return review.request


def decode_pod(raw: msgspec.Raw, field: str) -> Pod | None:
    """The pod in ``request.object`` or ``request.oldObject``; ``None`` when absent."""
    if bytes(raw) == b"null":
        return None
    try:
        return _pod.decode(raw)
    except msgspec.MsgspecError as error:
        raise WireError(f"request.{field} is not a Pod: {error}") from None


def encode_review(response: AdmissionResponse) -> bytes:
    """The AdmissionReview answering ``response`` (same apiVersion and kind as asked)."""
    review = AdmissionReviewResponse(
        api_version=ADMISSION_V1, kind=ADMISSION_REVIEW, response=response
    )
    return _encoder.encode(review)
