"""Names vulture (``make lint``) reports as unused that stay, each with why.

Vulture reads only ``src/gpushare``; these are called from outside it (tests, tools, a
framework) or are declared shapes (msgspec fields, Protocol signatures). A name that
nothing calls and none of these reasons covers is deleted, not listed here.
"""

# ruff: noqa: B018, F821
# mypy: ignore-errors

# Framework callbacks: called by the framework, never by our code.
_.collect  # prometheus_client custom collectors (card_gauges, bus.lag)
inspect_all  # FastAPI route (allocator.extender: GET /inspect)
readyz  # FastAPI route (allocator.extender: GET /readyz)
_.capture_signals  # uvicorn.Server override (allocator.runtime)
_.should_exit  # uvicorn.Server's stop flag, read by uvicorn (allocator.runtime)
_.export  # OpenTelemetry SpanExporter interface (telemetry.dumping)
_.shutdown  # OpenTelemetry SpanExporter interface (telemetry.dumping)
_.force_flush  # OpenTelemetry SpanExporter interface (telemetry.dumping)
timeout_millis  # its parameter, by the interface's name
_.Get  # gRPC servicer method: the test kubelet's pod-resources Get
_.PreStartContainer  # gRPC servicer method: the device plugin's PreStartContainer
_.NodePrepareResources  # gRPC servicer method: the DRA kubelet plugin (node_agent.dra_plugin)
_.NodeUnprepareResources  # gRPC servicer method: the DRA kubelet plugin
_.GetInfo  # gRPC servicer method: plugin registration (node_agent.dra_plugin)
_.NotifyRegistrationStatus  # gRPC servicer method: plugin registration

# Declared shapes: decoded into or typed against, never read by name.
dry_run  # msgspec field of the AdmissionReview wire format (allocator.admission_wire)
patch_type  # msgspec field of the AdmissionResponse wire format (allocator.admission_wire)
from_  # msgspec field of a JSON Patch operation, written as "from" (core.native_names)
failed_nodes  # msgspec field of the extender's FilterResult wire format (allocator.wire)
failed_and_unresolvable_nodes  # msgspec field of FilterResult (allocator.wire)
toleration_seconds  # msgspec field of a Kubernetes Toleration (core.constraints)
scheduler_name  # msgspec field of a pod's spec (core.pods)
module_id  # msgspec field of Koordinator's device-allocated document (core.koordinator)
_.nvmlDeviceGetName  # pynvml's surface, declared in reporter.nvml's Protocol
_.nvmlDeviceGetMemoryInfo  # pynvml's surface, declared in reporter.nvml's Protocol
device1  # Protocol parameter names, pynvml's (reporter.nvml)
device2  # Protocol parameter names, pynvml's (reporter.nvml)
event_types  # Protocol parameter names, pynvml's (reporter.nvml)
timeout_ms  # Protocol parameter names, pynvml's (reporter.nvml)

# Counters and hooks the tests read to see a service work (tests/unit, tests/integration).
_.reads  # binder.asking, binder.sighting: how many API reads a pass made
_.writes  # binder.devices: how many API writes a pass made
_.passes  # binder.reconciling: reconcile passes, counted by the binder tests
_.probes  # binder.reconciling: periodic probes, counted by the binder tests
repaired  # binder.reconciling: annotation repairs, counted by the binder tests
_.bad_messages  # bus.follow: undecodable records skipped, asserted by tests
_.resumed  # bus.follow: resumptions after a NATS outage, asserted by tests
_.wait_for_checks  # node_agent.podresources: tests wait on the periodic check
_.mark_healthy  # reporter fixture and simulated cards: tests heal a card
_.extender_url_of  # cli.stack: tests reach one allocator replica
_.cached_reads  # kube.pod_source: the contract tests see the informers answer
_.starts  # node_agent.dra_plugin: tests see the plugin serve again after its sockets went

# Used by tests and tools (the chaos run, benchmarks), not by the services.
take_snapshot  # core.snapshot: the snapshot tests' round trip (the services capture one)
encode_snapshot  # core.snapshot: its bytes, in that round trip (services use EncodedSnapshot)
_.take_snapshot  # bus.follow: make bench-log and the snapshot tests take one at once
save_snapshot  # bus.snapshots: and save it (the services' keepers save what they encode)
json_depth  # allocator.json_limits: its tests
decode_host_priorities  # allocator.wire: the extender's priority answer, decoded by tests
read_rejected  # bus.rejected: tests read the rejected stream
expand_ids  # core.device_ids: its tests
ALL_EVENT_TYPES  # core.events: tools.generate_schemas and tests cover every event
ALL_DECISION_TYPES  # core.events: tools.generate_schemas and tests cover every decision
select_events  # core.history: its tests
pod_facts  # core.invariants: tools.chaos's judge
check_cluster  # core.invariants: tests (unit, k8s, e2e)
cluster_capacity  # core.policies.workload: what allocator.gpu_capacity keeps; its tests' reference
compare_inspections  # core.invariants: tools.chaos's judge
LINK_PATHS  # core.model: the reporter topology tests
advertised_resources  # core.plugin_resources: its tests
RULES  # core.requests: the rule table, read by tests and the fuzz checks
_.card_count  # core.requests: tests of a request's card count
_.server_version  # embedded.k8s_cluster: tests/k8s
_.reconfigure_scheduler  # embedded.k8s_cluster: tests/k8s, benchmarks.kube_scheduler
_.stop_scheduler  # embedded.k8s_cluster: benchmarks.kube_scheduler
_.scheduler_samples  # embedded.k8s_cluster: tests/k8s, benchmarks.kube_scheduler
_.apiserver_samples  # embedded.k8s_cluster: benchmarks.kube_scheduler
_.wait_synced  # kube.informer: the contract tests wait for the informers
GPU_NODE_KUBELET_CONFIG  # embedded.k8s_cluster: tests/k8s
_.containerd_address  # embedded.k8s_cluster: tests/k8s
_.fail_next  # embedded.kube_api (the API stand-in): fault injection in tests
_.create_pod  # embedded.kube_api: tests create pods in the stand-in
_.set_pod_phase  # embedded.kube_api: tests move pods through phases
_.wait_for_devices  # embedded.kubelet: tests wait for a plugin's devices
wait_for_port  # embedded.nats_server: tests
node_exists  # kube.nodes: its tests
read_spans  # telemetry.dumping: tests read dumped spans
pod_trace_id  # telemetry.pods: tests
TRACEPARENT  # telemetry.propagation: tests
_.pods_per_second  # tracebench.replay: its tests
allocated_bound  # tracebench.bound: its tests check it against exhaustive search
unallocated_bound  # tracebench.bound: its tests; the per-family table (tracebench.cli) to come
_.unallocated  # tracebench.bound.BoundResult: read by its tests and the table to come
_.seconds  # tracebench.bound.BoundResult: as above

settings_table  # settings_spec: tools.generate_settings renders services/*/settings.md
DEFAULT_PODS  # tracebench.cli: the bundled trace's pod list, read by its tests
_.retries  # kube.kubectl: the kubernetes client's Configuration reads it (urllib3 retries)
last_exit  # cli.supervisor: written to services.json, read by `gpushare status`
last_exit_at  # cli.supervisor: written to services.json, read by `gpushare status`
_.stranded  # core.policies.fragmentation: the stranding measure on its own, read by its tests
gpu_pods  # tracebench.variants.Stats: a COLUMNS.md count, printed in --json and tested
_.writelines  # allocator.coalescing: asyncio's Transport interface (uvicorn may call it)
