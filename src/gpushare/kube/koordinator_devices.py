"""Koordinator's ``Device`` objects (``scheduling.koordinator.sh/v1alpha1``, cluster-scoped,
one per node and named after it, written by koordlet), read for the reporter's
``--source koordinator-device``.

Synchronous on purpose: the reporter calls its backends from a worker thread, one call at
a time per node (:mod:`gpushare.reporter.backends`). The call gets the client's timeout,
error mapping (:mod:`gpushare.kube.errors`) and metrics, as :class:`KubeClient` calls do.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from kubernetes import client

from gpushare.core.koordinator import GROUP, PLURAL, VERSION
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import NotFound, classify
from gpushare.kube.metrics import API_ERRORS, API_SECONDS

CALL = "get_cluster_custom_object"


def read_koordinator_device(kube: KubeClient, node: str) -> Any | None:
    """The node's Device as decoded JSON; ``None`` when it has none (or Koordinator's CRD is
    not installed). Raises a :class:`~gpushare.kube.errors.KubeError` for other failures,
    :class:`ValueError` when the answer is not JSON."""
    api: Any = client.CustomObjectsApi(kube.api_client)
    started = time.perf_counter()
    try:
        response = api.get_cluster_custom_object(
            GROUP, VERSION, PLURAL, node, _request_timeout=kube.timeout, _preload_content=False
        )
        try:
            body = response.read()
        finally:
            response.release_conn()
    except Exception as error:
        mapped = classify(error)
        if isinstance(mapped, NotFound):
            return None
        API_ERRORS.labels(CALL, type(mapped or error).__name__).inc()
        if mapped is None or mapped is error:
            raise
        raise mapped from error
    finally:
        API_SECONDS.labels(CALL).observe(time.perf_counter() - started)
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError as error:
        raise ValueError(f"the Device {node} is not JSON: {error}") from None
