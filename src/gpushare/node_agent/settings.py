"""The node agent's settings: frozen, read once in ``__main__`` and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpushare.flags import DEFAULT_NATS_URL
from gpushare.node_agent.resources import DEFAULT_DIALECTS, SOCKETS, resources_of

RESOURCE_NAME = "aliyun.com/gpu-mem"
"""The extended resource of seeds 000/001; its plugin matches Allocate as ever."""

DEFAULT_RESOURCES = resources_of(DEFAULT_DIALECTS)
"""``aliyun.com/gpu-mem`` and ``gpushare.io/gpu-core``, ``-memory-ratio`` and ``gpu``."""

API_VERSION = "v1beta1"
"""The only device plugin API version the kubelet supports."""

DEVICE_PLUGIN_PATH = Path("/var/lib/kubelet/device-plugins")
"""The kubelet's device-plugins directory (``DevicePluginPath``)."""

KUBELET_SOCKET_NAME = "kubelet.sock"
"""The kubelet's registration socket, inside the device-plugins directory."""

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
"""The kubelet's device manager checkpoint, inside the device-plugins directory."""

PLUGIN_SOCKET_NAME = "gpushare-gpu-mem.sock"
"""Our socket, inside the same directory; the kubelet resolves it relative to that dir."""


def default_pod_resources_socket(plugin_dir: Path) -> Path:
    """``<plugin_dir>/../pod-resources/kubelet.sock``: the kubelet's layout beside a plugin dir."""
    return plugin_dir.parent / "pod-resources" / "kubelet.sock"


@dataclass(frozen=True)
class NodeTarget:
    """One node this process serves (several only when simulating nodes on one machine)."""

    name: str
    """The Kubernetes node name (``NODE_NAME`` in a DaemonSet)."""
    plugin_dir: Path = DEVICE_PLUGIN_PATH
    """The kubelet's device-plugins directory for this node (default ``DEVICE_PLUGIN_PATH``)."""
    pod_resources_socket: Path | None = None
    """The kubelet's pod-resources socket; ``None`` means ``default_pod_resources_socket``."""

    @property
    def plugin_socket(self) -> Path:
        """The ``aliyun.com/gpu-mem`` plugin's socket."""
        return self.plugin_dir / PLUGIN_SOCKET_NAME

    def socket_of(self, resource: str) -> Path:
        """The plugin socket serving ``resource`` (see ``resources.SOCKETS``)."""
        return self.plugin_dir / SOCKETS[resource]

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET_NAME

    @property
    def checkpoint(self) -> Path:
        """The kubelet's device checkpoint: read when pod-resources cannot be reached."""
        return self.plugin_dir / CHECKPOINT_NAME

    @property
    def pod_resources(self) -> Path:
        return self.pod_resources_socket or default_pod_resources_socket(self.plugin_dir)


@dataclass(frozen=True)
class AgentSettings:
    """How one node agent behaves; every node it serves shares these."""

    nats_url: str = DEFAULT_NATS_URL
    """NATS servers, comma separated (``GPUSHARE_NATS_URL`` / ``--nats``)."""
    memory_unit: str = "MiB"
    """``MiB`` or ``GiB``: one device ID per unit (``GPUSHARE_MEMORY_UNIT``); cluster-wide."""
    resources: tuple[str, ...] = DEFAULT_RESOURCES
    """The extended resources registered with the kubelet, one plugin socket each
    (``--dialect`` / ``GPUSHARE_DIALECTS``; default the ``aliyun`` and ``gpushare`` ones)."""
    registration_poll_seconds: float = 1.0
    """How often to look for a kubelet restart (our socket gone, kubelet.sock replaced)."""
    register_retry_seconds: float = 1.0
    """Pause between attempts to register while the kubelet is not there yet."""
    match_wait_seconds: float = 5.0
    """How long Allocate waits for the log to catch up (a ``PodBound`` not yet folded).

    The binder appends ``PodBound`` just after the API accepted the binding, so the
    kubelet may admit a pod a moment before this node's fold has seen it."""
    reconcile_interval_seconds: float = 30.0
    """How often the pod-resources check runs on its own; 0 = only when poked."""
    missing_grace_seconds: float = 120.0
    """How long the kubelet must go on not listing a container the log says it holds
    before that is recorded (``missing_from_kubelet``): a kubelet that just restarted
    lists its pods again only after re-admitting them, which with many device IDs takes
    tens of seconds (``docs/node-agent.md``)."""
    reconcile_after_allocate: bool = True
    """Also run the pod-resources check right after each successful Allocate."""
    reconcile_at_start: bool = True
    """Run the check once at start, so a restarted agent re-asserts the foreign cards."""
    metrics_port: int = 0
    """Port for Prometheus metrics on all interfaces; 0 (default) serves none."""
