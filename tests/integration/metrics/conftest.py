"""The services' own fixtures, reused: each test here starts the real service."""

from tests.integration.binder.conftest import clock, start_binder  # noqa: F401
from tests.integration.node_agent.conftest import (  # noqa: F401
    short_dir,
    start_agent,
    start_kubelet,
    target,
)
