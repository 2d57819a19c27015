"""The core's error taxonomy. Services map these to HTTP codes, filter reasons or nak/term."""

from __future__ import annotations


class GpushareError(Exception):
    """Base of everything the core raises on purpose."""


class InvalidRequest(GpushareError):
    """The pod asks for something no node could ever satisfy as written (a spec error)."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail


class NoFit(GpushareError):
    """The request is valid but this node cannot hold it now."""
