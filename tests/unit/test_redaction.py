"""Secrets masked before they reach a log line."""

from __future__ import annotations

import msgspec
import pytest

from gpushare.redaction import describe_settings, redact_text, redacted_fields


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://u:p4ss@a:4222,tls://tok3n@b:4222", "nats://***@a:4222,tls://***@b:4222"),
        ("connect to https://admin:hunter2@api/x failed", "connect to https://***@api/x failed"),
        ("https://h/p?token=abc&watch=1", "https://h/p?token=***&watch=1"),
        ("https://h/p?watch=1&password=abc", "https://h/p?watch=1&password=***"),
    ],
)
def test_urls_lose_their_credentials(text: str, shown: str) -> None:
    assert redact_text(text) == shown


class Tls(msgspec.Struct, frozen=True, kw_only=True):
    key_file: str = "/etc/tls/tls.key"
    key: str = "-----BEGIN PRIVATE KEY-----"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    nats_url: str = "nats://allocator:pw@nats:4222"
    nats_user: str = "allocator"
    nats_password: str = "pw"
    api_token: str | None = None
    nkey_seed: str = "SUAM"
    tls: Tls = msgspec.field(default_factory=Tls)


def test_secret_fields_are_masked_and_paths_shown() -> None:
    assert redacted_fields(Settings()) == {
        "nats_url": "nats://***@nats:4222",
        "nats_user": "allocator",
        "nats_password": "***",
        "api_token": None,
        "nkey_seed": "***",
        "tls": {"key_file": "/etc/tls/tls.key", "key": "***"},
    }
    line = describe_settings(Settings())
    assert ":pw@" not in line
    assert "'pw'" not in line
    assert "PRIVATE" not in line
