"""``labelSelector`` and ``fieldSelector`` query parameters, as the apiserver reads them.

Label selectors take the whole grammar (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``,
``a in (x,y)``, ``a notin (x)``). Field selectors take ``=``, ``==`` and ``!=`` on the
fields each resource indexes upstream; any other field is a 400, as upstream.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpushare.embedded.kube_status import bad_request

Predicate = Callable[[dict[str, Any]], bool]

FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.restartPolicy",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
    "namespaces": frozenset({"metadata.name", "status.phase"}),
}
"""Field selectors each resource supports; other resources take only metadata ones."""

_SET_TERM = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*(?:(in|notin)\s*\((.*)\))?\s*$")
_EQUALITY_TERM = re.compile(r"^\s*([^\s!=]+)\s*(==|!=|=)\s*([^\s]*)\s*$")


def _split_terms(text: str) -> list[str]:
    """Commas separate terms, except inside ``in (...)`` value lists."""
    terms, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return [term for term in terms if term.strip()]


def _label_term(term: str) -> Predicate:
    equality = _EQUALITY_TERM.match(term)
    if equality:
        key, op, value = equality.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    match = _SET_TERM.match(term)
    if match is None:
        raise bad_request(f"unable to parse requirement: {term.strip()!r}")
    negated, key, op, values = match.groups()
    if op is None:
        return (lambda labels: key not in labels) if negated else (lambda labels: key in labels)
    if negated:
        raise bad_request(f"unable to parse requirement: {term.strip()!r}")
    allowed = {value.strip() for value in values.split(",")}
    if op == "in":
        return lambda labels: labels.get(key) in allowed
    return lambda labels: labels.get(key) not in allowed


def label_selector(text: str | None) -> Predicate:
    terms = [_label_term(term) for term in _split_terms(text or "")]

    def matches(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def field_value(obj: dict[str, Any], path: str) -> str:
    """A field as the selector compares it: a string, ``""`` when absent."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _field_term(resource: str, term: str) -> Predicate:
    match = _EQUALITY_TERM.match(term)
    if match is None:
        raise bad_request(f"invalid selector: {term.strip()!r}")
    path, op, value = match.groups()
    known = FIELDS.get(resource, frozenset({"metadata.name", "metadata.namespace"}))
    if path not in known | {"metadata.name", "metadata.namespace"}:
        raise bad_request(f'field label not supported: "{path}"')
    if op == "!=":
        return lambda obj: field_value(obj, path) != value
    return lambda obj: field_value(obj, path) == value


def field_selector(resource: str, text: str | None) -> Predicate:
    terms = [_field_term(resource, term) for term in _split_terms(text or "")]
    return lambda obj: all(term(obj) for term in terms)


def selector(resource: str, labels: str | None, fields: str | None) -> Predicate:
    """Both selectors of a list or watch request, parsed once (a 400 if malformed)."""
    by_label = label_selector(labels)
    by_field = field_selector(resource, fields)
    return lambda obj: by_label(obj) and by_field(obj)
