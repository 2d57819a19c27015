"""Stream set-up on a real nats-server: replicas are chosen at creation, never updated."""

from __future__ import annotations

import logging

import pytest
from nats.js import JetStreamContext

from gpushare.bus.streams import ensure_streams
from gpushare.bus.subjects import ALLOCATION_STREAM


async def test_an_existing_streams_replicas_are_kept_and_the_difference_said(
    js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``js`` fixture created the streams with one replica; an allocator configured for
    three on this single server neither fails nor tries an update it may not make."""
    with caplog.at_level(logging.WARNING, logger="gpushare.bus.streams"):
        await ensure_streams(js, replicas=3)

    assert (await js.stream_info(ALLOCATION_STREAM)).config.num_replicas == 1
    assert any(
        f"stream {ALLOCATION_STREAM} has 1 replicas, not 3" in record.getMessage()
        for record in caplog.records
    )
