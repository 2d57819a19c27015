"""Who a service is to NATS and how it trusts the server: user, password, TLS.

Read from the environment (each service's pod gets its own secret):

* ``GPUSHARE_NATS_USER`` and ``GPUSHARE_NATS_PASSWORD`` (or ``GPUSHARE_NATS_PASSWORD_FILE``,
  a mounted secret), or ``GPUSHARE_NATS_CREDS`` (a NATS ``.creds`` file);
* ``GPUSHARE_NATS_CA``: the CA bundle the server's certificate is checked against (TLS
  on; so is a ``tls://`` URL);
* ``GPUSHARE_NATS_CERT`` and ``GPUSHARE_NATS_KEY``: a client certificate, where the
  server asks for one.

The password never appears in a repr, a log line or an error message from here.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.bus.permissions import inbox_prefix

USER = "GPUSHARE_NATS_USER"
PASSWORD = "GPUSHARE_NATS_PASSWORD"
PASSWORD_FILE = "GPUSHARE_NATS_PASSWORD_FILE"
CREDS = "GPUSHARE_NATS_CREDS"
CA = "GPUSHARE_NATS_CA"
CERT = "GPUSHARE_NATS_CERT"
KEY = "GPUSHARE_NATS_KEY"


@dataclass(frozen=True)
class NatsCredentials:
    """How to authenticate (all empty: anonymous, as in a local ``gpushare up``)."""

    user: str = ""
    """NATS user name (default: none)."""
    password: str = field(default="", repr=False)
    """That user's password (default: none); kept out of reprs."""
    creds_file: str = ""
    """A NATS ``.creds`` file (JWT and nkey seed) instead of a password (default: none)."""
    ca_file: str = ""
    """CA bundle to verify the server's TLS certificate (default: the system's, TLS off)."""
    cert_file: str = ""
    """Client certificate for mutual TLS (default: none)."""
    key_file: str = ""
    """The client certificate's private key (default: none)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsCredentials:
        env = os.environ if env is None else env
        password = env.get(PASSWORD, "")
        if not password and env.get(PASSWORD_FILE):
            password = Path(env[PASSWORD_FILE]).read_text().strip()
        return cls(
            user=env.get(USER, ""),
            password=password,
            creds_file=env.get(CREDS, ""),
            ca_file=env.get(CA, ""),
            cert_file=env.get(CERT, ""),
            key_file=env.get(KEY, ""),
        )

    def wants_tls(self, urls: str) -> bool:
        return bool(self.ca_file or self.cert_file) or "tls://" in urls

    def tls_context(self) -> ssl.SSLContext:
        """Verifies the server against ``ca_file`` (or the system's CAs); presents the
        client certificate when there is one."""
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file or None)
        return context

    def connect_options(self, urls: str) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (secrets included: never log them)."""
        options: dict[str, Any] = {}
        if self.user:
            options["user"] = self.user
            options["password"] = self.password
            options["inbox_prefix"] = inbox_prefix(self.user)
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        if self.wants_tls(urls):
            options["tls"] = self.tls_context()
        return options
