"""What every answer of the extender and the webhook must look like, checked from the
request as sent (read here independently of the allocator's own decoding).

kube-scheduler fails the whole scheduling attempt on any status but 200 and on a
non-empty ``Error``; a node it gets back without a reason becomes "unresolvable" with
no explanation (``shared/protocols.md`` A.3). So: a well-formed call gets 200, no
``Error``, and a reason for every node it does not pass; a malformed one gets 400 and
a body that says what is wrong, one over the body limit 413; nothing gets a 5xx.

The admission webhook answers every body with an AdmissionReview (HTTP 200): allowed, or
denied with 403 naming a rule; a body that is no review with 400 (``BadRequest``), one
over the limit with 413 (``RequestEntityTooLarge``), echoing the uid when it is readable.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from gpushare.allocator.json_limits import MAX_JSON_DEPTH
from gpushare.core.requests import RULES

MAX_PRIORITY = 10
INTERNAL = "internal error"
"""What the allocator writes when a handler raised: never acceptable for any input."""


def canonical(document: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys as Go reads them: case-insensitively, the last duplicate winning."""
    keys = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}
    return {keys.get(key.lower(), key): value for key, value in document.items()}


def _node_name(item: Any) -> str | None:
    meta = item.get("metadata") if isinstance(item, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def asked_nodes(document: Any) -> list[str] | None:
    """The node names an ExtenderArgs asks about; ``None`` when it is not well-formed enough
    to name them (no pod, or a node item without a ``metadata.name``)."""
    if not isinstance(document, dict):
        return None
    args = canonical(document)
    if not isinstance(args.get("Pod"), dict):
        return None
    if isinstance(args.get("NodeNames"), list):
        return list(args["NodeNames"])
    nodes = args.get("Nodes")
    if nodes is None:
        return []
    items = nodes.get("items", []) if isinstance(nodes, dict) else None
    if not isinstance(items, list):
        return None
    named = [_node_name(item) for item in items]
    return None if None in named else [name for name in named if name is not None]


def json_answer(response: httpx.Response) -> Any:
    assert response.headers["content-type"] == "application/json", response.headers
    return json.loads(response.content)


def check_refusal(verb: str, response: httpx.Response) -> None:
    """A 400 whose ``Error`` says what is wrong with the body."""
    assert response.status_code == 400, (response.status_code, response.text)
    error = json_answer(response)["Error"]
    prefix = f"malformed {verb} request: "
    assert error.startswith(prefix), error
    assert len(error) > len(prefix), error


def passed_nodes(document: dict[str, Any], answer: dict[str, Any]) -> list[str]:
    """The nodes a filter answer lets through, read the way kube-scheduler reads them:
    ``NodeNames`` when it asked by name (``nodeCacheCapable``), else ``Nodes.items``."""
    args = canonical(document)
    if args.get("NodeNames") is not None or args.get("Nodes") is None:
        return list(answer["NodeNames"])
    return [name for item in answer["Nodes"]["items"] if (name := _node_name(item)) is not None]


def check_filter(names: list[str], document: dict[str, Any], response: httpx.Response) -> None:
    """200, no ``Error``, and every node asked about either passed or given a reason, but
    for the nodes that fit and lost to the one node filter chose (``--choose-in-filter``)."""
    assert response.status_code == 200, (response.status_code, response.text)
    answer = json_answer(response)
    assert answer["Error"] == "", answer["Error"]
    passed = passed_nodes(document, answer)
    failed, unresolvable = answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
    assert set(passed) <= set(names), "a node kube-scheduler did not ask about"
    assert not set(passed) & (set(failed) | set(unresolvable)), "passed and failed at once"
    explained = set(passed) | set(failed) | set(unresolvable)
    assert explained <= set(names), "a reason for a node kube-scheduler did not ask about"
    assert explained == set(names) or len(passed) == 1, "a node left unexplained"
    for node, reason in {**failed, **unresolvable}.items():
        assert isinstance(reason, str), (node, reason)
        assert reason.strip(), f"no reason for {node!r}"
        assert INTERNAL not in reason, reason


def check_prioritize(names: list[str], response: httpx.Response) -> None:
    """200 and one score in 0..10 per node asked about, in the order asked."""
    assert response.status_code == 200, (response.status_code, response.text)
    answer = json_answer(response)
    assert [entry["Host"] for entry in answer] == names
    for entry in answer:
        assert isinstance(entry["Score"], int), entry
        assert 0 <= entry["Score"] <= MAX_PRIORITY, entry


def check_bind(response: httpx.Response) -> str:
    """200 and an ``Error`` string (empty only once bound); returns it."""
    assert response.status_code == 200, (response.status_code, response.text)
    error = json_answer(response)["Error"]
    assert isinstance(error, str), error
    assert INTERNAL not in error, error
    return error


def check_too_large(verb: str, response: httpx.Response, limit: int) -> None:
    """413 whose ``Error`` names the limit and the setting that raises it."""
    assert response.status_code == 413, (response.status_code, response.text)
    error = json_answer(response)["Error"]
    assert f"over the allocator's limit of {limit} bytes" in error, (verb, error)
    assert "--max-body-bytes" in error, error


def check_too_deep(verb: str, response: httpx.Response) -> None:
    """400 saying the body nests too deep (never a 200 "internal error")."""
    check_refusal(verb, response)
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in json_answer(response)["Error"]


def review_envelope(response: httpx.Response) -> dict[str, Any]:
    """200 and an ``admission.k8s.io/v1`` AdmissionReview: its ``response``, well-formed."""
    assert response.status_code == 200, (response.status_code, response.text)
    review = json_answer(response)
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    answer: dict[str, Any] = review["response"]
    assert isinstance(answer["uid"], str), answer
    assert isinstance(answer["allowed"], bool), answer
    if answer["allowed"]:
        assert "status" not in answer, answer
    else:
        status = answer["status"]
        assert status["code"] in (400, 403, 413), status  # never 500: nothing internal fails
        assert status["message"].startswith("gpushare: "), status
    return answer


def check_review(uid: Any, response: httpx.Response) -> dict[str, Any]:
    """200 and an AdmissionReview answering ``uid``: allowed, or denied naming a rule."""
    answer = review_envelope(response)
    assert answer["uid"] == uid
    if not answer["allowed"]:
        status = answer["status"]
        assert (status["code"], status["reason"]) == (403, "Forbidden"), status
        assert status["message"].startswith('gpushare: rule "'), status
        rule = status["message"].split('"')[1]
        assert rule in RULES, status["message"]
    return answer


REFUSALS = {400: "BadRequest", 413: "RequestEntityTooLarge"}


def check_review_refusal(
    uid: str | None, response: httpx.Response, code: int = 400
) -> dict[str, Any]:
    """200 and an AdmissionReview denying the body itself (``code`` 400: no review;
    413: over the limit), echoing ``uid`` (``None``: any)."""
    answer = review_envelope(response)
    if uid is not None:
        assert answer["uid"] == uid, (answer["uid"], uid)
    assert answer["allowed"] is False
    status = answer["status"]
    assert (status["code"], status["reason"]) == (code, REFUSALS[code]), status
    if code == 400:
        assert status["message"].startswith("gpushare: malformed admission request: "), status
        assert len(status["message"]) > len("gpushare: malformed admission request: ")
    return answer


def readable_uid(document: Any) -> str:
    """The uid the webhook can echo from a JSON body: ``request.uid`` when it is a string."""
    request = document.get("request") if isinstance(document, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""


def check_review_or_refusal(document: Any, response: httpx.Response) -> dict[str, Any]:
    """A body that may or may not be a valid review: judged (allowed, or 403 with a rule)
    or refused with 400, the uid echoed either way."""
    answer = review_envelope(response)
    uid = readable_uid(document)
    if answer["allowed"] or answer["status"]["code"] == 403:
        return check_review(uid, response)
    return check_review_refusal(uid, response)
