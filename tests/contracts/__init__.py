"""Contract tests: one body per port, run against the fake and against the real thing."""
