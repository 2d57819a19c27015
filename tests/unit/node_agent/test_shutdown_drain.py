"""The node agent's NATS drain at shutdown: a bus that is gone already is one log line,
not a traceback."""

from __future__ import annotations

import logging

import pytest
from nats.errors import ConnectionReconnectingError

from gpushare.node_agent.__main__ import drain


class GoneBus:
    """A connection whose server stopped first: drain raises, close works."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.is_closed = False
        self.closed = False

    async def drain(self) -> None:
        raise self.error

    async def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("error", [ConnectionReconnectingError(), OSError("refused")])
async def test_a_bus_gone_at_shutdown_is_a_clean_line(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    bus = GoneBus(error)
    with caplog.at_level(logging.INFO, logger="gpushare.node_agent.__main__"):
        await drain(bus)  # type: ignore[arg-type]
    assert bus.closed
    assert "NATS is gone at shutdown" in caplog.text
    assert all(record.exc_info is None for record in caplog.records)
