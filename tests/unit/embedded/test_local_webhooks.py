"""``gpushare up``'s admission webhooks are ``deploy/``'s, pointed at a local replica."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from gpushare.embedded.local_webhooks import (
    CERT_MANAGER_ANNOTATION,
    WEBHOOK_DIR,
    LocalWebhooks,
    pointed_at,
)

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_each_webhook_calls_the_local_url_with_its_service_path_and_trusts_the_ca() -> None:
    paths = sorted(WEBHOOK_DIR.glob("*.yaml"))
    kinds = set()
    for path in paths:
        deployed = yaml.safe_load(path.read_text())
        local = pointed_at(deployed, "https://127.0.0.1:9443", CA)
        kinds.add(local["kind"])
        assert CERT_MANAGER_ANNOTATION not in (local["metadata"].get("annotations") or {})
        for before, after in zip(deployed["webhooks"], local["webhooks"], strict=True):
            path_ = before["clientConfig"]["service"]["path"]
            assert after["clientConfig"] == {
                "url": f"https://127.0.0.1:9443{path_}",
                "caBundle": base64.b64encode(CA).decode(),
            }
            rest = {k: v for k, v in after.items() if k != "clientConfig"}
            assert rest == {k: v for k, v in before.items() if k != "clientConfig"}
        assert deployed["webhooks"][0]["clientConfig"]["service"]  # the input is untouched
    assert kinds == {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}


def test_prepare_writes_a_ca_and_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    webhooks = LocalWebhooks.prepare(tmp_path / "webhook", 9443)
    assert webhooks is not None
    assert (tmp_path / "webhook" / "ca.crt").read_bytes() == webhooks.ca_pem
    assert (tmp_path / "webhook" / "tls.key").stat().st_mode & 0o077 == 0
    flags = webhooks.allocator_flags()
    assert flags[flags.index("--tls-cert-file") + 1] == str(tmp_path / "webhook" / "tls.crt")
    assert [m["kind"] for m in webhooks.manifests()] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
