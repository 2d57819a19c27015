"""kube-scheduler's extender/v1 types, as msgspec Structs, and their JSON codecs.

The Go types carry no ``json:`` tags, so the wire keys are the Go field names
(PascalCase) and Go encodes unset pointers and maps as ``null`` rather than omitting
them. We emit exactly that. Go *decodes* keys case-insensitively, so old extenders'
lowercase keys (``pod``, ``nodenames``, ``failedNodes``...) work with kube-scheduler;
we accept any casing too, by canonicalising the top-level keys before decoding.

The embedded Kubernetes objects keep their own camelCase JSON. The pod is decoded
straight into :class:`gpushare.core.pods.Pod` (unknown fields ignored); a NodeList's
items stay raw JSON, so a node that passes the filter goes back byte for byte.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from gpushare.allocator.json_limits import TooDeep, check_depth
from gpushare.core.pods import Pod

T = TypeVar("T")

_EMPTY_OBJECT = msgspec.Raw(b"{}")


class WireError(ValueError):
    """The body is not the extender/v1 JSON it should be (the extender answers 400)."""


DECODE_ERRORS = (msgspec.MsgspecError, RecursionError, TooDeep)
"""What decoding a body may raise (``RecursionError`` only if the depth check missed)."""


def check_body(body: bytes, what: str) -> None:
    """Refuse, before decoding, a body nested deeper than any real object: raises
    :class:`WireError` (:func:`gpushare.allocator.json_limits.check_depth`)."""
    try:
        check_depth(body)
    except TooDeep as error:
        raise WireError(f"not a valid {what}: {error}") from None


class NodeMeta(msgspec.Struct, frozen=True, kw_only=True):
    name: str


class NodeHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The one part of a v1.Node the extender reads: its name."""

    metadata: NodeMeta


class NodeList(msgspec.Struct, frozen=True, kw_only=True):
    """A v1.NodeList as kube-scheduler sends it: ``{"metadata": {}, "items": [...]}``.

    The items are kept as raw JSON and never re-encoded. (Informer objects carry no
    ``apiVersion``/``kind``; if a client sends them, they are not echoed: Go ignores them.)
    """

    metadata: msgspec.Raw = _EMPTY_OBJECT
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class ExtenderArgs(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    """The body of filter and prioritize.

    ``Nodes`` is set when the extender is configured ``nodeCacheCapable: false``,
    ``NodeNames`` when it is ``true``; the other one is ``null``.
    """

    pod: Pod | None = None
    nodes: NodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    """The answer to filter. A non-empty ``Error`` fails the whole scheduling attempt."""

    nodes: NodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = msgspec.field(default_factory=dict)
    """Nodes that do not fit now (kube-scheduler may try preemption there)."""
    failed_and_unresolvable_nodes: dict[str, str] = msgspec.field(default_factory=dict)
    """Nodes where no preemption could help; wins over ``FailedNodes`` for the same node."""
    error: str = ""


class HostPriority(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    """One element of prioritize's answer, a bare JSON array (HostPriorityList)."""

    host: str
    score: int


class ExtenderBindingArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The body of bind: names only, the extender must find the pod itself."""

    pod_name: str = msgspec.field(name="PodName")
    pod_namespace: str = msgspec.field(name="PodNamespace")
    pod_uid: str = msgspec.field(name="PodUID")
    node: str = msgspec.field(name="Node")


class ExtenderBindingResult(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    """The answer to bind: ``{"Error": ""}`` only once the Binding exists."""

    error: str = ""


_encoder = msgspec.json.Encoder()
_object_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_array_of_objects = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_node_header = msgspec.json.Decoder(NodeHeader)


_host_priorities = msgspec.json.Decoder(list[HostPriority])
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
_keys: dict[type[Any], dict[str, str]] = {}


def _decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


def _key_names(kind: type[Any]) -> dict[str, str]:
    """Lowercased wire key → the wire key the struct expects."""
    names = _keys.get(kind)
    if names is None:
        fields = msgspec.structs.fields(kind)
        names = _keys[kind] = {field.encode_name.lower(): field.encode_name for field in fields}
    return names


def _canonical(fields: dict[str, msgspec.Raw], kind: type[Any]) -> dict[str, msgspec.Raw]:
    names = _key_names(kind)
    return {names.get(key.lower(), key): value for key, value in fields.items()}


def decode(body: bytes, kind: type[T]) -> T:
    """Decode an extender/v1 object from JSON whatever the casing of its keys.

    Raises :class:`WireError` with msgspec's explanation when the body does not fit.
    """
    check_body(body, kind.__name__)
    try:
        fields = _object_fields.decode(body)
        canonical = _canonical(fields, kind)
        if canonical.keys() != fields.keys():
            body = _encoder.encode(canonical)
        return _decoder(kind).decode(body)
    except DECODE_ERRORS as error:
        raise WireError(f"not a valid {kind.__name__}: {error}") from None


def decode_host_priorities(body: bytes) -> list[HostPriority]:
    """Decode a HostPriorityList (a bare array) whatever the casing of its keys."""
    check_body(body, "HostPriorityList")
    try:
        elements = [_canonical(fields, HostPriority) for fields in _array_of_objects.decode(body)]
        return _host_priorities.decode(_encoder.encode(elements))
    except DECODE_ERRORS as error:
        raise WireError(f"not a valid HostPriorityList: {error}") from None


def encode(value: object) -> bytes:
    """JSON for any wire value; PascalCase keys and ``null`` for unset fields."""
    return _encoder.encode(value)


def node_name(item: msgspec.Raw) -> str:
    """The ``metadata.name`` of one raw NodeList item. Raises :class:`WireError`."""
    try:
        return _node_header.decode(item).metadata.name
    except DECODE_ERRORS as error:
        raise WireError(f"a node in Nodes.items has no readable metadata.name: {error}") from None
