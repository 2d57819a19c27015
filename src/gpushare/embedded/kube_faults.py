"""Test-only fault injection and a request journal for the Kubernetes API stand-in.

A :class:`FaultRule` answers the next ``times`` requests whose verb and path match with
an error Status *before* the request touches any state, so a test can stage "the API
said 409" or "the API is down (503)" without a real failure. Rules are set in process
(``KubeApiServer.fail_next``) or over HTTP (``POST /_gpushare/faults``), and every
request is journaled so tests can count, say, successful bindings.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from gpushare.embedded.kube_status import StatusError

JOURNAL_SIZE = 100_000


@dataclass
class FaultRule:
    verb: str
    """HTTP method (``POST``, ``PATCH``...) or ``*`` for any."""
    path: str
    """A regular expression searched for in the request path (no query string)."""
    status: int
    message: str = ""
    reason: str = ""
    times: int = 1
    """How many matching requests fail; ``-1`` for all of them until cleared."""

    def matches(self, verb: str, path: str) -> bool:
        return self.verb in ("*", verb.upper()) and re.search(self.path, path) is not None

    def error(self) -> StatusError:
        message = self.message or f"injected fault: HTTP {self.status}"
        return StatusError(self.status, message, reason=self.reason or None)


@dataclass(frozen=True)
class RequestRecord:
    verb: str
    path: str
    status: int
    query: str = ""
    """The query string (``watch=true&...`` tells a watch from a list of the same path)."""


@dataclass
class FaultInjector:
    rules: list[FaultRule] = field(default_factory=list)
    journal: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=JOURNAL_SIZE))
    """The latest requests (bounded: ``gpushare up`` runs the stand-in for days)."""

    def add(self, rule: FaultRule) -> None:
        re.compile(rule.path)  # a bad pattern fails the caller, not a later request
        self.rules.append(rule)

    def clear(self) -> None:
        self.rules.clear()

    def take(self, verb: str, path: str) -> StatusError | None:
        """The error for this request if a rule claims it (consuming one of its ``times``)."""
        for rule in self.rules:
            if rule.matches(verb, path):
                if rule.times > 0:
                    rule.times -= 1
                    if rule.times == 0:
                        self.rules.remove(rule)
                return rule.error()
        return None

    def record(self, verb: str, path: str, status: int, query: str = "") -> None:
        self.journal.append(RequestRecord(verb.upper(), path, status, query))

    def requests(
        self, verb: str = "*", path: str = "", status: int | None = None
    ) -> list[RequestRecord]:
        """Journaled requests matching ``verb``, a ``path`` regex and ``status`` (if given)."""
        return [
            record
            for record in self.journal
            if verb in ("*", record.verb)
            and re.search(path, record.path)
            and (status is None or record.status == status)
        ]

    def describe(self) -> list[dict[str, Any]]:
        return [asdict(rule) for rule in self.rules]


def rule_from_json(body: Any) -> FaultRule:
    """``{"verb": "POST", "path": "/binding$", "status": 409, "message": "...", "times": 1}``."""
    if not isinstance(body, dict) or not isinstance(body.get("status"), int):
        raise StatusError(400, "a fault needs at least an integer 'status'")
    try:
        return FaultRule(
            verb=str(body.get("verb", "*")).upper(),
            path=str(body.get("path", "")),
            status=body["status"],
            message=str(body.get("message", "")),
            reason=str(body.get("reason", "")),
            times=int(body.get("times", 1)),
        )
    except (TypeError, ValueError) as error:
        raise StatusError(400, f"bad fault: {error}") from None
