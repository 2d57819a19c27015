"""The Kubernetes API's error answers: a ``v1 Status`` body with the apiserver's wording.

Clients (the official one included) read ``code``, ``reason`` and ``message`` from it, and
gpushare's own adapter maps them to its error taxonomy, so the messages follow
``k8s.io/apimachinery/pkg/api/errors`` word for word where a caller may match on them.
"""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class StatusError(Exception):
    """An API failure, carried up to the HTTP layer and sent as a ``v1 Status``."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def body(self) -> dict[str, Any]:
        return status_body(self.code, "Failure", self.message, self.reason, self.details)


def status_body(
    code: int,
    status: str,
    message: str = "",
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    body["code"] = code
    return body


def success(code: int = 201) -> dict[str, Any]:
    """What ``pods/binding`` answers on success (a Status, not a Binding: protocols D.1)."""
    return status_body(code, "Success")


def not_found(resource: str, name: str) -> StatusError:
    return StatusError(
        404, f'{resource} "{name}" not found', details={"name": name, "kind": resource}
    )


def already_exists(resource: str, name: str) -> StatusError:
    return StatusError(
        409,
        f'{resource} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "kind": resource},
    )


def conflict(resource: str, name: str, why: str) -> StatusError:
    return StatusError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        details={"name": name, "kind": resource},
    )


STALE_OBJECT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def stale(resource: str, name: str) -> StatusError:
    """A write carried a resourceVersion that is no longer the stored one."""
    return conflict(resource, name, STALE_OBJECT)


def invalid(kind: str, name: str, field: str, problem: str) -> StatusError:
    return StatusError(
        422,
        f'{kind} "{name}" is invalid: {field}: {problem}',
        details={"name": name, "kind": kind, "causes": [{"field": field, "message": problem}]},
    )


def bad_request(message: str) -> StatusError:
    return StatusError(400, message)


def gone(message: str) -> StatusError:
    return StatusError(410, message, reason="Expired")
