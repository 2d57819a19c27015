"""The extender stanza of a real kube-scheduler's ``KubeSchedulerConfiguration``.

:class:`ExtenderStanza` defaults to what ``deploy/`` configures (filter, prioritize and
bind; ``nodeCacheCapable``; a 15 s timeout, longer than the allocator's bind wait; every
resource gpushare reads as a managed resource), so a test changes only what it is about.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.plugin_resources import DIALECTS
from gpushare.core.requests import GPU_COUNT, SHARE_RESOURCES

EXTENDER_PATH = "/gpushare-scheduler"


def extender_url(port: int, host: str = "127.0.0.1", scheme: str = "http") -> str:
    """The URL prefix of an allocator's extender API."""
    return f"{scheme}://{host}:{port}{EXTENDER_PATH}"


@dataclass(frozen=True)
class ManagedResource:
    name: str
    ignored_by_scheduler: bool = False
    """True: the in-tree fit check leaves this resource to the extender (no device plugin
    advertises it, e.g. byte quantities such as ``gpushare.io/gpu-memory``)."""


def gpushare_managed_resources() -> tuple[ManagedResource, ...]:
    """Every resource gpushare reads and the gpu-count the binder advertises, as in
    ``deploy/``: ignored by the scheduler unless some node-agent dialect advertises it.
    ``kubernetes.io/`` names are left out (the scheduler refuses them as extended)."""
    advertised = {name for names in DIALECTS.values() for name in names} | {GPU_COUNT}
    names = sorted(n for n in SHARE_RESOURCES | {GPU_COUNT} if not n.startswith("kubernetes.io/"))
    return tuple(ManagedResource(name, name not in advertised) for name in names)


@dataclass(frozen=True)
class ExtenderStanza:
    """One ``extenders:`` entry; ``https://`` URLs get ``enableHTTPS`` and ``tlsConfig``."""

    url_prefix: str
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    bind_verb: str = "bind"
    preempt_verb: str = ""
    """Empty verbs are left out (the scheduler then does that step itself)."""
    weight: int = 1
    node_cache_capable: bool = True
    managed_resources: tuple[ManagedResource, ...] = field(
        default_factory=gpushare_managed_resources
    )
    ignorable: bool = False
    http_timeout: str = "15s"
    """A Go duration; empty: the scheduler's default (5 s)."""
    tls_ca_file: Path | None = None
    """The CA that signed the extender's certificate (none: ``insecure: true``)."""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_server_name: str = ""

    @property
    def https(self) -> bool:
        return self.url_prefix.startswith("https://")

    def to_config(self) -> dict[str, object]:
        """The stanza as kube-scheduler's ``Extender`` (camelCase keys)."""
        stanza: dict[str, object] = {"urlPrefix": self.url_prefix}
        verbs = {
            "filterVerb": self.filter_verb,
            "prioritizeVerb": self.prioritize_verb,
            "bindVerb": self.bind_verb,
            "preemptVerb": self.preempt_verb,
        }
        stanza.update({key: verb for key, verb in verbs.items() if verb})
        stanza.update(
            weight=self.weight,
            enableHTTPS=self.https,
            nodeCacheCapable=self.node_cache_capable,
            ignorable=self.ignorable,
        )
        if self.http_timeout:
            stanza["httpTimeout"] = self.http_timeout
        if self.https:
            stanza["tlsConfig"] = self._tls_config()
        if self.managed_resources:
            stanza["managedResources"] = [
                {"name": r.name, "ignoredByScheduler": r.ignored_by_scheduler}
                for r in self.managed_resources
            ]
        return stanza

    def _tls_config(self) -> dict[str, object]:
        files = {
            "caFile": self.tls_ca_file,
            "certFile": self.tls_cert_file,
            "keyFile": self.tls_key_file,
        }
        tls: dict[str, object] = {key: str(path) for key, path in files.items() if path}
        if self.tls_server_name:
            tls["serverName"] = self.tls_server_name
        if self.tls_ca_file is None:
            tls["insecure"] = True
        return tls


def extenders_flow_list(extenders: Sequence[ExtenderStanza]) -> str:
    """The ``extenders:`` value as one line of JSON (YAML's flow style), for k8s-up.sh."""
    return json.dumps([extender.to_config() for extender in extenders])
