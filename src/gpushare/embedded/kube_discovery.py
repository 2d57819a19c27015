"""Discovery and health endpoints: what clients ask before anything else."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gpushare.embedded.kube_objects import RESOURCES

VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0+gpushare-stand-in",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

ALL_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
STATUS_VERBS = ["get", "patch", "update"]


async def version(_: web.Request) -> web.Response:
    return web.json_response(VERSION)


async def api_versions(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host},
            ],
        }
    )


def _resource_entries() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for resource in RESOURCES.values():
        entries.append(
            {
                "name": resource.plural,
                "singularName": resource.kind.lower(),
                "namespaced": resource.namespaced,
                "kind": resource.kind,
                "verbs": ALL_VERBS,
            }
        )
        for sub in sorted(resource.subresources):
            binding = sub == "binding"
            entries.append(
                {
                    "name": f"{resource.plural}/{sub}",
                    "singularName": "",
                    "namespaced": resource.namespaced,
                    "kind": "Binding" if binding else resource.kind,
                    "verbs": ["create"] if binding else STATUS_VERBS,
                }
            )
    entries.append(
        {
            "name": "bindings",
            "singularName": "binding",
            "namespaced": True,
            "kind": "Binding",
            "verbs": ["create"],
        }
    )
    return entries


async def api_resources(_: web.Request) -> web.Response:
    return web.json_response(
        {"kind": "APIResourceList", "groupVersion": "v1", "resources": _resource_entries()}
    )


async def api_groups(_: web.Request) -> web.Response:
    return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})


async def healthy(_: web.Request) -> web.Response:
    return web.Response(text="ok")
