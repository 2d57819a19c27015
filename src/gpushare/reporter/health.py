"""Card health as the reporter tracks it: events from a backend and the marks they leave.

A backend owns its cards' health. It turns what it hears (an NVML XID event, a chaos test
flipping a simulated card) into :class:`HealthEvent` values for the reporter's loop, and
keeps the resulting marks in a :class:`HealthMarks` so that every later ``read_cards()``
reports the card unhealthy. The reporter only needs the events to know *when* to re-read:
the inventory it publishes always comes from ``read_cards()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import msgspec

from gpushare.core.model import Card

ALL_CARDS: None = None
"""The ``card_uuid`` of an event about every card on the node (NVML named no device)."""


class HealthEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One change of health a backend observed."""

    card_uuid: str | None
    """The card the event is about; ``None`` (:data:`ALL_CARDS`) means every card."""
    healthy: bool
    reason: str = ""
    """Why the card is unhealthy, e.g. ``XID 79``; empty when it recovered."""


def mark_unhealthy(card: Card, reason: str) -> Card:
    """``card`` reported unhealthy; a reason it already had is kept (the first cause wins)."""
    if not card.healthy:
        return card
    return msgspec.structs.replace(card, healthy=False, health_reason=reason)


class HealthMarks:
    """Thread-safe marks left by health events, and a queue of the events not yet polled.

    Backends call :meth:`record` from whatever thread heard the event (a test, a chaos tool,
    the NVML wait) and :meth:`wait_for_events` from the reporter's worker thread; the wait
    returns as soon as an event is recorded, so the reporter publishes the change at once.
    """

    def __init__(self) -> None:
        self._reasons: dict[str | None, str] = {}
        self._pending: list[HealthEvent] = []
        self._changed = threading.Condition()
        self._closed = False

    def record(self, event: HealthEvent) -> None:
        """Apply ``event`` to the marks and queue it for the next poll."""
        with self._changed:
            if event.healthy and event.card_uuid is ALL_CARDS:
                self._reasons.clear()
            elif event.healthy:
                self._reasons.pop(event.card_uuid, None)
            else:
                self._reasons.setdefault(event.card_uuid, event.reason)
            self._pending.append(event)
            self._changed.notify_all()

    def apply(self, cards: Iterable[Card]) -> tuple[Card, ...]:
        """``cards`` with every recorded mark applied."""
        with self._changed:
            reasons = dict(self._reasons)
        everyone = reasons.get(ALL_CARDS)
        marked = []
        for card in cards:
            reason = reasons.get(card.uuid, everyone)
            marked.append(card if reason is None else mark_unhealthy(card, reason))
        return tuple(marked)

    def take_events(self) -> list[HealthEvent]:
        """The events recorded since the last call, without waiting."""
        with self._changed:
            events, self._pending = self._pending, []
        return events

    def wait_for_events(self, timeout: float) -> list[HealthEvent]:
        """Block up to ``timeout`` seconds for an event; return the events since the last call."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self._pending) or self._closed, max(0.0, timeout))
            events, self._pending = self._pending, []
        return events

    def close(self) -> None:
        """Wake any waiting poll: the backend is going away."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
