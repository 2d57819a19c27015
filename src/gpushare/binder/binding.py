"""Turning each ``PodReserved`` into a Binding, and the API's answer into an event.

All binder replicas share one durable pull consumer (``binder``) on the allocation
stream with explicit acks, so each reservation is handled by one replica at a time. A
message is acknowledged only after its verdict is in the log:

* bound (201, or 409 on our node with our reservation) → ``PodBound``;
* refused (404, 409 elsewhere or uid mismatch, 422) → ``BindFailed`` with the API's words;
* temporary (5xx, unreachable) → redelivered after a delay, ``BindFailed`` once
  ``bind_attempts`` deliveries have failed.

Before binding, the binder looks up which GPU resource names the pod asked
(:mod:`.asking`: from its pod watch, else one GET): a ``vke.volcengine.com/*`` pod gets
seed 003's annotations, and ``PodBound`` carries the names to the node agent. A pod that
cannot be read is retried like a temporary error (``BindFailed`` after ``bind_attempts``).

The same consumer hands one replica each ``AllocationCorrected``: the pods it moves get
their annotations rewritten (:mod:`.rewriting`). Other event types are acknowledged at
once. A message that can never be handled is
terminated and recorded in the rejected stream (:mod:`gpushare.bus.rejected`): one that
does not decode at once, and one whose handling raised on each of ``bind_attempts``
deliveries, with the error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable

import msgspec

from gpushare.binder.appending import append_event
from gpushare.binder.asking import Asked, AskedResources
from gpushare.binder.decisions import bind_failed, needs_binding, pod_bound
from gpushare.binder.gating import AgentGate
from gpushare.binder.metrics import BINDINGS
from gpushare.binder.rewriting import AnnotationRewriter
from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.bus.nats_types import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    JetStreamContext,
    Msg,
    NotFoundError,
)
from gpushare.bus.provenance import RefusedOrigin, decode_from
from gpushare.bus.rejected import reject
from gpushare.bus.sourcing import log_seq
from gpushare.bus.subjects import ALL_ALLOCATIONS, BINDER_QUEUE_STREAM, BINDER_WORK
from gpushare.core.annotations import asks_mgpu, binding_annotations
from gpushare.core.events import AllocationCorrected, PodReserved
from gpushare.core.ports import Clock
from gpushare.core.reconciliation import first_card_memory_mib
from gpushare.kube.binding import BindOutcome, bind_pod
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError
from gpushare.tasks import unless_stopped
from gpushare.telemetry.kubernetes import api_span, record_outcome
from gpushare.telemetry.messaging import MESSAGE_ID, consume_span

log = logging.getLogger(__name__)


def consumer_config(settings: BinderSettings) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=settings.consumer,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait_s,
        max_deliver=-1,
        filter_subjects=list(BINDER_WORK),
    )


class BindingWorker:
    def __init__(
        self,
        js: JetStreamContext,
        follower: LogFollower,
        kube: KubeClient,
        settings: BinderSettings,
        clock: Clock,
        *,
        asked: AskedResources | None = None,
        rewriter: AnnotationRewriter | None = None,
        gate: AgentGate | None = None,
    ) -> None:
        self._js = js
        self._gate = gate
        """Asks the node's agent before binding (None: binds at once)."""
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._clock = clock
        self._asked = asked if asked is not None else AskedResources(kube)
        self._rewriter = rewriter or AnnotationRewriter(
            follower, kube, settings, clock, self._asked
        )
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._stopping = asyncio.Event()

    async def subscribe(self) -> None:
        await self._narrow_consumer()
        self._subscription = await self._js.pull_subscribe(
            ALL_ALLOCATIONS,
            durable=self._settings.consumer,
            stream=BINDER_QUEUE_STREAM,
            config=consumer_config(self._settings),
        )

    async def _narrow_consumer(self) -> None:
        """A consumer an older binder made is delivered the whole log: narrow it to the
        binders' work (:data:`BINDER_WORK`), keeping the rest of its settings."""
        try:
            info = await self._js.consumer_info(BINDER_QUEUE_STREAM, self._settings.consumer)
        except NotFoundError:
            return  # pull_subscribe makes it
        if info.config.filter_subjects == list(BINDER_WORK):
            return
        narrowed = dataclasses.replace(
            info.config, filter_subject=None, filter_subjects=list(BINDER_WORK)
        )
        await self._js.add_consumer(BINDER_QUEUE_STREAM, narrowed)
        log.info("the binders' consumer is narrowed to %s", ", ".join(BINDER_WORK))

    async def run(self) -> None:
        """Fetch and handle reservations until :meth:`stop`.

        Each message is handled on its own, up to ``bindings_in_flight`` at once, and the
        next fetch does not wait for the slowest of the last: a binding that waits for
        its node's agent (up to ``agent_wait``) holds up no other node's. (Handling a
        fetched batch to its end first made every binding in the cluster wait out one
        node whose agent was registering, past the allocator's bind wait: kube-scheduler
        then retried those pods elsewhere, refused while their first reservation stood.)

        Stopping is a flag checked between fetches, not a cancellation: nats-py turns a
        cancelled fetch into other errors, and a bind in flight should finish and ack.
        """
        if self._subscription is None:
            await self.subscribe()
        assert self._subscription is not None
        in_flight: set[asyncio.Task[None]] = set()
        while not self._stopping.is_set():
            room = self._settings.bindings_in_flight - len(in_flight)
            if room <= 0:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                messages = await self._subscription.fetch(
                    min(room, self._settings.fetch_batch), timeout=self._settings.fetch_wait_s
                )
            except TimeoutError:
                continue
            for message in messages:
                task = asyncio.create_task(self.handle(message), name=f"bind {message.subject}")
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight)

    def stop(self) -> None:
        """Fetch no more; :meth:`run` returns once the messages in hand are handled."""
        self._stopping.set()

    async def handle(self, msg: Msg) -> None:
        """One message; never raises (a failure naks it, a hopeless one is rejected)."""
        try:
            await self._handle(msg)
        except Exception as error:
            deliveries = msg.metadata.num_delivered
            if deliveries >= self._settings.bind_attempts:
                log.exception(
                    "giving up on message %s after %d deliveries", msg.subject, deliveries
                )
                reason = f"handling failed on {deliveries} deliveries, last: {error!r}"
                if not await _quietly(reject(self._js, msg, reason)):
                    await _quietly(msg.term())  # not recorded (NATS failing?): still never again
            else:
                log.exception("handling %s failed; it will be redelivered", msg.subject)
                await _quietly(msg.nak(delay=self._settings.retry_delay_s))

    async def _handle(self, msg: Msg) -> None:
        try:
            event = decode_from(msg.subject, msg.data)
        except RefusedOrigin as error:
            log.error("rejecting a forged event on %s: %s", msg.subject, error)
            await reject(self._js, msg, f"refused: {error}")
            return
        except msgspec.MsgspecError as error:
            log.error("rejecting an undecodable message on %s: %s", msg.subject, error)
            await reject(self._js, msg, f"undecodable: {error}")
            return
        if isinstance(event, PodReserved):
            with consume_span(
                "binder bind",
                msg.headers,
                subject=msg.subject,
                pod_uid=event.pod.uid,
                attributes={MESSAGE_ID: event.id},
            ):
                await self.bind(event, msg)
        elif isinstance(event, AllocationCorrected):
            with consume_span(
                "binder rewrite",
                msg.headers,
                subject=msg.subject,
                pod_uid=event.pod.uid,
                attributes={MESSAGE_ID: event.id},
            ):
                await self._wait_for_fold(log_seq(msg))
                await self._rewriter.on_corrected(event, msg)
        else:
            await msg.ack()

    async def bind(self, reservation: PodReserved, msg: Msg) -> None:
        await self._wait_for_fold(log_seq(msg))
        if self._follower.applied_seq >= log_seq(msg) and not needs_binding(
            self._follower.state, reservation
        ):
            log.info("reservation %s needs no binding any more", reservation.id)
            BINDINGS.labels("not_needed").inc()
            await msg.ack()
            return
        asked = await self._lookup(reservation, msg)
        if asked is None:
            return
        try:
            annotations = self.annotations(reservation, asked)
        except (ValueError, KeyError, IndexError) as error:
            await self._fail(reservation, msg, f"cannot build the annotations: {error}")
            return
        if self._gate is not None:
            waited = await unless_stopped(self._gate.wait_serving(reservation.node), self._stopping)
            if waited is None:  # the binder stops: another replica (or the next) binds it
                log.info("stopping; reservation %s goes back to the queue", reservation.id)
                # not at once: this binder's last pull request may still be open, and
                # a message redelivered into it would wait out the ack wait (60 s)
                await msg.nak(delay=2 * self._settings.fetch_wait_s)
                return
        pod = reservation.pod
        with api_span(
            "POST",
            "pods/binding",
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            node=reservation.node,
        ) as span:
            outcome = await bind_pod(
                self._kube,
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                node=reservation.node,
                annotations=annotations,
            )
            record_outcome(span, outcome.result, outcome.status, outcome.message)
        await self._conclude(reservation, msg, outcome, asked)

    async def _lookup(self, reservation: PodReserved, msg: Msg) -> Asked | None:
        """The resource names the pod asked; ``None`` when the message was naked or failed."""
        try:
            return await self._asked.lookup(reservation.pod)
        except KubeError as error:
            if msg.metadata.num_delivered >= self._settings.bind_attempts:
                await self._fail(reservation, msg, f"cannot read the pod: {error.message}")
            else:
                log.warning("reading %s failed (%s); retrying", reservation.pod.key, error)
                BINDINGS.labels("retried").inc()
                await msg.nak(delay=self._settings.retry_delay_s)
            return None

    def annotations(self, reservation: PodReserved, asked: Asked | None = None) -> dict[str, str]:
        """The binding's annotations, with the shares as the fold has them now (a move
        folded before the binding is written is not undone by it)."""
        node = self._follower.state.node(reservation.node)
        allocation = node.pods.get(reservation.pod.uid)
        shares = reservation.shares
        if allocation is not None and allocation.reservation_id == reservation.id:
            shares = allocation.shares
        memory = first_card_memory_mib(node, shares)
        if memory == 0:
            log.warning("no inventory for the card of reservation %s", reservation.id)
        return binding_annotations(
            reservation,
            memory,
            self._settings.memory_unit,
            mgpu=asks_mgpu(asked or {}),
            shares=shares,
        )

    async def _conclude(
        self, reservation: PodReserved, msg: Msg, outcome: BindOutcome, asked: Asked
    ) -> None:
        pod = reservation.pod.key
        if outcome.bound:
            log.info("bound %s to %s (%s)", pod, reservation.node, reservation.id)
            bound = pod_bound(reservation, self._clock.now(), asked)
            await append_event(self._follower.log, bound)
            BINDINGS.labels("bound").inc()
            await msg.ack()
        elif outcome.result == "refused":
            await self._fail(reservation, msg, outcome.message)
        elif msg.metadata.num_delivered >= self._settings.bind_attempts:
            attempts = msg.metadata.num_delivered
            await self._fail(
                reservation, msg, f"gave up after {attempts} attempts: {outcome.message}"
            )
        else:
            log.warning("binding %s failed for now (%s); retrying", pod, outcome.message)
            BINDINGS.labels("retried").inc()
            await msg.nak(delay=self._settings.retry_delay_s)

    async def _fail(self, reservation: PodReserved, msg: Msg, reason: str) -> None:
        log.warning("binding %s to %s refused: %s", reservation.pod.key, reservation.node, reason)
        await append_event(self._follower.log, bind_failed(reservation, self._clock.now(), reason))
        BINDINGS.labels("failed").inc()
        await msg.ack()

    async def _wait_for_fold(self, seq: int) -> None:
        """Let the fold reach this message, so it can tell whether it is still live."""
        deadline = time.monotonic() + self._settings.fold_wait_s
        # The follower has no per-sequence signal (an undecodable message moves
        # applied_seq without calling listeners), so poll; it is normally already there.
        while self._follower.applied_seq < seq and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def _quietly(action: Awaitable[None]) -> bool:
    """Whether ``action`` completed; its failure is logged, not raised."""
    try:
        await action
    except Exception:
        log.exception("acting on a message failed")
        return False
    return True
