"""Which trace an ``Allocate`` joins, seen in the ``traceparent`` of its ``ContainerAssigned``.

No tracer provider is installed here: the API's no-op spans still carry their parent's
context, so what the node agent appends shows which parent it chose.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.context import Context

from gpushare.bus.subjects import ALLOCATION_STREAM
from gpushare.core.events import ContainerAssigned, decode_event
from gpushare.node_agent.settings import NodeTarget
from gpushare.telemetry.pods import pod_span_context
from gpushare.telemetry.propagation import TRACEPARENT, attached, extract_headers
from tests.integration.node_agent.conftest import StartAgent, StartKubelet
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu, pod_spec
from tests.integration.node_agent.test_device_plugin import healthy_count

GPU0 = gpu(0)
KUBELET_SPAN = trace.SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=False,
    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
)


async def assigned_context(js: JetStreamContext) -> trace.SpanContext:
    """The span context in the headers of the log's ``ContainerAssigned``."""
    seq = 0
    while True:
        raw = await js.get_msg(ALLOCATION_STREAM, seq=seq + 1, next=True, direct=True)
        assert raw.seq is not None
        seq = raw.seq
        if isinstance(decode_event(raw.data or b""), ContainerAssigned):
            headers = raw.headers or {}
            assert TRACEPARENT in headers
            context = extract_headers(headers)
            assert context is not None
            return trace.get_current_span(context).get_span_context()


async def admit_one(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    caller: Context | None = None,
) -> None:
    """Start the agent and the kubelet, then admit one pod within ``caller``'s context."""
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(4096))
    await book.bind(await book.reserve("pod-uid-1", [("c", GPU0, 1024, False)]))
    with attached(caller):
        await kubelet.admit(pod_spec("pod-uid-1", {"c": 1024}))


async def test_without_grpc_metadata_allocate_joins_the_pods_trace(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    await admit_one(js, target, start_agent, start_kubelet)

    context = await assigned_context(js)

    assert context.trace_id == pod_span_context("pod-uid-1").trace_id
    assert context.span_id == pod_span_context("pod-uid-1").span_id  # no-op spans pass it on


async def test_a_traceparent_in_grpc_metadata_wins(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    caller = trace.set_span_in_context(trace.NonRecordingSpan(KUBELET_SPAN))
    await admit_one(js, target, start_agent, start_kubelet, caller)

    context = await assigned_context(js)

    assert context.trace_id == KUBELET_SPAN.trace_id
    assert context.span_id == KUBELET_SPAN.span_id
