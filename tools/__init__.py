"""Generators for the committed, never hand-edited files (JSON Schema, gRPC stubs)."""
