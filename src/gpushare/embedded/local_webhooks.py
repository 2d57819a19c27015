"""The admission webhooks of ``gpushare up`` on a real control plane.

``deploy/`` installs two webhooks in front of pod creation: the validating one refuses a
pod gpushare could never serve, with the rule it breaks, and the mutating one renames seed
002's ``kubernetes.io/gpu*`` names to ``gpushare.io/gpu*`` (kube-scheduler counts
``kubernetes.io`` names itself and no device plugin may serve them, so without it such a
pod waits Pending for ever). A local stack runs the same two: ``deploy/``'s
configurations, each webhook pointed at a ``webhook`` allocator replica on 127.0.0.1 over
HTTPS (kube-apiserver calls webhooks over HTTPS only), with a CA of its own made at each
start and given as the ``caBundle``. Only a source checkout has ``deploy/``; without it
there are no webhooks, as there is no CRD (``gpushare.cli.stack.CRDS_DIR``).
"""

from __future__ import annotations

import base64
import copy
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpushare.embedded.secure_bus import issue_certificates

WEBHOOK_DIR = Path(__file__).resolve().parents[3] / "deploy" / "base" / "webhook"
"""``deploy/``'s webhook configurations (a source checkout's; none when absent)."""
CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


def pointed_at(manifest: dict[str, Any], base_url: str, ca_pem: bytes) -> dict[str, Any]:
    """A webhook configuration of ``deploy/`` with each webhook calling ``base_url`` (its
    Service's path appended) and trusting ``ca_pem``, instead of the Service and
    cert-manager's injected CA."""
    local = copy.deepcopy(manifest)
    annotations = local.get("metadata", {}).get("annotations") or {}
    annotations.pop(CERT_MANAGER_ANNOTATION, None)
    bundle = base64.b64encode(ca_pem).decode()
    for webhook in local.get("webhooks", ()):
        service = webhook["clientConfig"].get("service", {})
        webhook["clientConfig"] = {
            "url": f"{base_url}{service.get('path', '')}",
            "caBundle": bundle,
        }
    return local


@dataclass
class LocalWebhooks:
    """The certificate files, port and configurations of one start's webhooks."""

    directory: Path
    port: int
    ca_pem: bytes = field(repr=False)

    @classmethod
    def prepare(cls, directory: Path, port: int) -> LocalWebhooks | None:
        """A new CA and serving certificate for 127.0.0.1 in ``directory``; ``None``
        without ``deploy/``'s configurations."""
        if not WEBHOOK_DIR.is_dir():
            return None
        made = issue_certificates(datetime.now(UTC))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(made.ca_cert)
        (directory / "tls.crt").write_bytes(made.server_cert)
        key = directory / "tls.key"
        key.touch(mode=0o600)
        key.write_bytes(made.server_key)
        return cls(directory=directory, port=port, ca_pem=made.ca_cert)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def allocator_flags(self) -> list[str]:
        """What makes an allocator replica serve them: HTTPS on :attr:`port`, loopback."""
        return [
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            "--tls-cert-file",
            str(self.directory / "tls.crt"),
            "--tls-key-file",
            str(self.directory / "tls.key"),
        ]

    def manifests(self) -> list[dict[str, Any]]:
        """``deploy/``'s configurations, pointed at this stack's webhook replica."""
        return [
            pointed_at(yaml.safe_load(path.read_text()), self.base_url, self.ca_pem)
            for path in sorted(WEBHOOK_DIR.glob("*.yaml"))
        ]

    def wait_ready(self, timeout: float, check_alive: Callable[[], None]) -> None:
        """Until the replica answers ``/readyz`` over HTTPS, trusted through our CA."""
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        url = f"{self.base_url}/readyz"
        deadline = time.monotonic() + timeout
        while True:
            check_alive()
            try:
                with urllib.request.urlopen(url, timeout=1, context=context) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the webhook replica ({url}) not ready after {timeout:.0f}s")
            time.sleep(0.1)
