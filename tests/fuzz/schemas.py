"""JSON Schemas of the wire Structs, for the fuzzer's generator (:mod:`.generation`).

The extender and webhook handlers read the raw body and decode it with msgspec into the
Structs of :mod:`gpushare.allocator.wire` and :mod:`gpushare.allocator.admission_wire`;
FastAPI never sees a model (and the app serves no ``/openapi.json``), so those Structs
*are* the contract, and their schema is what the fuzzer generates from.

The schema is derived here from ``msgspec.inspect.type_info``, following the mapping of
``msgspec.json.schema`` with two differences that make it the schema of what the decoder
really accepts:

* ``msgspec.json.schema`` raises ``TypeError`` on a Struct whose field default is a
  ``msgspec.Raw`` (``NodeList.metadata``, ``AdmissionRequest.object``): it cannot write a
  Raw as a schema ``default``. Defaults only annotate, so none are written here.
* for a ``datetime`` that may be naive or aware (every one in :mod:`gpushare.core.pods`)
  it writes ``{"type": "string"}`` without ``"format": "date-time"``, although the decoder
  refuses any string that is not RFC 3339. Here the format is always written.
"""

from __future__ import annotations

from typing import Any

import msgspec.inspect as mi

Schema = dict[str, Any]


def wire_schema(kind: Any) -> Schema:
    """The JSON Schema of ``kind`` as its decoder accepts it (nested Structs inlined)."""
    return _schema(mi.type_info(kind))


def _schema(info: mi.Type) -> Schema:
    if isinstance(info, mi.StructType):
        return _struct(info)
    if isinstance(info, mi.UnionType):
        return {"anyOf": [_schema(member) for member in info.types]}
    if isinstance(info, mi.NoneType):
        return {"type": "null"}
    if isinstance(info, mi.BoolType):
        return {"type": "boolean"}
    if isinstance(info, mi.IntType):
        return {"type": "integer"}
    if isinstance(info, mi.FloatType):
        return {"type": "number"}
    if isinstance(info, mi.StrType):
        return {"type": "string"}
    if isinstance(info, mi.DateTimeType):
        return {"type": "string", "format": "date-time"}
    if isinstance(info, mi.LiteralType):
        return {"enum": list(info.values)}
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return {"type": "array", "items": _schema(info.item_type)}
    if isinstance(info, mi.DictType):
        return {"type": "object", "additionalProperties": _schema(info.value_type)}
    if isinstance(info, mi.RawType | mi.AnyType):
        return {}
    raise NotImplementedError(f"no JSON Schema mapping for {info!r}")


def _struct(info: mi.StructType) -> Schema:
    properties = {field.encode_name: _schema(field.type) for field in info.fields}
    required = [field.encode_name for field in info.fields if field.required]
    if info.tag_field is not None:  # a tagged union's member: its tag is required
        properties[info.tag_field] = {"enum": [info.tag]}
        required.insert(0, info.tag_field)
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if info.forbid_unknown_fields:
        schema["additionalProperties"] = False
    return schema
