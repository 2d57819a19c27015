"""Secrets never reach the logs: URLs without their credentials, settings without secrets.

A setting is secret by its name (a password, a token, a secret, a credential, a key but
not a key *file*: paths are shown, contents never read here); any text is shown with the
``user:password@`` part of its URLs and secret-looking query parameters masked.
"""

from __future__ import annotations

import re

import msgspec

MASK = "***"

_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)
_SECRET_QUERY = re.compile(
    r"(?P<name>[?&;](?:password|passwd|pass|token|access_token|secret|key|auth)=)[^&;#\s]*",
    re.IGNORECASE,
)
_SECRET_NAME = re.compile(
    r"password|passwd|token|secret|credential|seed|(?:^|_)key$", re.IGNORECASE
)


def redact_text(text: str) -> str:
    """``text`` with URL credentials (``nats://u:p@h`` → ``nats://***@h``) and
    secret query parameters (``?token=x`` → ``?token=***``) masked."""
    text = _USERINFO.sub(lambda match: f"{match['scheme']}{MASK}@", text)
    return _SECRET_QUERY.sub(lambda match: f"{match['name']}{MASK}", text)


def is_secret_name(name: str) -> bool:
    """Whether a setting called ``name`` holds a secret (``nats_password``, ``token``)."""
    return _SECRET_NAME.search(name) is not None


def _shown(name: str, value: object) -> object:
    if value is None or value == "":
        return value
    if is_secret_name(name):
        return MASK
    if isinstance(value, msgspec.Struct):
        return redacted_fields(value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def redacted_fields(settings: msgspec.Struct) -> dict[str, object]:
    """Every field of a settings struct, fit to log: secrets masked, nested structs too."""
    return {name: _shown(name, getattr(settings, name)) for name in settings.__struct_fields__}


def describe_settings(settings: msgspec.Struct) -> str:
    """``name=value`` pairs of :func:`redacted_fields`, for one start-up log line."""
    return " ".join(f"{name}={value!r}" for name, value in redacted_fields(settings).items())
