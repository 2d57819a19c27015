"""Telling the binder whether this node can admit our pods now (core NATS request-reply).

The kubelet refuses, for good, every pod that needs one of our resources while their
plugin is away (``UnexpectedAdmissionError``: a node agent restarting, a kubelet that
restarted and has not been re-registered with). So the binder asks
``gpushare.agent.<node>.ready`` before it binds a pod to a node; the agent answers
``ready`` once every resource is registered with the kubelet that runs and the kubelet
has its device list, ``waiting`` before. A dead agent answers nothing, and NATS says
"no responders" at once: the binder waits for it to come back (:mod:`gpushare.binder.gating`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpushare.bus.nats_types import Client, Msg, Subscription
from gpushare.bus.subjects import AGENT_READY, AGENT_WAITING, agent_ready_subject

log = logging.getLogger(__name__)


class ReadinessResponder:
    """Answers one node's readiness requests from ``serving()``."""

    def __init__(self, nc: Client, node: str, serving: Callable[[], bool]) -> None:
        self._nc = nc
        self._node = node
        self._serving = serving
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        subject = agent_ready_subject(self._node)
        self._subscription = await self._nc.subscribe(subject, cb=self._answer)
        await self._nc.flush()  # answering from now on, not from some moment later

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _answer(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            await msg.respond(AGENT_READY if self._serving() else AGENT_WAITING)
        except Exception as error:  # the requester gave up, NATS away: it asks again
            log.debug("node %s: readiness answer not sent: %s", self._node, error)
