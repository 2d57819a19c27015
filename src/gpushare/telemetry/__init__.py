"""Traces: one per pod, carried across HTTP, NATS headers and gRPC metadata (OpenTelemetry)."""
