"""The node agent's settings, declared with their flags: frozen, read once in ``__main__``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from gpushare.core.dra import DRIVER
from gpushare.core.events import FrontDoor
from gpushare.core.plugin_resources import DEFAULT_DIALECTS, DIALECTS, SOCKETS, resources_of
from gpushare.flags import DEFAULT_NATS_URL, FRONT_DOOR, MEMORY_UNIT, METRICS_PORT, NATS
from gpushare.settings_spec import Setting, SettingsError, number

"""The extended resource of seeds 000/001; its plugin matches Allocate as ever."""

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

    @property
    def plugins_registry(self) -> Path:
        """The kubelet's plugin registry (``<root>/plugins_registry``): where a DRA plugin's
        registration socket goes."""
        return self.plugin_dir.parent / "plugins_registry"

    @property
    def dra_registration_socket(self) -> Path:
        return self.plugins_registry / f"{DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        """The DRA plugin's own socket (``<root>/plugins/<driver>/dra.sock``)."""
        return self.plugin_dir.parent / "plugins" / DRIVER / "dra.sock"


@dataclass(frozen=True)
class AgentSettings:
    """How one node agent behaves; every node it serves shares these."""

    nats_url: Annotated[str, NATS] = DEFAULT_NATS_URL
    """NATS servers, comma separated (``GPUSHARE_NATS_URL`` / ``--nats``)."""
    memory_unit: Annotated[
        str,
        dataclasses.replace(
            MEMORY_UNIT, help="one device ID per this much GPU memory; cluster-wide"
        ),
    ] = "MiB"
    """``MiB`` or ``GiB``: one device ID per unit (``GPUSHARE_MEMORY_UNIT``); cluster-wide."""
    nodes: Annotated[
        tuple[str, ...],
        Setting(
            flag="--node",
            env="NODE_NAME",
            kind="repeat",
            metavar="NAME[=PLUGIN_DIR]",
            help=f"a node to serve, with its kubelet's device-plugins directory (default "
            f"{DEVICE_PLUGIN_PATH}); repeat for simulated nodes",
        ),
    ] = ()
    """``NAME[=PLUGIN_DIR]`` of each node served: :attr:`targets`."""
    pod_resources_sockets: Annotated[
        tuple[str, ...],
        Setting(
            flag="--pod-resources-socket",
            kind="repeat",
            metavar="[NAME=]PATH",
            shown_default="<plugin dir>/../pod-resources/kubelet.sock",
            help="the kubelet's pod-resources socket, for all nodes or for node NAME",
        ),
    ] = ()
    dialects: Annotated[
        tuple[str, ...],
        Setting(
            flag="--dialect",
            env="GPUSHARE_DIALECTS",
            kind="repeat",
            parse=parse_dialect,
            metavar="NAME",
            help="advertise this dialect's resources, one plugin socket each: "
            + ", ".join(DIALECTS)
            + " (repeat, or comma-separate in the variable)",
        ),
    ] = DEFAULT_DIALECTS
    registration_poll_seconds: float = 1.0
    """How often to look for a kubelet restart (our socket gone, kubelet.sock replaced)."""
    register_retry_seconds: float = 1.0
    """Pause between attempts to register while the kubelet is not there yet."""
    match_wait_seconds: Annotated[
        float,
        Setting(
            flag="--match-wait",
            parse=number(float, low=0),
            help="seconds Allocate waits for the log to show a bound pod before refusing",
        ),
    ] = 5.0
    """How long Allocate waits for the log to catch up (a ``PodBound`` not yet folded).

    The binder appends ``PodBound`` just after the API accepted the binding, so the
    kubelet may admit a pod a moment before this node's fold has seen it."""
    reconcile_interval_seconds: Annotated[
        float,
        Setting(
            flag="--reconcile-interval",
            parse=number(float, low=0),
            help="seconds between checks of the kubelet's pod-resources against the log; "
            "0: only after Allocate",
        ),
    ] = 30.0
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
    metrics_port: Annotated[int, METRICS_PORT] = 0
    """Port for Prometheus metrics on all interfaces; 0 (default) serves none."""
    front_door: Annotated[FrontDoor, FRONT_DOOR] = "extender"
    """``--front-door`` / ``GPUSHARE_FRONT_DOOR``: with ``dra`` the agent serves the DRA
    kubelet plugin (``docs/dra.md``)."""
    cdi_dir: Annotated[
        Path,
        Setting(
            flag="--cdi-dir",
            parse=Path,
            metavar="DIR",
            help="where the DRA plugin writes the CDI specs of prepared claims",
        ),
    ] = Path("/var/run/cdi")
    """``--cdi-dir``: the container runtime's CDI spec directory."""

    @property
    def resources(self) -> tuple[str, ...]:
        """The extended resources registered with the kubelet, one plugin socket each."""
        return resources_of(self.dialects)

    @property
    def targets(self) -> list[NodeTarget]:
        """The nodes served; raises :class:`SettingsError` for none or for bad ``--node``."""
        return parse_targets(self.nodes, self.pod_resources_sockets)


def parse_dialect(text: str) -> str:
    if text not in DIALECTS:
        raise SettingsError(f"unknown dialect {text!r} (known: {', '.join(DIALECTS)})")
    return text


def parse_targets(nodes: Sequence[str], sockets: Sequence[str]) -> list[NodeTarget]:
    """``NAME[=DIR]`` specs and ``[NAME=]PATH`` sockets into targets; raises SettingsError."""
    if not nodes:
        raise SettingsError("no node to serve: pass --node NAME[=PLUGIN_DIR] or set NODE_NAME")
    pairs = [spec.partition("=") for spec in nodes]
    names = {name for name, _, _ in pairs}
    if "" in names or len(names) != len(pairs):
        raise SettingsError(f"--node names must be non-empty and unique: {list(nodes)}")
    shared: Path | None = None
    per_node: dict[str, Path] = {}
    for value in sockets:
        name, sep, path = value.partition("=")
        if sep and name in names:
            per_node[name] = Path(path)
        else:
            shared = Path(value)
    return [
        NodeTarget(
            name=name,
            plugin_dir=Path(directory) if directory else DEVICE_PLUGIN_PATH,
            pod_resources_socket=per_node.get(name, shared),
        )
        for name, _, directory in pairs
    ]
