"""Talking to kube-apiserver without the official client's model layer: its TLS and
its bearer token, from the official client's configuration, for aiohttp."""

from __future__ import annotations

import ssl
from typing import Any


def ssl_context(configuration: Any) -> ssl.SSLContext | bool:
    """TLS as the official client would set it up; False for plain HTTP."""
    if not str(configuration.host).startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


def bearer_headers(configuration: Any) -> dict[str, str]:
    """The bearer token (refreshed by the client's hook, as for in-cluster tokens)."""
    settings = configuration.auth_settings().values()
    return {s["key"]: s["value"] for s in settings if s["in"] == "header" and s["value"]}
