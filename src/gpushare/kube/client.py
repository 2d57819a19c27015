"""Building the official client from a kubeconfig or the pod's service account.

The ``kubernetes`` client is synchronous; :meth:`KubeClient.call` runs one call in a
worker thread and maps its failures (:mod:`gpushare.kube.errors`), so async services
never block their event loop on the API and never see a raw ``ApiException``.

The calls made once per pod (the binder's binding, the allocator's reads) go through
:meth:`KubeClient.request` instead: one aiohttp keep-alive pool on the event loop, with the
official client's configuration (host, TLS, token), bodies encoded and decoded by the
caller. The official path costs a worker-thread hop, pydantic's call validation and
urllib3 per call: measured, about a third of the binder's CPU per pod
(``make bench-kube``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes import client, config

from gpushare.kube.errors import classify, from_status, status_message, transport_error
from gpushare.kube.http import bearer_headers, ssl_context
from gpushare.kube.metrics import API_ERRORS, API_SECONDS, call_name
from gpushare.redaction import redact_text

log = logging.getLogger(__name__)

IN_CLUSTER = "in-cluster"
"""``--kubeconfig in-cluster`` (or no kubeconfig at all) uses the pod's service account."""

REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for every call but watches."""
POOL_CONNECTIONS = 16
"""Most connections :meth:`KubeClient.request`'s pool holds to the API server at once;
further requests wait for one of them. Unbounded (aiohttp's 100), the binder's bindings
in flight opened one each: 35-45 TLS handshakes in a burst of 300 pods (``make
bench-kube``), each costing both ends a millisecond or more of CPU, and as many idle
connections kept on the API server."""
HTTP_ERROR = 400

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
        self._pool: aiohttp.ClientSession | None = None

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

    async def request(
        self,
        name: str,
        verb: str,
        path: str,
        body: bytes | None = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> RawResponse:
        """``verb path`` on the event loop; an answer of 400 or more raises the
        ``KubeError`` :meth:`call` would. ``name`` is the client method the request stands
        for (``create_namespaced_pod_binding``): the metrics' label, and what the RBAC
        derivation (``tests/deploy``) reads."""
        started = time.perf_counter()
        headers = {"Content-Type": content_type} if body is not None else {}
        if self._pool is None or self._pool.closed:
            self._pool = self.open_session(self.timeout[1], connections=POOL_CONNECTIONS)
        try:
            async with self._pool.request(
                verb, self.base_url + path, params=params, data=body, headers=headers,
                proxy=self.proxy,
            ) as response:  # fmt: skip
                answer = RawResponse(response.status, await response.read())
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            mapped = transport_error(error)
            API_ERRORS.labels(name, type(mapped).__name__).inc()
            raise mapped from error
        finally:
            API_SECONDS.labels(name).observe(time.perf_counter() - started)
        if answer.status >= HTTP_ERROR:
            API_ERRORS.labels(name, f"http_{answer.status}").inc()
            raise from_status(answer.status, status_message(answer.body))
        return answer

    def open_session(self, read_seconds: float, *, connections: int = 100) -> aiohttp.ClientSession:
        """A new aiohttp session with this client's TLS and token (the caller closes it):
        :meth:`request`'s pool, and each watch's own (a watch reads for minutes);
        ``connections`` bounds its connections (aiohttp's default: 100)."""
        configuration: Any = self.api_client.configuration  # untyped upstream
        timeout = aiohttp.ClientTimeout(sock_connect=self.timeout[0], sock_read=read_seconds)
        return aiohttp.ClientSession(
            headers=bearer_headers(configuration),
            timeout=timeout,
            connector=aiohttp.TCPConnector(ssl=ssl_context(configuration), limit=connections),
        )

    @property
    def base_url(self) -> str:
        return self.host.rstrip("/")

    @property
    def proxy(self) -> str | None:
        proxy: str | None = self.api_client.configuration.proxy
        return proxy

    async def aclose(self) -> None:
        """Close the event-loop pool, then the official client's."""
        if self._pool is not None:
            await self._pool.close()
        self.close()

    def close(self) -> None:
        closer: Any = self.api_client.close  # untyped upstream
        closer()
