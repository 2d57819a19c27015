"""A stand-in for the Kubernetes API server: stateful, in memory, over real HTTP.

The official ``kubernetes`` client talks to it unchanged (``/api/v1`` pods, nodes,
namespaces, watches, patches, ``pods/{name}/binding``, ``/status``, resourceVersion
conflicts), so gpushare's services and tests exercise the same calls as against a real
cluster. Own aiohttp server rather than kmock: kmock lacks resourceVersions, selectors,
subresources and status strategies, which are most of what the binder relies on.

In process (tests)::

    server = await KubeApiServer().start()
    server.create_node("gpu-a", capacity={"aliyun.com/gpu-mem": "32000"})
    server.create_pod({"metadata": {"name": "p"}, "spec": {...}}, namespace="ns")
    server.fail_next("POST", r"/binding$", 500)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    ...
    await server.stop()

As a process: ``gpushare kube-api --port 6443 --kubeconfig-out ./kubeconfig`` prints the
kubeconfig's path once it is listening, and runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from gpushare.embedded.kube_custom import CRDS, prepare_custom_create
from gpushare.embedded.kube_faults import FaultInjector, FaultRule, RequestRecord
from gpushare.embedded.kube_objects import RESOURCES, prepare_create, prepare_update
from gpushare.embedded.kube_routes import ApiHandlers
from gpushare.embedded.kube_store import ObjectStore

log = logging.getLogger(__name__)

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
CONTEXT = "gpushare-stand-in"


class KubeApiServer:
    """The stand-in, for one event loop. ``start()`` and ``stop()`` are async."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, history_size: int = 10_000) -> None:
        self.host = host
        self.port = port
        self.store = ObjectStore(history_size)
        self.faults = FaultInjector()
        self._handlers = ApiHandlers(self.store, self.faults)
        self._runner: web.AppRunner | None = None
        for namespace in SYSTEM_NAMESPACES:
            self.create_namespace(namespace)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> KubeApiServer:
        app = web.Application(middlewares=[self._handlers.middleware])
        app.add_routes(self._handlers.routes())
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        log.info("kube-api stand-in listening on %s", self.url)
        return self

    async def stop(self) -> None:
        self.store.close_subscriptions()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeApiServer:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    # --- test hooks -------------------------------------------------------------------

    def fail_next(
        self, verb: str, path_pattern: str, status: int, message: str = "", times: int = 1
    ) -> None:
        """Answer the next ``times`` ``verb`` requests whose path matches the regex with
        ``status`` (a Status body with ``message``), before they touch any state."""
        self.faults.add(FaultRule(verb.upper(), path_pattern, status, message, times=times))

    def requests(
        self, verb: str = "*", path_pattern: str = "", status: int | None = None
    ) -> list[RequestRecord]:
        """The requests served so far that match (for "bound exactly once" assertions)."""
        return self.faults.requests(verb.upper(), path_pattern, status)

    # --- direct state access (no HTTP; same strategies, watchers see the changes) -----

    def create_namespace(self, name: str) -> dict[str, Any]:
        existing = self.store.find("namespaces", "", name)
        if existing is not None:
            return existing
        body = {"metadata": {"name": name}}
        return self.store.write("namespaces", prepare_create(RESOURCES["namespaces"], body, ""))

    def create_node(
        self,
        name: str,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"metadata": {"name": name, "labels": dict(labels or {})}}
        body["status"] = {"capacity": dict(capacity or {}), "conditions": [_ready()]}
        return self.store.write("nodes", prepare_create(RESOURCES["nodes"], body, ""))

    def create_pod(self, manifest: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
        """Create a pod (its namespace too, if missing), as a POST would store it."""
        self.create_namespace(namespace)
        pod = prepare_create(RESOURCES["pods"], dict(manifest), namespace)
        return self.store.write("pods", pod)

    def install_crd(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create a CustomResourceDefinition, as a POST would; its resource is served at once
        (``get("devices.gpushare.io", name)`` reads its objects)."""
        crd = prepare_create(CRDS, dict(manifest), "")
        return self.store.write(CRDS.plural, prepare_custom_create(self.store, CRDS, crd))

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        return self.store.find(plural, namespace, name)

    def delete(self, plural: str, name: str, namespace: str = "") -> dict[str, Any]:
        return self.store.delete(plural, namespace, name)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any]:
        """What the kubelet reports through ``pods/status``."""
        pod = self.store.get("pods", namespace, name)
        status = {**pod.get("status", {}), "phase": phase}
        updated = prepare_update(RESOURCES["pods"], pod, {**pod, "status": status}, "status")
        return self.store.write("pods", updated)

    # --- kubeconfig ---------------------------------------------------------------------

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig for this server (plain HTTP, no credentials)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": CONTEXT, "cluster": {"server": self.url}}],
            "users": [{"name": CONTEXT, "user": {}}],
            "contexts": [
                {
                    "name": CONTEXT,
                    "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"},
                }
            ],
            "current-context": CONTEXT,
        }

    def write_kubeconfig(self, path: Path) -> Path:
        """Write it atomically (JSON is YAML), so a reader never sees half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(self.kubeconfig(), indent=2))
        os.replace(temporary, path)
        return path


def _ready() -> dict[str, str]:
    return {"type": "Ready", "status": "True", "reason": "KubeletReady"}


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="gpushare kube-api", description=__doc__.split("\n\n")[0])
    parse.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parse.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    parse.add_argument(
        "--kubeconfig-out",
        type=Path,
        help="where to write a kubeconfig for this server (default: a new temporary file)",
    )
    parse.add_argument(
        "--node", action="append", default=[], metavar="NAME", help="create this Node (repeatable)"
    )
    parse.add_argument(
        "--crd",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="install this CustomResourceDefinition (YAML; repeatable)",
    )
    return parse


async def serve(args: argparse.Namespace) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    server = await KubeApiServer(args.host, args.port).start()
    try:
        for node in args.node:
            server.create_node(node)
        for path in args.crd:
            import yaml  # PyYAML comes with the kubernetes client

            server.install_crd(yaml.safe_load(path.read_text()))
        out = args.kubeconfig_out or Path(tempfile.mkdtemp(prefix="gpushare-kube-")) / "kubeconfig"
        print(server.write_kubeconfig(out.resolve()), flush=True)
        await stopping.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    from gpushare.logs import setup_logging

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging("kube-api")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
