"""The Kubernetes API's failures, mapped once into what a caller should do about them.

* :class:`TemporaryError`: try again later (5xx, 429, timeouts, connection errors);
* :class:`ConflictError`: 409; the object changed or is taken, re-read and decide again;
* :class:`PermanentError`: retrying cannot help (400, 403, 404, 422...); :class:`NotFound`
  is the 404 case, which callers often treat as "already gone".

The official client raises ``ApiException`` for HTTP errors and urllib3 or socket
errors for transport failures (aiohttp's, for watches); :func:`classify` turns either
into one of the above.
"""

from __future__ import annotations

import json

import aiohttp
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

TOO_MANY_REQUESTS = 429
CONFLICT = 409
NOT_FOUND = 404
GONE = 410


class KubeError(Exception):
    """A failed Kubernetes API call. ``status`` is the HTTP code, 0 without a response."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class TemporaryError(KubeError):
    """The API is unreachable, overloaded or failing: the same call may work later."""


class PermanentError(KubeError):
    """The API refused the request as such: repeating it cannot help."""


class NotFound(PermanentError):
    """The object (or its namespace) does not exist."""


class ConflictError(KubeError):
    """409: the object changed under us, already exists, or is already bound."""


class Expired(KubeError):
    """410: a watch's resourceVersion is too old; list again and watch from there."""


def api_message(error: ApiException) -> str:
    """The ``message`` of the v1 Status body, else the HTTP reason."""
    body: object = error.body
    if isinstance(body, str):
        body = body.encode()
    if isinstance(body, bytes) and body:
        return status_message(body)
    return str(error.reason or f"HTTP {error.status}")


def status_message(body: bytes) -> str:
    """The ``message`` of a v1 Status body, else the body itself (shortened)."""
    text = body.decode(errors="replace")
    try:
        status = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return text.strip()[:500]


def from_status(status: int, message: str) -> KubeError:
    """The error for an HTTP ``status`` (also used for a watch's ERROR event)."""
    if status == CONFLICT:
        return ConflictError(message, status)
    if status == NOT_FOUND:
        return NotFound(message, status)
    if status == GONE:
        return Expired(message, status)
    if status == TOO_MANY_REQUESTS or status >= 500 or status == 0:
        return TemporaryError(message, status)
    return PermanentError(message, status)


def transport_error(error: BaseException) -> KubeError:
    """The error for a request that got no answer (connection refused, reset, timed out):
    :func:`classify`'s, else a ``TemporaryError`` naming what happened."""
    return classify(error) or TemporaryError(f"{type(error).__name__}: {error}")


def classify(error: BaseException) -> KubeError | None:
    """The taxonomy's error for an exception the client raised; None if it is not the API's."""
    if isinstance(error, KubeError):
        return error
    if isinstance(error, ApiException):
        return from_status(int(error.status or 0), api_message(error))
    if isinstance(error, TransportError | aiohttp.ClientError | ConnectionError | TimeoutError):
        return TemporaryError(f"{type(error).__name__}: {error}")
    return None
