"""The HTTP face of the stand-in: discovery, CRUD, patch, watch, binding, test hooks.

Every ``/api/v1/...`` request goes through :func:`ApiHandlers.dispatch`, which parses the
path (:mod:`kube_paths`), applies the registry strategy (:mod:`kube_objects`) and
writes to the store (:mod:`kube_store`). Failures are ``v1 Status`` bodies.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gpushare.embedded import kube_custom, kube_discovery
from gpushare.embedded.kube_faults import FaultInjector, rule_from_json
from gpushare.embedded.kube_objects import (
    bind_pod,
    check_delete_preconditions,
    grace_period,
    list_item,
    mark_deleted,
    prepare_create,
    prepare_update,
    unchanged,
)
from gpushare.embedded.kube_patch import apply_patch
from gpushare.embedded.kube_paths import Target, parse_target
from gpushare.embedded.kube_selectors import selector
from gpushare.embedded.kube_status import (
    StatusError,
    already_exists,
    bad_request,
    not_found,
    success,
)
from gpushare.embedded.kube_store import ObjectStore
from gpushare.embedded.kube_watch import WatchRequest, serve_watch

log = logging.getLogger(__name__)

HOOKS_PREFIX = "/_gpushare/"


def respond(body: Any, status: int = 200) -> web.Response:
    return web.json_response(
        body, status=status, dumps=lambda o: json.dumps(o, separators=(",", ":"))
    )


async def read_json(request: web.Request, required: bool = True) -> Any:
    raw = await request.read()
    if not raw:
        if required:
            raise bad_request("the request has no body")
        return None
    try:
        return json.loads(raw)
    except ValueError:
        if "yaml" not in request.content_type:
            raise bad_request("the body of the request is not valid JSON") from None
    import yaml  # server-side apply bodies may be YAML; PyYAML comes with the kubernetes client

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        raise bad_request("the body of the request is not valid YAML") from None


class ApiHandlers:
    def __init__(self, store: ObjectStore, faults: FaultInjector) -> None:
        self.store = store
        self.faults = faults

    def routes(self) -> list[web.RouteDef]:
        return [
            *[web.get(path, kube_discovery.version) for path in ("/version", "/version/")],
            *[web.get(path, kube_discovery.api_versions) for path in ("/api", "/api/")],
            *[web.get(path, kube_discovery.api_resources) for path in ("/api/v1", "/api/v1/")],
            *[web.get(path, self.api_groups) for path in ("/apis", "/apis/")],
            web.get("/healthz", kube_discovery.healthy),
            web.get("/livez", kube_discovery.healthy),
            web.get("/readyz", kube_discovery.healthy),
            web.route("*", "/_gpushare/faults", self.faults_hook),
            web.get("/_gpushare/requests", self.requests_hook),
            web.route("*", "/api/v1/{tail:.+}", self.dispatch),
            web.route("*", "/apis/{tail:.+}", self.dispatch_group),
            web.route("*", "/{tail:.*}", self.unknown),
        ]

    async def unknown(self, request: web.Request) -> web.Response:
        raise StatusError(404, "the server could not find the requested resource")

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        hook = request.path.startswith(HOOKS_PREFIX)
        try:
            fault = None if hook else self.faults.take(request.method, request.path)
            if fault is not None:
                raise fault
            response: web.StreamResponse = await handler(request)
        except StatusError as error:
            response = respond(error.body(), error.code)
        except web.HTTPException:
            raise
        except Exception as error:
            log.exception("kube-api: %s %s failed", request.method, request.path)
            response = respond(StatusError(500, f"internal error: {error}").body(), 500)
        if not hook:
            self.faults.record(request.method, request.path, response.status, request.query_string)
        return response

    async def api_groups(self, _: web.Request) -> web.Response:
        return respond(kube_custom.api_groups(self.store))

    async def dispatch_group(self, request: web.Request) -> web.StreamResponse:
        """``/apis/<group>/<version>/...``: CRDs and the custom resources they define."""
        parts = [part for part in request.match_info["tail"].split("/") if part]
        if len(parts) < 3:
            if request.method != "GET":
                raise StatusError(405, f"the server does not allow this method: {request.method}")
            return respond(kube_custom.group_discovery(self.store, parts))
        return await self.serve(request, kube_custom.parse_group_target(self.store, parts))

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, parse_target(request.match_info["tail"]))

    async def serve(self, request: web.Request, target: Target) -> web.StreamResponse:
        verb = request.method
        if target.legacy_binding or target.subresource == "binding":
            if verb != "POST":
                raise StatusError(405, f"the server does not allow this method: {verb}")
            return await self.bind(request, target)
        if target.is_collection:
            if verb == "GET":
                return await self.list_or_watch(request, target)
            if verb == "POST":
                return await self.create(request, target)
        elif verb == "GET":
            obj = self.store.get(*self.key(target))
            table = self.as_table(request, target, [obj])
            return respond(obj) if table is None else table
        elif verb in {"PUT", "PATCH"}:
            return await self.update(request, target)
        elif verb == "DELETE" and not target.subresource:
            return await self.delete(request, target)
        raise StatusError(
            405, f"the server does not allow this method on the requested resource: {verb}"
        )

    def as_table(
        self, request: web.Request, target: Target, objects: list[dict[str, Any]]
    ) -> web.Response | None:
        """kubectl's Table of custom resources (their printer columns); None otherwise."""
        accept = request.headers.get("Accept", "")
        if not target.resource.group or not kube_custom.wants_table(accept):
            return None
        now = datetime.now(UTC)
        return respond(kube_custom.table(self.store, target.resource, objects, now))

    @staticmethod
    def key(target: Target) -> tuple[str, str, str]:
        return target.resource.plural, target.namespace, target.name

    async def list_or_watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        query = request.query
        plural = target.resource.plural
        predicate = selector(plural, query.get("labelSelector"), query.get("fieldSelector"))
        if query.get("watch") in {"true", "1"}:
            timeout = query.get("timeoutSeconds", "")
            if timeout and not timeout.isdigit():
                raise bad_request(f"invalid timeoutSeconds: {timeout!r}")
            watch = WatchRequest(
                resource=target.resource,
                namespace=target.namespace,
                predicate=predicate,
                resource_version=query.get("resourceVersion", ""),
                timeout_seconds=float(timeout) if timeout else None,
                bookmarks=query.get("allowWatchBookmarks") in {"true", "1"},
            )
            return await serve_watch(request, self.store, watch)
        found = [o for o in self.store.objects_of(plural, target.namespace or None) if predicate(o)]
        table = self.as_table(request, target, found)
        if table is not None:
            return table
        revision, start = self.store.revision, 0
        if query.get("continue"):
            revision, start = continued(query["continue"])
        limit = page_limit(query.get("limit", ""))
        end = start + limit if limit else len(found)
        metadata: dict[str, Any] = {"resourceVersion": str(revision)}
        if end < len(found):
            metadata["continue"] = continue_token(revision, end)
            if not query.get("labelSelector") and not query.get("fieldSelector"):
                metadata["remainingItemCount"] = len(found) - end  # unknown with selectors
        return respond(
            {
                "kind": f"{target.resource.kind}List",
                "apiVersion": target.resource.api_version,
                "metadata": metadata,
                "items": [list_item(obj) for obj in found[start:end]],
            }
        )

    def require_namespace(self, namespace: str) -> None:
        if namespace and self.store.find("namespaces", "", namespace) is None:
            raise not_found("namespaces", namespace)

    async def create(self, request: web.Request, target: Target) -> web.Response:
        self.require_namespace(target.namespace)
        obj = prepare_create(target.resource, await read_json(request), target.namespace)
        if target.resource.group:
            obj = kube_custom.prepare_custom_create(self.store, target.resource, obj)
        name = obj["metadata"]["name"]
        if self.store.find(target.resource.plural, target.namespace, name) is not None:
            raise already_exists(target.resource.plural, name)
        return respond(self.store.write(target.resource.plural, obj), 201)

    async def update(self, request: web.Request, target: Target) -> web.Response:
        old = self.store.get(*self.key(target))
        body = await read_json(request)
        if request.method == "PATCH":
            body = apply_patch(request.content_type, old, body)
        new = prepare_update(target.resource, old, body, target.subresource)
        if target.resource.group:
            new = kube_custom.prepare_custom_update(
                self.store, target.resource, old, new, target.subresource
            )
        return respond(self.store_update(target, old, new))

    def store_update(
        self, target: Target, old: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        """Write ``new`` unless it changes nothing; finish a deletion its finalizers held up."""
        if unchanged(old, new):
            return old
        meta = new["metadata"]
        finished = meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers")
        if meta.get("deletionTimestamp") and finished:
            return self.store.delete(*self.key(target))
        return self.store.write(target.resource.plural, new)

    async def delete(self, request: web.Request, target: Target) -> web.Response:
        """Graceful for pods on a node, held up by finalizers, otherwise at once."""
        plural = target.resource.plural
        obj = self.store.get(*self.key(target))
        options = await read_json(request, required=False)
        check_delete_preconditions(plural, obj, options)
        grace = grace_period(plural, obj, options, request.query.get("gracePeriodSeconds"))
        meta = obj["metadata"]
        if grace > 0 or meta.get("finalizers"):
            current = meta.get("deletionGracePeriodSeconds")
            if current is not None and current <= grace:
                return respond(obj)  # already terminating, at least as soon
            return respond(self.store.write(plural, mark_deleted(obj, grace)))
        if plural == "namespaces":
            self.empty_namespace(target.name)
        if target.resource is kube_custom.CRDS:
            kube_custom.forget_objects(self.store, obj)
        return respond(self.store.delete(*self.key(target)))

    def empty_namespace(self, namespace: str) -> None:
        for plural, ns, name in list(self.store.objects):
            if ns == namespace:
                self.store.delete(plural, ns, name)

    async def bind(self, request: web.Request, target: Target) -> web.Response:
        binding = await read_json(request)
        url_name = None if target.legacy_binding else target.name
        meta = binding.get("metadata") if isinstance(binding, dict) else None
        name = target.name or (meta or {}).get("name") or ""
        pod = self.store.get("pods", target.namespace, name)
        self.store.write("pods", bind_pod(pod, binding, url_name))
        return respond(success(201), 201)

    async def faults_hook(self, request: web.Request) -> web.Response:
        """``POST`` adds a rule, ``DELETE`` clears them all, ``GET`` lists them."""
        if request.method == "POST":
            try:
                self.faults.add(rule_from_json(await read_json(request)))
            except re.error as error:
                raise bad_request(f"bad path pattern: {error}") from None
        elif request.method == "DELETE":
            self.faults.clear()
        elif request.method != "GET":
            raise StatusError(405, "GET, POST or DELETE")
        return respond({"faults": self.faults.describe()})

    async def requests_hook(self, request: web.Request) -> web.Response:
        records = self.faults.requests(
            request.query.get("verb", "*").upper(), request.query.get("path", "")
        )
        return respond({"requests": [vars(record) for record in records]})


# -- paged lists (``limit`` and ``continue``) ------------------------------------------
# The pages are of the objects as they are when each page is asked, at the first page's
# resourceVersion: kube-apiserver serves a consistent snapshot; tests of the stand-in do
# not change what they page through.


def page_limit(text: str) -> int:
    """``limit``: 0 (or absent) for everything."""
    if not text:
        return 0
    if not text.isdigit():
        raise bad_request(f"invalid limit: {text!r}")
    return int(text)


def continue_token(revision: int, start: int) -> str:
    raw = json.dumps({"rv": revision, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def continued(token: str) -> tuple[int, int]:
    """The revision and the offset a ``continue`` token names."""
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(fields["rv"]), int(fields["start"])
    except (ValueError, KeyError, TypeError) as error:
        raise bad_request(f"continue key is not valid: {error}") from error
