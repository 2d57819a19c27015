"""What a kubectl plugin needs from the API: kubectl's connection flags, and node addresses.

kubectl hands a plugin its own flags (``kubectl gpushare --context prod -n ml``) and its
environment (``KUBECONFIG``); :func:`connect_like_kubectl` reads them as kubectl does:
``--kubeconfig``, else ``KUBECONFIG`` (a path list, merged), else ``~/.kube/config``;
``--context`` (else the current one), with ``--cluster``, ``--user`` and ``--server``
overriding what that context names. The namespace is ``-n``, else the context's, else
``default``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml
from kubernetes import client, config

from gpushare.kube.client import REQUEST_TIMEOUT, KubeClient

DEFAULT_KUBECONFIG = Path("~/.kube/config")
INTERNAL_IP = "InternalIP"

_from_dict: Any = config.load_kube_config_from_dict  # untyped upstream


class KubeconfigError(Exception):
    """The kubeconfig (or the flags) name no usable cluster; the message says why."""


@dataclass(frozen=True)
class KubectlFlags:
    """kubectl's global connection flags (empty: not given)."""

    kubeconfig: str = ""
    context: str = ""
    cluster: str = ""
    user: str = ""
    server: str = ""
    namespace: str = ""


def kubeconfig_paths(flags: KubectlFlags, environ: Mapping[str, str]) -> str:
    """What kubectl reads: ``--kubeconfig``, else ``KUBECONFIG``, else ``~/.kube/config``."""
    return flags.kubeconfig or environ.get("KUBECONFIG", "") or str(DEFAULT_KUBECONFIG)


def merge_kubeconfigs(paths: list[str]) -> dict[str, Any]:
    """kubectl's merge of a ``KUBECONFIG`` list: the first file to name a cluster, user or
    context (or to set ``current-context``) wins."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": []}
    for path in paths:
        loaded = yaml.safe_load(Path(path).expanduser().read_text()) or {}
        if not isinstance(loaded, dict):
            raise KubeconfigError(f"{path} is not a kubeconfig")
        for key in ("clusters", "users", "contexts"):
            for entry in loaded.get(key) or []:
                if isinstance(entry, dict) and _named(merged[key], entry.get("name")) is None:
                    merged[key].append(entry)
        if loaded.get("current-context") and not merged.get("current-context"):
            merged["current-context"] = loaded["current-context"]
    return merged


def _named(entries: Any, name: Any) -> dict[str, Any] | None:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def _chosen(raw: dict[str, Any], flags: KubectlFlags) -> tuple[dict[str, Any], str, str]:
    """The kubeconfig with the context to use (flags applied), its name, its namespace."""
    merged = copy.deepcopy(raw)
    name = flags.context or str(merged.get("current-context") or "")
    if not name:
        raise KubeconfigError("the kubeconfig has no current context: pass --context NAME")
    context = _named(merged.get("contexts"), name)
    if context is None:
        raise KubeconfigError(f"context {name!r} is not in the kubeconfig")
    fields = context.setdefault("context", {})
    for key, value in (("cluster", flags.cluster), ("user", flags.user)):
        if value:
            if _named(merged.get(f"{key}s"), value) is None:
                raise KubeconfigError(f"{key} {value!r} is not in the kubeconfig")
            fields[key] = value
    merged["current-context"] = name
    return merged, name, str(fields.get("namespace") or "")


def connect_like_kubectl(
    flags: KubectlFlags,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = REQUEST_TIMEOUT[0],
) -> tuple[KubeClient, str]:
    """A client for the cluster kubectl would talk to with these flags (``timeout_s`` to
    connect, no retries: a command says at once that the API is not there), and the
    namespace (``-n``, else the context's, else ``default``). Raises
    :class:`KubeconfigError`."""
    environ = os.environ if environ is None else environ
    paths = kubeconfig_paths(flags, environ)
    existing = [p for p in paths.split(os.pathsep) if p and Path(p).expanduser().exists()]
    if not existing:
        raise KubeconfigError(f"no kubeconfig at {paths} (pass --kubeconfig FILE)")
    try:
        merged, context, namespace = _chosen(merge_kubeconfigs(existing), flags)
        configuration = client.Configuration()
        base = str(Path(existing[0]).expanduser().resolve().parent / "kubeconfig")
        _from_dict(
            merged,
            context=context,
            client_configuration=configuration,
            persist_config=False,
            temp_file_path=base,
        )
    except KubeconfigError:
        raise
    except Exception as error:  # the loader's ConfigException, YAML errors, bad files
        raise KubeconfigError(f"cannot use the kubeconfig {paths}: {error}") from None
    if flags.server:
        configuration.host = flags.server
    configuration.retries = 0
    kube = KubeClient(client.ApiClient(configuration), timeout=(timeout_s, REQUEST_TIMEOUT[1]))
    return kube, flags.namespace or namespace or "default"


class _Address(msgspec.Struct, frozen=True):
    type: str = ""
    address: str = ""


class _Status(msgspec.Struct, frozen=True):
    addresses: tuple[_Address, ...] | None = None


class _Meta(msgspec.Struct, frozen=True):
    name: str = ""


class _Node(msgspec.Struct, frozen=True):
    metadata: _Meta = _Meta()
    status: _Status | None = None


class _NodeList(msgspec.Struct, frozen=True):
    items: tuple[_Node, ...] = ()


_node_list = msgspec.json.Decoder(_NodeList)


def internal_ip(node: _Node) -> str:
    """The node's first ``InternalIP`` (kubectl-inspect-gpushare's IPADDRESS), else ""."""
    addresses = (node.status.addresses if node.status else None) or ()
    return next((a.address for a in addresses if a.type == INTERNAL_IP and a.address), "")


async def node_addresses(kube: KubeClient) -> dict[str, str]:
    """Each node's ``InternalIP`` by node name (a node without one is left out)."""
    raw = await kube.call_raw(kube.core.list_node)
    nodes = _node_list.decode(raw.body).items
    return {node.metadata.name: ip for node in nodes if (ip := internal_ip(node))}
