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


class AppendConflict(Exception):  # not the core's: the log's adapters raise it
    """Somebody appended to the node's log after the sequence we decided on: re-read,
    re-fold and decide again."""
