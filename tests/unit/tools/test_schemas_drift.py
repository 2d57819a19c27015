"""The committed JSON Schemas match the event Structs, and describe real events."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gpushare.core.events import PodReserved, encode_event
from gpushare.core.model import ContainerShare, PodRef
from tools import generate_schemas


def test_committed_schemas_are_up_to_date() -> None:
    assert generate_schemas.main(["--check"]) == 0


def test_every_event_type_has_a_schema() -> None:
    names = set(generate_schemas.expected_files())
    for name in ("PodReserved", "PodBound", "BindFailed", "ContainerAssigned", "PodReleased"):
        assert f"events/{name}.schema.json" in names


def test_schema_names_the_fields_an_event_carries() -> None:
    event = PodReserved(
        id="r1",
        at=datetime(2026, 1, 1, tzinfo=UTC),
        node="n1",
        pod=PodRef(namespace="ns", name="p", uid="u"),
        shares=(ContainerShare(container="c", card_index=0, card_uuid="GPU-0", memory_mib=1),),
    )
    encoded = json.loads(encode_event(event))
    schema = json.loads(generate_schemas.expected_files()["events/PodReserved.schema.json"])
    properties = schema["$defs"]["PodReserved"]["properties"]
    assert set(encoded) <= set(properties) | {"type"}
    assert encoded["type"] == "PodReserved"
    assert set(schema["$defs"]["PodReserved"]["required"]) <= set(encoded)
