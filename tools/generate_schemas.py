"""Write the JSON Schema of every event into ``schemas/``; ``--check`` fails on drift.

The schemas are generated from the msgspec Structs in :mod:`gpushare.core.events`, so
auditors consuming the allocation stream from other languages read the same contract.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from gpushare.core.annotations import AllocationAnnotation
from gpushare.core.events import (
    ALL_DECISION_TYPES,
    ALL_EVENT_TYPES,
    AllocationEvent,
    AnyDecision,
    AnyEvent,
)

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def _render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def _union_schema(title: str, description: str, union: Any) -> dict[str, Any]:
    (schema,), components = msgspec.json.schema_components([union])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "description": description,
        **schema,
        "$defs": components,
    }


def expected_files() -> dict[str, str]:
    files = {
        "event.schema.json": _union_schema(
            "gpushare event", "Any event on the inventory or allocation stream.", AnyEvent
        ),
        "allocation-event.schema.json": _union_schema(
            "gpushare allocation event",
            "An event on the allocation log (subjects gpushare.alloc.<node>.<writer>).",
            AllocationEvent,
        ),
        "decision.schema.json": _union_schema(
            "gpushare extender decision",
            "A record on the decision stream (subjects gpushare.decisions.<namespace>.<pod>).",
            AnyDecision,
        ),
        "allocation-annotation.schema.json": _union_schema(
            "gpushare.io/allocation annotation",
            "The JSON the binder writes into the pod annotation gpushare.io/allocation.",
            AllocationAnnotation,
        ),
    }
    for event_type in (*ALL_EVENT_TYPES, *ALL_DECISION_TYPES):
        files[f"events/{event_type.__name__}.schema.json"] = _union_schema(
            event_type.__name__, (event_type.__doc__ or "").strip(), event_type
        )
    return {name: _render(doc) for name, doc in files.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if schemas/ is out of date")
    args = parser.parse_args(argv)
    drift = []
    for name, text in expected_files().items():
        path = SCHEMAS / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        drift.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and drift:
        print(f"schemas out of date: {', '.join(drift)}; run `make generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
