"""Running the whole system on one machine: nats-server, the four services, simulated
GPU nodes, and a Kubernetes API. ``gpushare up``, ``gpushare demo``, the end-to-end tests,
the real-Kubernetes tier and the chaos run (``tools.chaos``) all use it.

Which Kubernetes: a real control plane it starts from ``k8s_bin`` (kube-apiserver,
kube-scheduler calling the first allocator as its extender, kube-controller-manager; like
controller-runtime's envtest), a cluster given by ``kubeconfig``, or else a local API
stand-in. Which kubelets: real ones (``real_kubelet``: containerd and runc, root) on the
control plane it started; real ones already serving some nodes (``kubelet_nodes``, or
found by their reported kubelet version in a given cluster); a test kubelet for the rest.

Every service runs as its own process, started through the same ``gpushare`` command an
operator would run, so what is tested here is what ships; each node has its own reporter
and node agent, as on a cluster. Each process keeps the arguments and environment it was
started with, so a fault can be injected into it (:meth:`Stack.kill`, :meth:`Stack.pause`)
and it can be brought back exactly as it was (:meth:`Stack.restart`); nats-server can be
restarted on the same port and store (:meth:`Stack.restart_nats`).

NATS is secured as ``deploy/`` secures it (``StackConfig.secure``, the default): TLS, and
each service and node its own user with only its permissions, with certificates and
passwords made at each start (:mod:`gpushare.embedded.secure_bus`); admin creates the
streams before any service starts. A test, a tool or an operator command connects as
``auditor`` (or another user) with :meth:`Stack.credentials` or :meth:`Stack.client_env`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpushare.bus import credentials as nats_variables
from gpushare.bus.credentials import NatsCredentials
from gpushare.core.plugin_resources import DEFAULT_DIALECTS, DIALECTS, SOCKETS
from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_cluster import ControlPlane, KubeletEndpoints, RealNode
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from gpushare.embedded.local_webhooks import LocalWebhooks
from gpushare.embedded.nats_server import (
    NatsServer,
    exit_reason,
    free_port,
    server_url,
)
from gpushare.embedded.nats_server import log_tail as file_tail
from gpushare.embedded.secure_bus import (
    SecureBus,
    create_streams,
    service_user,
    write_secure_bus,
)
from gpushare.kube import bringup as stack_kube
from gpushare.node_agent.settings import DEVICE_PLUGIN_PATH, default_pod_resources_socket
from gpushare.node_agent.sockets import socket_path_problem
from gpushare.reporter.settings import SimulatedNode, parse_simulated_node

CRDS_DIR = Path(__file__).resolve().parents[3] / "deploy" / "base" / "crds"
"""The CRDs the stand-in installs (a source checkout's; none when the directory is absent)."""

WEBHOOK_REPLICA = "webhook"
"""The allocator replica that serves the admission webhooks on a real control plane."""

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
SHELL_CREDENTIALS = (
    nats_variables.USER,
    nats_variables.PASSWORD,
    nats_variables.PASSWORD_FILE,
    nats_variables.CREDS,
    nats_variables.CA,
    nats_variables.CERT,
    nats_variables.KEY,
)
"""NATS credentials no child inherits from the starting shell's environment: a service
gets its own user's (none without ``StackConfig.secure``)."""
METRICS_PORT_VARIABLE = "GPUSHARE_METRICS_PORT"
"""Not inherited either: one port for every service would make all but the first fail to
listen; each gets its own ``--metrics-port`` (``StackConfig.metrics_port``) or none."""
NOT_INHERITED = (*SHELL_CREDENTIALS, METRICS_PORT_VARIABLE)
SOCKET_DIR_PREFIX = "gs-"
LONGEST_SOCKET = max(
    [*(f"device-plugins/{name}" for name in SOCKETS.values()), "pod-resources/kubelet.sock"],
    key=len,
)
"""The longest socket path under a node's kubelet directory."""
NATS_CLIENTS = ("reporter", "node-agent", "allocator", "binder")
"""The commands that connect to NATS, each as its own user."""


parse_node = parse_simulated_node
"""``NAME=MIB[,MIB...]`` exactly as the reporter reads it (a ``ValueError`` says what is wrong)."""


def _die_with_parent() -> None:
    """In the child, before exec: ask the kernel for SIGTERM when the parent thread dies."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def node_flag(node: SimulatedNode) -> str:
    return f"{node.name}={','.join(str(size) for size in node.cards_mib)}"


def replica_name(kind: str, replica: int) -> str:
    """``allocator``, ``allocator-1``, ...: the first replica keeps the plain name."""
    return kind if replica == 0 else f"{kind}-{replica}"


def node_process_name(kind: str, node: str, nodes: int) -> str:
    """``reporter`` / ``node-agent`` of ``node``: the plain name in a one-node stack,
    ``node-agent-<node>`` when there are several (:meth:`Stack.names` lists them all)."""
    return kind if nodes == 1 else f"{kind}-{node}"


@dataclass
class StackConfig:
    data_dir: Path
    nodes: Sequence[SimulatedNode]
    nats_port: int = 0
    extender_port: int = 39999
    kubeconfig: Path | None = None
    """A real cluster's kubeconfig; without one (nor ``k8s_bin``) an API stand-in runs."""
    k8s_bin: Path | None = None
    """Start a real control plane from the Kubernetes binaries in this directory."""
    real_kubelet: bool = False
    """Serve every node with a real kubelet on that control plane (needs ``k8s_bin``)."""
    kubelet_env: Mapping[str, str] = field(default_factory=dict)
    """Settings for those kubelets (``kubelet-up.sh``'s ``K8S_KUBELET_*`` variables)."""
    kubelet_nodes: Mapping[str, KubeletEndpoints] = field(default_factory=dict)
    """Nodes that real kubelets serve already: the node agent registers on their plugin
    directory and reads their pod-resources socket; no test kubelet serves them."""
    extender: ExtenderStanza | None = None
    """The scheduler's extender stanza for ``k8s_bin``; default: as ``deploy/`` configures
    it. An empty ``url_prefix`` is the first allocator's over plain HTTP (give the whole
    URL for HTTPS, with the allocator's TLS flags in ``service_args``)."""
    memory_unit: str = "MiB"
    allocators: int = 1
    binders: int = 1
    """Binder replicas; they share the durable consumer ``binder``, so each reservation
    is claimed by one of them at a time."""
    heartbeat_seconds: float = 2.0
    extra_env: dict[str, str] = field(default_factory=dict)
    die_with_parent: bool = False
    """SIGTERM every service when the thread that started it dies (Linux
    ``PR_SET_PDEATHSIG``): a test worker killed at its timeout, a SIGKILLed ``gpushare up``
    leave none behind. Start and restart processes from one long-lived thread then."""
    service_args: dict[str, list[str]] = field(default_factory=dict)
    """More flags per command, e.g. ``{"allocator": ["--bind-wait", "5"]}``."""
    secure: bool = True
    """NATS with TLS and a user per service and node, as ``deploy/`` runs it (credentials
    new at each start, in ``data_dir/nats``); False: plain NATS that anyone may use for
    anything (``gpushare up --insecure``)."""
    policy: str | None = None
    """The allocators' ``--policy`` (None: theirs)."""
    dialects: Sequence[str] = ()
    """The node agents' ``--dialect`` flags (empty: their default)."""
    topology: str | None = None
    """The reporters' ``--topology`` for the simulated cards (None: theirs)."""
    mps: str | None = None
    """The reporters' ``--mps`` (None: theirs)."""
    metrics_port: int = 0
    """The first of the services' ``--metrics-port``s: each reporter, binder and node
    agent gets the next one (:attr:`Stack.metrics_ports`); 0: none serve ``/metrics``
    besides the allocators (on their own port)."""
    socket_dir: Path | None = None
    """Where the test kubelet's and the node agents' unix sockets go (``<dir>/<node>/``);
    None: ``data_dir/kubelet``, or a short temporary directory under /tmp when those paths
    would pass the unix socket limit (107 bytes)."""


@dataclass
class Stack:
    """The running system. Use as a context manager, or call start() and stop()."""

    config: StackConfig
    nats: NatsServer | None = None
    kubeconfig: Path | None = None
    extender_ports: list[int] = field(default_factory=list)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)
    """The ``gpushare`` arguments of each process, to start it again the same way."""
    down: set[str] = field(default_factory=set)
    """Processes killed on purpose: :meth:`check_alive` does not count them as failures."""
    paused: set[str] = field(default_factory=set)
    allocator_ports: dict[str, int] = field(default_factory=dict)
    control_plane: ControlPlane | None = None
    webhooks: LocalWebhooks | None = None
    """The admission webhooks in front of a real control plane's pods (none otherwise:
    the API stand-in calls none, and a given cluster has its own)."""
    """The real control plane this stack started (``k8s_bin``)."""
    real_nodes: dict[str, RealNode] = field(default_factory=dict)
    """The real kubelets this stack started (``real_kubelet``) or was handed (a test's);
    :meth:`restart_kubelet` restarts them, :meth:`stop` stops them."""
    kubelet_endpoints: dict[str, KubeletEndpoints] = field(default_factory=dict)
    """Every node a real kubelet serves, started here or not."""
    secure_bus: SecureBus | None = None
    """The NATS users, passwords and certificates of this start (``config.secure``)."""
    process_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Each process's own environment (its NATS user), to start it again the same way."""
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """Where each process serves Prometheus ``/metrics`` (allocators: their own port)."""
    socket_dir: Path | None = None
    """Where the nodes' kubelet directories are (:attr:`StackConfig.socket_dir`), once
    started."""
    _own_socket_dir: bool = False

    @property
    def logs_dir(self) -> Path:
        return self.config.data_dir / "logs"

    @property
    def nats_url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    @property
    def nats_dir(self) -> Path:
        """Certificates, passwords and nats-server's config (``config.secure``)."""
        return self.config.data_dir / "nats"

    def credentials(self, user: str = "auditor") -> NatsCredentials:
        """How ``user`` (``auditor``, ``admin``, or a service's) connects to this stack's
        NATS from this process; anonymous without ``config.secure``."""
        if not self.config.secure:
            return NatsCredentials()
        return self._secure_bus().credentials(user)

    def client_env(self, user: str = "auditor") -> dict[str, str]:
        """The environment of a ``gpushare audit``, ``inspect`` or ``explain`` run against
        this stack as ``user`` (with ``--nats`` :attr:`nats_url`); empty without
        ``config.secure``."""
        if not self.config.secure:
            return {}
        return self._secure_bus().client_env(user)

    def _secure_bus(self) -> SecureBus:
        if self.secure_bus is None:
            raise RuntimeError("the stack's NATS credentials are made when it starts")
        return self.secure_bus

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.extender_ports[0]}/gpushare-scheduler"

    def extender_url_of(self, allocator: str) -> str:
        return f"http://127.0.0.1:{self.allocator_ports[allocator]}/gpushare-scheduler"

    def names(self, kind: str) -> list[str]:
        """The processes running ``gpushare <kind>`` (e.g. every allocator replica that
        kube-scheduler calls, every node's node agent); not the webhook replica, which
        only kube-apiserver calls, over HTTPS."""
        return [
            name for name, args in self.argv.items() if args[0] == kind and name != WEBHOOK_REPLICA
        ]

    def node_process(self, kind: str, node: str) -> str:
        """The name of ``node``'s ``reporter`` or ``node-agent`` process."""
        return node_process_name(kind, node, len(self.config.nodes))

    def plugin_dir(self, node: str) -> Path:
        """The device plugin directory of ``node``'s kubelet (real or test)."""
        if node in self.kubelet_endpoints:
            return self.kubelet_endpoints[node].device_plugin_dir
        # unix socket paths are limited to 107 bytes: keep these short and absolute
        return (self.socket_dir or self.config.data_dir / "kubelet") / node / "device-plugins"

    def _choose_socket_dir(self) -> None:
        """``config.socket_dir``, else ``data_dir/kubelet`` if every node's sockets fit
        there, else a new short directory under /tmp (removed at :meth:`stop`); raises
        ``ValueError`` when even that is too long (a very long node name)."""
        if self.config.socket_dir is not None:
            self.socket_dir = self.config.socket_dir
        else:
            self.socket_dir = self.config.data_dir.resolve() / "kubelet"
            if any(self._socket_problem(node.name) for node in self.config.nodes):
                short = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir="/tmp")
                self.socket_dir, self._own_socket_dir = Path(short), True
                log.info("unix sockets in %s: %s is too long a path", short, self.config.data_dir)
        for node in self.config.nodes:
            problem = self._socket_problem(node.name)
            if problem:
                raise ValueError(problem)

    def _socket_problem(self, node: str) -> str | None:
        assert self.socket_dir is not None
        return socket_path_problem(self.socket_dir / node / LONGEST_SOCKET)

    def pod_resources_socket(self, node: str) -> Path:
        """The pod-resources socket of ``node``'s kubelet (real or test)."""
        if node in self.kubelet_endpoints:
            return self.kubelet_endpoints[node].pod_resources_socket
        return default_pod_resources_socket(self.plugin_dir(node))

    @property
    def test_kubelet_nodes(self) -> list[str]:
        """The nodes the test kubelet serves (no real kubelet does)."""
        return [n.name for n in self.config.nodes if n.name not in self.kubelet_endpoints]

    def __enter__(self) -> Stack:
        return self if self.processes else self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> Stack:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self.secure_bus = None  # new credentials at each start
        try:
            self._choose_socket_dir()
            self._start_nats()
            if self.config.secure:
                create_streams(self.nats_url, self.credentials("admin"))
            self._choose_allocator_ports()
            self._start_kube_api(timeout)
            self._start_kubelets()
            self._start_services()
            self.wait_ready(timeout)
            self._install_webhooks(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_nats(self, port: int | None = None) -> None:
        """nats-server on ``port`` (default ``config.nats_port``, 0: a free one); with
        ``config.secure`` its TLS and users, made once per :meth:`start` (a restart of
        nats-server keeps them)."""
        port = port or self.config.nats_port or free_port()
        bus: SecureBus | None = None
        if self.config.secure:
            if self.secure_bus is None:
                nodes = [node.name for node in self.config.nodes]
                url = server_url(port, tls=True)
                self.secure_bus = write_secure_bus(self.nats_dir, nodes, url=url)
            bus = self.secure_bus
        self.nats = NatsServer(
            self.config.data_dir / "jetstream",
            port=port,
            log_file=self.logs_dir / "nats-server.log",
            config=bus.config if bus else None,
            tls=bus is not None,
            env=bus.server_env() if bus else None,
            preexec=_die_with_parent if self.config.die_with_parent else None,
        ).start()

    def _choose_allocator_ports(self) -> None:
        first = self.config.extender_port
        self.extender_ports.clear()
        self.allocator_ports.clear()
        for replica in range(self.config.allocators):
            port = first + replica if first else free_port()
            self.extender_ports.append(port)
            self.allocator_ports[replica_name("allocator", replica)] = port

    def _start_kube_api(self, timeout: float) -> None:
        if self.config.kubeconfig is not None:
            self.kubeconfig = self.config.kubeconfig
            return
        if self.config.k8s_bin is not None:
            self._start_control_plane(self.config.k8s_bin)
            return
        if self.config.real_kubelet:
            raise ValueError("real kubelets need a real control plane: give k8s_bin")
        self.kubeconfig = self.config.data_dir / "kubeconfig"
        with contextlib.suppress(FileNotFoundError):
            self.kubeconfig.unlink()
        port = free_port()
        nodes = [arg for node in self.config.nodes for arg in ("--node", node.name)]
        args = ["kube-api", "--port", str(port), "--kubeconfig-out", str(self.kubeconfig)]
        crds = [arg for path in sorted(CRDS_DIR.glob("*.yaml")) for arg in ("--crd", str(path))]
        self.spawn("kube-api", [*args, *nodes, *crds])
        deadline = time.monotonic() + timeout
        while not self.kubeconfig.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the Kubernetes API stand-in wrote no kubeconfig")
            time.sleep(0.05)

    def _start_control_plane(self, k8s_bin: Path) -> None:
        binaries = K8sBinaries.find(k8s_bin, kubelet=self.config.real_kubelet)
        stanza = self.config.extender or ExtenderStanza(url_prefix="")
        if not stanza.url_prefix:
            stanza = replace(stanza, url_prefix=extender_url(self.extender_ports[0]))
        self.control_plane = ControlPlane(
            binaries=binaries, extenders=[stanza], logs_kept_in=self.logs_dir / "kubernetes"
        ).start()
        self.kubeconfig = self.control_plane.kubeconfig
        stack_kube.install_crds(self.kubeconfig, sorted(CRDS_DIR.glob("*.yaml")))
        self.webhooks = LocalWebhooks.prepare(self.config.data_dir / "webhook", free_port())

    def _start_kubelets(self) -> None:
        """Real kubelets first: a device plugin registers with a kubelet already serving."""
        self.kubelet_endpoints.update(self.config.kubelet_nodes)
        if self.config.real_kubelet:
            assert self.control_plane is not None
            for node in self.config.nodes:
                if node.name not in self.kubelet_endpoints:
                    real = RealNode(
                        self.control_plane, node.name, env=self.config.kubelet_env
                    ).start()
                    self.real_nodes[node.name] = real
                    self.kubelet_endpoints[node.name] = real.endpoints
        elif self.config.kubeconfig is not None:
            self._adopt_kubelet_nodes()

    def _adopt_kubelet_nodes(self) -> None:
        """Nodes of a given cluster that a real kubelet serves get no test kubelet."""
        assert self.kubeconfig is not None
        names = [n.name for n in self.config.nodes if n.name not in self.kubelet_endpoints]
        for name, version in stack_kube.served_by_kubelets(self.kubeconfig, names).items():
            log.warning(
                "node %s is served by kubelet %s: no test kubelet for it; the node agent "
                "registers on %s",
                name,
                version,
                DEVICE_PLUGIN_PATH,
            )
            self.kubelet_endpoints[name] = KubeletEndpoints(
                DEVICE_PLUGIN_PATH, default_pod_resources_socket(DEVICE_PLUGIN_PATH)
            )

    def _start_services(self) -> None:
        """Each node's reporter, the binders, each node's node agent, the test kubelet,
        the allocators: each process with its own NATS user (``config.secure``)."""
        nats = ["--nats", self.nats_url]
        unit = ["--memory-unit", self.config.memory_unit]
        kubeconfig = ["--kubeconfig", str(self.kubeconfig)]
        heartbeat = ["--heartbeat", str(self.config.heartbeat_seconds)]
        sharing = self._reporter_flags()
        self.metrics_ports.clear()
        for node in self.config.nodes:
            name = self.node_process("reporter", node.name)
            args = ["reporter", *nats, "--node", node_flag(node), *heartbeat, *sharing]
            self._spawn_service(name, [*args, *self._metrics_flags(name)], node.name)
        for replica in range(self.config.binders):
            name = replica_name("binder", replica)
            args = ["binder", *nats, *unit, *kubeconfig, *self._metrics_flags(name)]
            self._spawn_service(name, args)
        dialects = [arg for name in self.config.dialects for arg in ("--dialect", name)]
        for node in self.config.nodes:
            self.plugin_dir(node.name).mkdir(parents=True, exist_ok=True)
            name = self.node_process("node-agent", node.name)
            args = ["node-agent", *nats, *unit, *self._agent_node_flags(node.name), *dialects]
            self._spawn_service(name, [*args, *self._metrics_flags(name)], node.name)
        test_nodes = self.test_kubelet_nodes
        if test_nodes:
            dirs = [
                arg for name in test_nodes for arg in ("--node", f"{name}={self.plugin_dir(name)}")
            ]
            self._spawn_service("kubelet", ["kubelet", *kubeconfig, *dirs])
        policy = ["--policy", self.config.policy] if self.config.policy else []
        for name, port in self.allocator_ports.items():
            args = ["allocator", *nats, *unit, *kubeconfig, "--port", str(port), *policy]
            # loopback only, plain HTTP: /inspect (gpushare inspect, the tests' judges)
            # is open to this machine's users, as the rest of the local stack is
            local = ["--host", "127.0.0.1", "--inspect-open"]
            self.metrics_ports[name] = port
            self._spawn_service(name, [*args, *local, "--id", name])
        if self.webhooks is not None:  # one more replica, over HTTPS, for kube-apiserver
            args = ["allocator", *nats, *unit, *kubeconfig, *policy]
            flags = [*self.webhooks.allocator_flags(), "--id", WEBHOOK_REPLICA]
            self._spawn_service(WEBHOOK_REPLICA, [*args, *flags])

    def _reporter_flags(self) -> list[str]:
        topology = ["--topology", self.config.topology] if self.config.topology else []
        return [*topology, *(["--mps", self.config.mps] if self.config.mps else [])]

    def _metrics_flags(self, name: str) -> list[str]:
        """``--metrics-port`` for ``name``: the next of ``config.metrics_port`` on (none
        when it is 0)."""
        if not self.config.metrics_port:
            return []
        if name not in self.metrics_ports:
            self.metrics_ports[name] = self.config.metrics_port + len(self.metrics_ports)
        return ["--metrics-port", str(self.metrics_ports[name])]

    def _agent_node_flags(self, node: str) -> list[str]:
        """``--node`` (its kubelet's plugin directory) and, for a real kubelet, its
        ``--pod-resources-socket``."""
        flags = ["--node", f"{node}={self.plugin_dir(node)}"]
        if node in self.kubelet_endpoints:
            socket = self.kubelet_endpoints[node].pod_resources_socket
            flags += ["--pod-resources-socket", f"{node}={socket}"]
        return flags

    def _spawn_service(self, name: str, args: list[str], node: str = "") -> None:
        """``gpushare <args>`` as ``name``; a NATS client gets its user's credentials."""
        command = args[0]
        if self.config.secure and command in NATS_CLIENTS:
            self.process_env[name] = self._secure_bus().client_env(service_user(command, node))
        self.spawn(name, [*args, *self.config.service_args.get(command, [])])

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start ``gpushare <args>`` as a child process logging to ``logs/<name>.log``,
        with its own environment (:attr:`process_env`) and ``config.extra_env``."""
        inherited = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        own = self.process_env.get(name, {})
        # a service that crashes in C (a segfault, an abort) writes its threads' stacks
        env = {
            **inherited,
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
            **own,
            **self.config.extra_env,
        }
        with open(self.logs_dir / f"{name}.log", "ab") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpushare.cli.main", *args],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.config.die_with_parent else None,  # noqa: PLW1509
            )
        self.processes[name] = process
        self.argv[name] = list(args)
        self.down.discard(name)
        self.paused.discard(name)
        return process

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every allocator says /readyz (it has replayed the log) and nothing died."""
        deadline = time.monotonic() + timeout
        for name in self.allocator_ports:
            self.check_alive()
            self.wait_allocator(name, deadline - time.monotonic())
        self.wait_nodes_registered(deadline)

    def _install_webhooks(self, timeout: float) -> None:
        """``deploy/``'s admission webhooks, once their replica serves (pods are judged
        and renamed at creation as on a deployed cluster)."""
        if self.webhooks is None:
            return
        assert self.kubeconfig is not None
        self.webhooks.wait_ready(timeout, self.check_alive)
        stack_kube.install_webhooks(self.kubeconfig, self.webhooks.manifests())

    def wait_allocator(self, name: str, timeout: float = 60.0) -> None:
        """Until allocator ``name`` answers /readyz with 200 (it has replayed the log);
        any process that exits meanwhile fails it at once (:meth:`check_alive`)."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.allocator_ports[name]}/readyz"
        while True:
            self.check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"allocator {name} ({url}) not ready after {timeout:.0f}s")
            time.sleep(0.1)

    def wait_nodes_registered(self, deadline: float) -> None:
        """Until every simulated node advertises GPU memory (its device plugin registered;
        the first resource of the first ``config.dialects`` when given).

        Like a real cluster: kube-scheduler offers a node for gpu-mem pods only once the
        kubelet reports the plugin's resource in the node's allocatable.
        """
        assert self.kubeconfig is not None
        api = stack_kube.core_api(self.kubeconfig)
        resource = self.advertised_resource
        waiting = {node.name for node in self.config.nodes}
        while waiting:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes {sorted(waiting)} advertise no {resource}")
            waiting -= stack_kube.nodes_advertising(api, resource)
            time.sleep(0.1)

    @property
    def advertised_resource(self) -> str:
        """The resource every node's agent advertises first (``aliyun.com/gpu-mem`` by
        default)."""
        dialects = list(self.config.dialects) or list(DEFAULT_DIALECTS)
        return DIALECTS[dialects[0]][0] if dialects[0] in DIALECTS else GPU_MEM

    def exited(self) -> dict[str, int]:
        """The processes that exited without being killed on purpose: their return codes."""
        found = {}
        for name, process in self.processes.items():
            code = process.poll()
            if code is not None and name not in self.down:
                found[name] = code
        return found

    def check_alive(self) -> None:
        """Raise if a process exited that was not killed on purpose, or nats-server did."""
        for name, code in self.exited().items():
            tail = self.log_tail(name)
            raise RuntimeError(f"{name} {exit_reason(code)}; its log ends:\n{tail}")
        nats = self.nats.process if self.nats is not None else None
        if nats is not None and nats.poll() is not None:
            tail = self.log_tail("nats-server")
            raise RuntimeError(f"nats-server {exit_reason(nats.returncode)}; its log ends:\n{tail}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        return file_tail(self.logs_dir / f"{name}.log", lines)

    # -- faults -------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL ``name``: no shutdown, no goodbye, like a node losing power."""
        process = self.processes[name]
        self.down.add(name)
        self.paused.discard(name)
        if process.poll() is None:
            process.kill()
        process.wait()

    def restart(self, name: str, timeout: float = 60.0) -> subprocess.Popen[bytes]:
        """Start ``name`` again with the arguments it had (stopping it first if it runs).

        An allocator is waited for until it has replayed the log and serves again.
        """
        self._terminate(name, timeout=10.0)
        process = self.spawn(name, self.argv[name])
        if name in self.allocator_ports:
            self.wait_allocator(name, timeout)
        return process

    def pause(self, name: str) -> None:
        """SIGSTOP ``name``: it holds its connections but does nothing until :meth:`resume`."""
        self.processes[name].send_signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGCONT)
        self.paused.discard(name)

    def restart_nats(self, hard: bool = False, timeout: float = 10.0) -> None:
        """Stop nats-server (SIGTERM, or SIGKILL if ``hard``) and start it again on the same
        port and store; the services reconnect by themselves."""
        assert self.nats is not None
        port = self.nats.port
        if hard and self.nats.process is not None:
            self.nats.process.kill()
            self.nats.process.wait()
            self.nats.process = None
        else:
            self.nats.stop(timeout)
        self._start_nats(port)

    def _terminate(self, name: str, timeout: float) -> None:
        process = self.processes[name]
        if process.poll() is not None:
            return
        if name in self.paused:
            self.resume(name)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        for name in list(self.paused):
            if self.processes[name].poll() is None:
                self.resume(name)
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                process.wait(remaining)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        self.process_env.clear()
        self.down.clear()
        self.paused.clear()
        try:
            self._stop_kubernetes()
        finally:
            if self.nats is not None:
                self.nats.stop()
                self.nats = None
            if self._own_socket_dir and self.socket_dir is not None:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                self._own_socket_dir = False

    def _stop_kubernetes(self) -> None:
        """The real kubelets this stack started, then its control plane."""
        try:
            for node in list(self.real_nodes.values()):
                node.stop()
        finally:
            self.real_nodes.clear()
            if self.control_plane is not None:
                self.control_plane.stop()
                self.control_plane = None

    def restart_kubelet(self, node: str, timeout: float = 120.0) -> None:
        """Restart ``node``'s real kubelet (containerd and pods stay; plugins re-register),
        or the test kubelet process (every test-kubelet node at once)."""
        if node in self.real_nodes:
            self.real_nodes[node].restart_kubelet(timeout)
        elif node in self.kubelet_endpoints:
            raise ValueError(f"node {node}'s real kubelet was not started by this stack")
        else:
            self.restart("kubelet", timeout)
