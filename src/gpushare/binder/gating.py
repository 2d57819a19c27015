"""Binding only to nodes whose node agent can serve the pod now.

A pod bound to a node while our device plugin is away there (the agent restarting, the
kubelet restarted and not re-registered with yet) fails the kubelet's admission for good
(``UnexpectedAdmissionError``). So before each binding the binder asks the node's agent
(:mod:`gpushare.node_agent.readiness`) and waits while it answers ``waiting``, or answers
nothing although it has answered before (it died: NATS says "no responders" at once),
up to ``agent_wait``; then it binds anyway, and says so. A node whose agent never
answered this binder and that no reporter of ours inventoried (no gpushare agent there)
is not waited for.

A ``ready`` answer serves the node's bindings for ``reuse_seconds`` after it came (0.1 s
by default, ``--agent-ready-reuse``): a packing policy sends pod after pod to the same
node, and asking once per pod was a request and a reply through nats-server, the agent
woken and answering, for every binding. That is no weaker a guarantee than the answer
already was: the kubelet sees a pod a few milliseconds to seconds after the agent said
``ready``, and the agent can go away in between either way. ``waiting``, or no answer,
is never reused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpushare.binder.metrics import AGENT_QUESTIONS
from gpushare.bus.nats_types import Client, NatsTimeout, NoRespondersError
from gpushare.bus.subjects import AGENT_READY, agent_ready_subject
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.ports import Clock

log = logging.getLogger(__name__)

ASK_TIMEOUT_SECONDS = 0.5
RETRY_SECONDS = 0.1


class AgentGate:
    """Waits, per node, for its agent to say the kubelet can admit our pods."""

    def __init__(
        self,
        nc: Client | None,
        wait_seconds: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        ours: Callable[[str], bool] = lambda node: False,
        reuse_seconds: float = 0.0,
    ) -> None:
        self._nc = nc
        self._wait_seconds = wait_seconds
        self._clock = clock
        self._reuse_seconds = reuse_seconds
        self._ready_until: dict[str, float] = {}
        """Node → until when (monotonic) its agent's last ``ready`` is taken as said now."""
        self.ours = ours
        """Whether a node runs gpushare's node services (the log holds its inventory): a
        binder that just started knows them before any agent answered it."""
        self.known: set[str] = set()
        """Nodes whose agent has answered this binder at least once."""

    async def ask(self, node: str) -> bytes | None:
        """The agent's answer, or ``None`` when nobody answers."""
        if self._nc is None:
            return AGENT_READY
        try:
            reply = await self._nc.request(
                agent_ready_subject(node), b"", timeout=ASK_TIMEOUT_SECONDS
            )
        except (NoRespondersError, NatsTimeout):
            AGENT_QUESTIONS.labels("none").inc()
            return None
        self.known.add(node)
        answer = bytes(reply.data)
        AGENT_QUESTIONS.labels("ready" if answer == AGENT_READY else "waiting").inc()
        return answer

    async def wait_serving(self, node: str) -> bool:
        """Until ``node``'s agent is ready (True), or there is no point waiting (False:
        no agent of ours known there, or ``wait_seconds`` passed)."""
        now = self._clock.monotonic()
        if self._ready_until.get(node, 0.0) > now:
            return True
        deadline = now + self._wait_seconds
        waited = False
        while True:
            answer = await self.ask(node)
            if answer == AGENT_READY:
                if self._reuse_seconds > 0:
                    self._ready_until[node] = self._clock.monotonic() + self._reuse_seconds
                if waited:
                    log.info("node %s: its agent serves again; binding", node)
                return True
            self._ready_until.pop(node, None)
            if answer is None and node not in self.known and not self.ours(node):
                return False
            if self._clock.monotonic() >= deadline:
                log.warning(
                    "node %s: its agent has not been serving for %.0f s; binding anyway",
                    node,
                    self._wait_seconds,
                )
                return False
            if not waited:
                log.info("node %s: waiting for its agent (%s)", node, answer or "gone")
                waited = True
            await asyncio.sleep(RETRY_SECONDS)
