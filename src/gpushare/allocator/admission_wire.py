"""``admission.k8s.io/v1`` AdmissionReview, as msgspec Structs, and its JSON codecs.

Only the fields the webhook reads are declared; the rest of what the kube-apiserver sends
(``userInfo``, ``options``, ``requestKind``...) is ignored. The embedded objects stay raw
JSON until the request is known to be about a pod, then decode straight into
:class:`gpushare.core.pods.Pod`.

The answer carries the request's ``uid``, ``allowed`` and, on a denial, a ``metav1.Status``
whose ``message`` kubectl shows after ``admission webhook "..." denied the request:``; the
mutating webhook's also a ``patchType: JSONPatch`` and the base64 of its ``patch``.
"""

from __future__ import annotations

import re

import msgspec

from gpushare.allocator.json_limits import exceeds_depth
from gpushare.allocator.wire import DECODE_ERRORS, WireError, check_body
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
    patch_type: str = msgspec.field(default="", name="patchType")
    """``JSONPatch`` with a ``patch`` (a mutating webhook's answer), else absent."""
    patch: bytes = b""
    """The RFC 6902 JSON Patch's JSON; msgspec writes bytes as base64, as the field wants."""
    warnings: tuple[str, ...] = ()
    """Shown to the client (kubectl prints each as ``Warning: ...``)."""


class AdmissionReviewResponse(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str = msgspec.field(name="apiVersion")
    kind: str
    response: AdmissionResponse


class _UidOnly(msgspec.Struct, frozen=True):
    uid: str = ""


class _UidProbe(msgspec.Struct, frozen=True):
    """Just ``request.uid``: read from a body that is JSON but no valid review."""

    request: _UidOnly | None = None


_review = msgspec.json.Decoder(AdmissionReviewRequest)
_pod = msgspec.json.Decoder(Pod)
_probe = msgspec.json.Decoder(_UidProbe)
_encoder = msgspec.json.Encoder()

UID_SCAN_BYTES = 4096
"""How far into a body that is no JSON the uid is looked for."""
_LEADING_UID = re.compile(rb'"request"\s*:\s*\{\s*"uid"\s*:\s*"([^"\\]{1,256})"')
"""``"request":{"uid":"…"``: the kube-apiserver writes the uid first in the request."""


def decode_review(body: bytes) -> AdmissionRequest:
    """The request inside an ``admission.k8s.io/v1`` AdmissionReview. Raises :class:`WireError`."""
    check_body(body, ADMISSION_REVIEW)
    try:
        review = _review.decode(body)
    except DECODE_ERRORS as error:
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
    except DECODE_ERRORS as error:
        raise WireError(f"request.{field} is not a Pod: {error}") from None


def encode_review(response: AdmissionResponse) -> bytes:
    """The AdmissionReview answering ``response`` (same apiVersion and kind as asked)."""
    review = AdmissionReviewResponse(
        api_version=ADMISSION_V1, kind=ADMISSION_REVIEW, response=response
    )
    return _encoder.encode(review)


def read_uid(body: bytes) -> str:
    """The ``request.uid`` of a body that should be an AdmissionReview but cannot be
    decoded as one; ``""`` when even that cannot be read.

    Only used to answer such a body with a denial: a wrong uid cannot let a pod in (the
    kube-apiserver then fails the call, and the webhook's ``failurePolicy: Fail`` denies).
    JSON is probed for ``request.uid`` alone; a body that is no JSON, too deep to decode,
    or cut short is searched, in its first bytes, for the uid where the kube-apiserver
    writes it.
    """
    if not exceeds_depth(body):
        try:
            probed = _probe.decode(body)
        except DECODE_ERRORS:
            pass
        else:
            return probed.request.uid if probed.request is not None else ""
    found = _LEADING_UID.search(body[:UID_SCAN_BYTES])
    return found[1].decode("utf-8", "replace") if found else ""
