"""Building the official client from a kubeconfig or the pod's service account.

The ``kubernetes`` client is synchronous; :meth:`KubeClient.call` runs one call in a
worker thread and maps its failures (:mod:`gpushare.kube.errors`), so async services
never block their event loop on the API and never see a raw ``ApiException``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from gpushare.kube.errors import classify
from gpushare.kube.metrics import API_ERRORS, API_SECONDS, call_name
from gpushare.redaction import redact_text

log = logging.getLogger(__name__)

IN_CLUSTER = "in-cluster"
"""``--kubeconfig in-cluster`` (or no kubeconfig at all) uses the pod's service account."""

REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for every call but watches."""

T = TypeVar("T")

_load_incluster: Any = config.load_incluster_config  # untyped upstream
_load_kubeconfig: Any = config.load_kube_config


@dataclass(frozen=True)
class RawResponse:
    status: int
    body: bytes


class KubeClient:
    """One API connection pool and the ``CoreV1Api`` over it."""

    def __init__(
        self, api_client: client.ApiClient, timeout: tuple[float, float] = REQUEST_TIMEOUT
    ):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.timeout = timeout

    @classmethod
    def connect(cls, kubeconfig: str | Path | None = None) -> KubeClient:
        """From a kubeconfig file, or in-cluster when ``kubeconfig`` is None or ``in-cluster``."""
        configuration = client.Configuration()
        if kubeconfig is None or str(kubeconfig) == IN_CLUSTER:
            _load_incluster(client_configuration=configuration)
            log.info(
                "kubernetes: in-cluster service account, API at %s", redact_text(configuration.host)
            )
        else:
            _load_kubeconfig(
                config_file=str(kubeconfig),
                client_configuration=configuration,
                persist_config=False,
            )
            log.info(
                "kubernetes: kubeconfig %s, API at %s", kubeconfig, redact_text(configuration.host)
            )
        return cls(client.ApiClient(configuration))

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)`` in a thread; API failures become ``KubeError``s."""
        kwargs.setdefault("_request_timeout", self.timeout)
        return await self._run(functools.partial(method, *args, **kwargs), call_name(method))

    async def call_raw(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> RawResponse:
        """Like :meth:`call`, but the answer unparsed: skips the client's model layer, which
        is slow for big lists and wrong for some answers (``pods/binding``, protocols D.1)."""
        kwargs.setdefault("_request_timeout", self.timeout)

        def read() -> RawResponse:
            response = method(*args, _preload_content=False, **kwargs)
            try:
                return RawResponse(int(response.status), response.read())
            finally:
                response.release_conn()

        name = call_name(method)
        answer = await self._run(read, name)
        if answer.status >= 400:
            API_ERRORS.labels(name, f"http_{answer.status}").inc()
        return answer

    @staticmethod
    async def _run(function: Callable[[], T], name: str = "unknown") -> T:
        started = time.perf_counter()
        try:
            return await asyncio.to_thread(function)
        except Exception as error:
            mapped = classify(error)
            API_ERRORS.labels(name, type(mapped or error).__name__).inc()
            if mapped is None or mapped is error:
                raise
            raise mapped from error
        finally:
            API_SECONDS.labels(name).observe(time.perf_counter() - started)

    def close(self) -> None:
        closer: Any = self.api_client.close  # untyped upstream
        closer()
