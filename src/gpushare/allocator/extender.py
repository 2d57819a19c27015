"""The extender's HTTP surface (FastAPI): kube-scheduler's verbs plus inspect, health, metrics.

Handlers take the raw body and answer raw JSON bytes: the verbs decode with msgspec
(:mod:`gpushare.allocator.wire`), never through Pydantic models. A body that is not
extender/v1 JSON gets HTTP 400 with the reason; nothing a client sends yields a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gpushare.allocator.admission import ADMISSION_PATH, AdmissionReviewer, too_large_review
from gpushare.allocator.admission_mutation import MUTATION_PATH, AdmissionMutator
from gpushare.allocator.asgi_reply import JSON, reply
from gpushare.allocator.assumed import AssumedPlacements
from gpushare.allocator.binding import BindFlow
from gpushare.allocator.gpu_capacity import CapacityByModel
from gpushare.allocator.inspection import inspect_cluster, inspect_one, unknown_node
from gpushare.allocator.limits import BodyLimit
from gpushare.allocator.metrics import CONTENT_TYPE, AllocatorMetrics
from gpushare.allocator.placing import Placer
from gpushare.allocator.pod_cache import PodCache
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.tls import ARRIVED, FORBIDDEN, ClientCertificateGate, client_verified
from gpushare.allocator.verbs import ExtenderVerbs
from gpushare.allocator.wire import (
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    WireError,
    decode,
    encode,
)
from gpushare.bus.decisions import Recorder
from gpushare.bus.follow import LogFollower
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.dra_claims import ClaimSpecs
from gpushare.core.policies import policy_names
from gpushare.core.ports import AllocationLog, Clock, PodSource
from gpushare.telemetry.extender import bind_span
from gpushare.telemetry.pods import fail
from gpushare.telemetry.propagation import attached, extract_headers

log = logging.getLogger(__name__)

BAD_REQUEST = 400
NOT_FOUND = 404
UNAVAILABLE = 503

Answer = Callable[[bytes], Awaitable[bytes]]


@dataclass(frozen=True, kw_only=True)
class Allocator:
    """The pieces behind one app, kept on ``app.state.allocator`` for tests and benchmarks."""

    follower: LogFollower
    settings: AllocatorSettings
    verbs: ExtenderVerbs
    bind_flow: BindFlow
    pods: PodCache
    metrics: AllocatorMetrics
    clock: Clock


VERBS = ("filter", "prioritize", "prioritize-claims", "bind")
"""kube-scheduler's verbs; ``prioritize-claims`` scores DRA pods (``docs/dra.md``)."""


def _json(value: object, status: int = 200) -> Response:
    return Response(content=encode(value), status_code=status, media_type=JSON)


def _fallback(verb: str, error: Exception) -> bytes:
    """What a verb answers when the allocator itself fails (kube-scheduler then retries)."""
    message = f"gpushare allocator internal error: {error}"
    if verb == "filter":
        return encode(ExtenderFilterResult(error=message))
    if verb == "bind":
        return encode(ExtenderBindingResult(error=message))
    return b"[]"  # prioritize errors are ignored by kube-scheduler anyway


async def _answer(
    verb: str, request: Request, answer: Answer, metrics: AllocatorMetrics
) -> Response:
    """One verb through FastAPI: the admission webhooks. (The three extender verbs are
    registered too, but :class:`ExtenderApp` answers their POSTs before FastAPI sees them.)"""
    content, status = await _respond(verb, await request.body(), request.headers, answer, metrics)
    return Response(content=content, status_code=status, media_type=JSON)


async def _respond(
    verb: str,
    body: bytes,
    headers: Mapping[str, str],
    answer: Answer,
    metrics: AllocatorMetrics,
    *,
    arrived: float | None = None,
) -> tuple[bytes, int]:
    """Time one verb (and its wait since its bytes ``arrived``, when known) and map its
    failures to HTTP: 400 for bad bodies, never a 500."""
    started = time.perf_counter()
    if arrived is not None:
        metrics.queued.labels(verb).observe(started - arrived)
    try:
        with attached(extract_headers(headers)):  # a caller's traceparent wins
            content = await answer(body)
        status = 200
    except WireError as error:
        metrics.bad_requests.labels(verb).inc()
        log.info("%s: 400 %s", verb, error)
        content, status = encode({"Error": f"malformed {verb} request: {error}"}), BAD_REQUEST
    except Exception as error:
        log.exception("%s failed", verb)
        content, status = _fallback(verb, error), 200
    metrics.latency.labels(verb).observe(time.perf_counter() - started)
    return content, status


class ExtenderApp(FastAPI):
    """FastAPI, with kube-scheduler's three verbs answered ahead of Starlette's stack.

    A scheduling cycle calls filter and prioritize one after the other, so their overhead
    is the scheduler's: through Starlette (its error and exception middleware, routing,
    ``Request``/``Response`` objects) each call cost about as much as the verb itself
    (``make bench-kube``'s profile). ``POST`` to a verb's path goes through the same ASGI
    guards as every other request (the client-certificate gate when configured, the body
    limit) straight to :func:`_respond`; everything else is FastAPI's.
    """

    verb_routes: Mapping[str, ASGIApp] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            route = self.verb_routes.get(scope.get("path", ""))
            if route is not None:
                await route(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _raw_verb(verb: str, answer: Answer, metrics: AllocatorMetrics) -> ASGIApp:
    """The ASGI app of one verb: the body (already read whole by ``BodyLimit``) in, JSON out."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        headers = {
            key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]
        }
        arrived = (scope.get("state") or {}).get(ARRIVED)
        content, status = await _respond(
            verb, b"".join(chunks), headers, answer, metrics, arrived=arrived
        )
        await reply(send, status, content)

    return app


def _build(
    follower: LogFollower,
    settings: AllocatorSettings,
    *,
    appender: AllocationLog,
    pod_source: PodSource | None,
    clock: Clock,
    metrics: AllocatorMetrics,
    decisions: Recorder | None,
    claim_specs: ClaimSpecs | None,
) -> Allocator:
    pods = PodCache(settings.pod_cache_size)
    capacity = CapacityByModel()
    follower.listen(capacity.changed)
    placer = Placer(settings, capacity=lambda: capacity.capacity(follower.state))
    assumed = AssumedPlacements()  # filter's plans, which bind keeps
    verbs = ExtenderVerbs(
        follower,
        settings,
        pods=pods,
        metrics=metrics,
        clock=clock,
        placer=placer,
        decisions=decisions,
        claim_specs=claim_specs,
        assumed=assumed,
    )
    bind_flow = BindFlow(
        follower,
        settings,
        log=appender,
        pods=pods,
        metrics=metrics,
        clock=clock,
        pod_source=pod_source,
        placer=placer,
        assumed=assumed,
    )
    return Allocator(
        follower=follower,
        settings=settings,
        verbs=verbs,
        bind_flow=bind_flow,
        pods=pods,
        metrics=metrics,
        clock=clock,
    )


def create_app(
    follower: LogFollower,
    settings: AllocatorSettings | None = None,
    *,
    log: AllocationLog | None = None,
    pod_source: PodSource | None = None,
    clock: Clock = SYSTEM_CLOCK,
    metrics: AllocatorMetrics | None = None,
    decisions: Recorder | None = None,
    claim_specs: ClaimSpecs | None = None,
) -> FastAPI:
    """The extender app over a started :class:`LogFollower`.

    ``log`` is where reservations are appended (default: the follower's stream);
    ``pod_source`` lets bind read pods that filter never saw; ``clock`` dates decisions;
    ``decisions`` records each filter and prioritize call for ``gpushare explain``;
    ``claim_specs`` reads DRA claims, so ``prioritize-claims`` scores pods that ask our
    DeviceClass.
    Every endpoint reads at most ``settings.max_body_bytes`` of a body (413 beyond; the
    admission webhooks answer an AdmissionReview that denies instead).
    """
    settings = settings or AllocatorSettings()
    allocator = _build(
        follower,
        settings,
        appender=log or follower.log,
        pod_source=pod_source,
        clock=clock,
        metrics=metrics or AllocatorMetrics(),
        decisions=decisions,
        claim_specs=claim_specs,
    )
    app = ExtenderApp(
        title="gpushare allocator",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # FastAPI's own request spans would start a new trace per HTTP call (kube-scheduler
        # sends no traceparent); the verbs' spans join the pod's trace instead.
        telemetry={"tracing": False, "operation_spans": False},
    )
    app.state.allocator = allocator
    prefix = settings.url_prefix.rstrip("/")
    admission_path = f"{prefix}{ADMISSION_PATH}"
    mutation_path = f"{prefix}{MUTATION_PATH}"
    verbs_by_path = {f"{prefix}/{verb}": verb for verb in VERBS}
    verbs_by_path[admission_path] = "admission"
    verbs_by_path[mutation_path] = "mutation"

    def oversized(path: str) -> None:
        if path in verbs_by_path:
            allocator.metrics.bad_requests.labels(verbs_by_path[path]).inc()

    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        refusals={admission_path: too_large_review, mutation_path: too_large_review},
        observe=oversized,
    )
    allocator.metrics.watch(follower, cards=settings.card_metrics)
    answers = _add_verbs(app, allocator)
    _add_inspection(app, allocator)
    _add_health(app, allocator)
    guarded: dict[str, ASGIApp] = {}
    for verb, answer in answers.items():
        route: ASGIApp = BodyLimit(
            _raw_verb(verb, answer, allocator.metrics),
            max_bytes=settings.max_body_bytes,
            observe=oversized,
        )
        if _client_ca(settings):
            route = ClientCertificateGate(route)
        guarded[f"{prefix}/{verb}"] = route
    app.verb_routes = guarded
    return app


def _client_ca(settings: AllocatorSettings) -> bool:
    """Whether requests need a verified client certificate (``--tls-client-ca-file``)."""
    return settings.tls is not None and bool(settings.tls.client_ca_file)


def _add_verbs(app: FastAPI, allocator: Allocator) -> dict[str, Answer]:
    prefix = allocator.settings.url_prefix.rstrip("/")
    verbs, metrics = allocator.verbs, allocator.metrics

    async def filter_(body: bytes) -> bytes:
        return verbs.filter(body)

    async def prioritize(body: bytes) -> bytes:
        return verbs.prioritize(body)

    async def prioritize_claims(body: bytes) -> bytes:
        return verbs.prioritize_claims(body)

    async def bind(body: bytes) -> bytes:
        args = decode(body, ExtenderBindingArgs)
        with bind_span(args.pod_namespace, args.pod_name, args.pod_uid, args.node) as span:
            result = await allocator.bind_flow.bind(args)
            if result.error:
                fail(span, result.error)
        return encode(result)

    answers: dict[str, Answer] = {
        "filter": filter_,
        "prioritize": prioritize,
        "prioritize-claims": prioritize_claims,
        "bind": bind,
    }
    for verb, answer in answers.items():
        endpoint = _endpoint(verb, answer, metrics)
        app.add_api_route(f"{prefix}/{verb}", endpoint, methods=["POST"], name=verb)
    reviewer = AdmissionReviewer(allocator.settings, metrics, policy_names())
    admission = _endpoint("admission", reviewer.answer, metrics)
    app.add_api_route(f"{prefix}{ADMISSION_PATH}", admission, methods=["POST"], name="admission")
    mutation = _endpoint("mutation", AdmissionMutator(metrics).answer, metrics)
    app.add_api_route(f"{prefix}{MUTATION_PATH}", mutation, methods=["POST"], name="mutation")
    return answers


def _endpoint(
    verb: str, answer: Answer, metrics: AllocatorMetrics
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await _answer(verb, request, answer, metrics)

    return endpoint


def _add_inspection(app: FastAPI, allocator: Allocator) -> None:
    """``GET .../inspect``, and who may call what.

    With a client CA every endpoint needs a verified client certificate (403 without one)
    except the probes, ``/metrics`` (card and node names, no pod) and the admission
    webhooks (they judge or rewrite only the pod they are sent, and kube-apiserver
    presents no certificate unless configured to). ``/inspect`` lists every pod: a
    verified client may read it, anyone else only with ``--inspect-open``.
    """
    settings = allocator.settings
    prefix = settings.url_prefix.rstrip("/")
    follower = allocator.follower
    inspect_path = f"{prefix}/inspect"
    if _client_ca(settings):
        app.add_middleware(
            ClientCertificateGate,
            open_paths={
                "/healthz",
                "/readyz",
                "/metrics",
                f"{prefix}{ADMISSION_PATH}",
                f"{prefix}{MUTATION_PATH}",
            },
            open_prefixes=[inspect_path] if settings.inspect_open else [],
        )

    def refused(request: Request) -> Response | None:
        if settings.inspect_open or client_verified(request.scope):
            return None
        reason = (
            "inspection lists every pod: it needs a client certificate signed by the "
            "allocator's client CA (--tls-client-ca-file), or --inspect-open"
        )
        return _json({"error": reason}, FORBIDDEN)

    unit = settings.memory_unit

    @app.get(inspect_path)
    async def inspect_all(request: Request) -> Response:
        """Aliyun's ``{"nodes": [...]}`` (:mod:`gpushare.allocator.inspection`)."""
        now = allocator.clock.now()
        return refused(request) or _json(inspect_cluster(follower.state, now, unit))

    @app.get(f"{inspect_path}/{{node}}")
    async def inspect_node(request: Request, node: str) -> Response:
        """The same ``{"nodes": [node]}``; 404 ``{"nodes": [], "error"}`` if unknown."""
        if denied := refused(request):
            return denied
        found = inspect_one(follower.state, node, allocator.clock.now(), unit)
        return _json(unknown_node(node), NOT_FOUND) if found is None else _json(found)


def _add_health(app: FastAPI, allocator: Allocator) -> None:
    follower = allocator.follower

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        ready = follower.ready.is_set()
        body = {"ready": ready, "applied_seq": follower.applied_seq}
        return _json(body, 200 if ready else UNAVAILABLE)

    @app.get("/metrics")
    async def metrics() -> Response:
        await allocator.metrics.refresh()
        return Response(content=allocator.metrics.exposition(), media_type=CONTENT_TYPE)
