"""Hypothesis strategies for JSON documents valid against a JSON Schema.

``hypothesis_jsonschema.from_schema`` would be the tool, but the pinned pair does not
work together: hypothesis-jsonschema 0.23.1 drives an object's keys with the private
``many.more()`` of Hypothesis, which 6.170 no longer has, so any schema with an object
in it fails with ``AttributeError: 'many' object has no attribute 'more'``. This module
covers the subset of JSON Schema that msgspec writes (``type``, ``properties``,
``required``, ``additionalProperties``, ``items``, ``anyOf``, ``enum``, ``$ref`` into
``$defs``, the ``date-time`` format) and nothing more: an unknown keyword is an error,
not a silently wider or narrower document.

Objects also get a few unknown keys (decoders must ignore them, as Go and kube-apiserver
send fields we do not read) unless the schema forbids them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

Schema = dict[str, Any]

INT64 = 2**63
KNOWN = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "$ref",
        "$defs",
        "format",
        "title",
        "description",
        "default",
        "minLength",
        "maxLength",
    }
)
"""Keywords understood (``title``, ``description`` and ``default`` only annotate)."""

keys = st.text(max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-INT64, max_value=INT64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(max_size=16)
)
any_json: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)
"""Any JSON value, kept small: what ``{}`` (msgspec's schema of ``Raw`` or ``Any``) allows."""

timestamps = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2262, 1, 1), timezones=st.just(UTC)
).map(lambda at: at.isoformat().replace("+00:00", "Z"))
"""RFC 3339 as Kubernetes writes it (``2026-11-22T04:24:39Z``), with or without fractions."""


def from_schema(schema: Schema, defs: Schema | None = None) -> st.SearchStrategy[Any]:
    """JSON-compatible values that ``schema`` accepts."""
    unknown = set(schema) - KNOWN
    if unknown:
        raise NotImplementedError(f"JSON Schema keywords not handled: {sorted(unknown)}")
    defs = {**(defs or {}), **schema.get("$defs", {})}
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return st.deferred(lambda: from_schema(defs[name], defs))
    if "anyOf" in schema:
        return st.one_of([from_schema(member, defs) for member in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind is None:
        return any_json
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": one}, defs) for one in kind])
    return _typed(kind, schema, defs)


def _typed(kind: str, schema: Schema, defs: Schema) -> st.SearchStrategy[Any]:
    if kind == "object":
        return _object(schema, defs)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=4)
    if kind == "string":
        if schema.get("format") == "date-time":
            return timestamps
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 24))
    simple: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "integer": st.integers(min_value=-INT64, max_value=INT64 - 1),
        "number": st.floats(allow_nan=False, allow_infinity=False, width=64),
    }
    return simple[kind]


def _object(schema: Schema, defs: Schema) -> st.SearchStrategy[dict[str, Any]]:
    properties = {
        name: from_schema(sub, defs) for name, sub in schema.get("properties", {}).items()
    }
    required = set(schema.get("required", ()))
    additional = schema.get("additionalProperties", True)
    if not properties:
        values = any_json if additional is True else from_schema(additional or {}, defs)
        if additional is False:
            return st.just({})
        return st.dictionaries(keys, values, max_size=4)
    fixed = st.fixed_dictionaries(
        {name: value for name, value in properties.items() if name in required},
        optional={name: value for name, value in properties.items() if name not in required},
    )
    if additional is False:
        return fixed
    extra = st.dictionaries(keys.filter(lambda key: key not in properties), any_json, max_size=2)
    return st.builds(lambda known, unknown: {**unknown, **known}, fixed, extra)
