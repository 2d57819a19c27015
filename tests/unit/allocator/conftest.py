"""The allocator's app in-process, for the admission webhooks' tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.unit.allocator.test_admission import app_with


@pytest.fixture
async def webhook() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the allocator's app (seed 000's cluster), in-process."""
    transport = httpx.ASGITransport(app=app_with())
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        yield client
