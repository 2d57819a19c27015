"""The reporter's settings, declared with their flags, and the parsing of the values typed.

Read once in ``__main__`` (flags, then the environment for what the flags leave out) and
passed down; nothing below reads the environment.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from gpushare.core.events import FrontDoor
from gpushare.flags import DEFAULT_NATS_URL, FRONT_DOOR, METRICS_PORT, NATS
from gpushare.reporter.mps import (
    DEFAULT_MPS_MODE,
    DEFAULT_MPS_PIPE_DIRECTORY,
    MPS_MODES,
    MpsMode,
)
from gpushare.reporter.simulated import SIMULATED_TOPOLOGIES, SimulatedTopology
from gpushare.settings_spec import Setting, SettingsError, one_of, port_or_off

DEFAULT_HEARTBEAT_SECONDS = 5.0
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_SIMULATED_CARDS_MIB = (16276,)
MAX_HEARTBEAT_SECONDS = 3600.0
NATS_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})
MAX_CARD_MIB = 2**20
"""1 TiB: a larger "MiB" value is almost surely bytes typed by mistake."""

KOORDINATOR_DEVICE = "koordinator-device"
SOURCES = ("nvml", KOORDINATOR_DEVICE)
"""``--source``: this machine's cards from NVML (or ``--fixture``), or from the node's
Koordinator ``Device`` in the Kubernetes API (:mod:`gpushare.reporter.koordinator`)."""

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatedNode:
    """A node of simulated cards: ``NAME=MIB[,MIB...]``, one size per card."""

    name: str
    cards_mib: tuple[int, ...]


def is_nats_url(text: str) -> bool:
    try:
        url = urlsplit(text)
        return url.scheme in NATS_SCHEMES and bool(url.hostname) and (url.port or 1) > 0
    except ValueError:  # a port that is not a number
        return False


def parse_nats_url(text: str) -> str:
    """``text`` without spaces if every comma-separated part is a NATS server URL."""
    parts = [part.strip() for part in text.split(",")]
    for part in parts:
        if not is_nats_url(part):
            raise SettingsError(f"--nats {part!r} is not a URL like nats://host:4222")
    return ",".join(parts)


def check_node_name(name: str) -> str:
    """``name`` if Kubernetes would accept it as a node name (a DNS-1123 subdomain)."""
    if not name:
        raise SettingsError("the node name is empty")
    if len(name) > 253 or not _NODE_NAME.fullmatch(name):
        raise SettingsError(
            f"{name!r} is not a Kubernetes node name: use lowercase letters, digits, '-' and "
            "'.', starting and ending with a letter or digit"
        )
    return name


def parse_cards_mib(text: str) -> tuple[int, ...]:
    """``"16276,16276,32510"`` -> ``(16276, 16276, 32510)``: card sizes in MiB."""
    sizes = []
    for part in text.split(","):
        try:
            size = int(part.strip())
        except ValueError:
            raise SettingsError(f"card size {part.strip()!r} is not a whole MiB number") from None
        if size <= 0:
            raise SettingsError(f"card size {size} MiB: sizes must be positive")
        if size > MAX_CARD_MIB:
            raise SettingsError(f"card size {size} MiB is over 1 TiB: sizes are MiB, not bytes")
        sizes.append(size)
    return tuple(sizes)


def parse_simulated_node(text: str) -> SimulatedNode:
    """``"gpu-a=16276,16276"`` -> a node ``gpu-a`` with two 16276 MiB cards."""
    name, sep, cards = text.partition("=")
    if not sep or not cards.strip():
        raise SettingsError(
            f"--node wants NAME=MIB[,MIB...] (as in gpu-a=16276,16276), not {text!r}"
        )
    try:
        return SimulatedNode(name=check_node_name(name.strip()), cards_mib=parse_cards_mib(cards))
    except SettingsError as error:
        raise SettingsError(f"--node {text!r}: {error}") from None


def parse_mps_mode(text: str) -> MpsMode:
    """``auto``, ``on`` or ``off`` (any case)."""
    mode = text.strip().lower()
    for known in MPS_MODES:
        if mode == known:
            return known
    raise SettingsError(f"--mps {text!r}: give one of {', '.join(MPS_MODES)}")


def parse_topology(text: str) -> SimulatedTopology:
    """One of :data:`~gpushare.reporter.simulated.SIMULATED_TOPOLOGIES`."""
    name = text.strip().lower()
    for known in SIMULATED_TOPOLOGIES:
        if name == known:
            return known
    raise SettingsError(f"--topology {text!r}: give one of {', '.join(SIMULATED_TOPOLOGIES)}")


def parse_heartbeat(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise SettingsError(f"--heartbeat {text!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_HEARTBEAT_SECONDS:
        raise SettingsError(
            f"--heartbeat {text!r}: give seconds above 0 and at most {MAX_HEARTBEAT_SECONDS:g}"
        )
    return seconds


@dataclass(frozen=True, kw_only=True, slots=True)
class ReporterSettings:
    """Everything the reporter process needs to know."""

    nats_url: Annotated[str, NATS] = DEFAULT_NATS_URL
    """``--nats`` / ``GPUSHARE_NATS_URL``; comma-separated URLs for a cluster."""
    simulated_nodes: Annotated[
        tuple[SimulatedNode, ...],
        Setting(
            flag="--node",
            kind="repeat",
            parse=parse_simulated_node,
            metavar="NAME=MIB[,MIB...]",
            help="a simulated node and its cards' memory in MiB; repeat for more nodes",
        ),
    ] = ()
    """``--node NAME=MIB[,MIB...]``, repeatable; one reporter task per node."""
    node_name: Annotated[
        str,
        Setting(
            flag="--node-name",
            env="NODE_NAME",
            parse=str.strip,
            help="this machine's Kubernetes node name, for NVML or --fixture",
        ),
    ] = ""
    """``--node-name`` / ``NODE_NAME``: this machine's Kubernetes node, for NVML or a fixture."""
    fixture: Annotated[
        Path | None,
        Setting(flag="--fixture", parse=Path, help="replay this NVML recording instead of NVML"),
    ] = None
    """``--fixture``: replay an NVML recording as node ``node_name`` instead of asking NVML."""
    heartbeat_seconds: Annotated[
        float,
        Setting(
            flag="--heartbeat",
            parse=parse_heartbeat,
            metavar="SECONDS",
            help="republish at least this often; three missed heartbeats: node not offered",
        ),
    ] = DEFAULT_HEARTBEAT_SECONDS
    """``--heartbeat``: publish at least this often; three silent periods mean "node gone"."""
    poll_seconds: float = DEFAULT_POLL_SECONDS
    """Longest wait for a health event between reads of the cards (never above heartbeat)."""
    simulate_if_no_gpu: Annotated[
        bool,
        Setting(
            flag="--simulate-if-no-gpu",
            kind="switch",
            help="if NVML cannot start, report --simulated-cards instead of failing",
        ),
    ] = False
    """``--simulate-if-no-gpu``: without NVML, report ``simulated_cards_mib`` rather than exit."""
    simulated_cards_mib: Annotated[
        tuple[int, ...],
        Setting(
            flag="--simulated-cards",
            parse=parse_cards_mib,
            metavar="MIB[,MIB...]",
            help="the cards --simulate-if-no-gpu reports",
        ),
    ] = DEFAULT_SIMULATED_CARDS_MIB
    """``--simulated-cards``: the cards reported by ``--simulate-if-no-gpu``."""
    simulated_topology: Annotated[
        SimulatedTopology,
        Setting(
            flag="--topology",
            parse=parse_topology,
            metavar="|".join(SIMULATED_TOPOLOGIES),
            help="how simulated cards are joined: nvlink-pairs (cards 2k, 2k+1 NV4, others "
            "SYS), nvswitch (all NV18), pcie (all PHB), none (unknown, no links reported)",
        ),
    ] = "none"
    """``--topology``: how every simulated node's cards are joined (``none``: unknown)."""
    mps: Annotated[
        MpsMode,
        Setting(
            flag="--mps",
            env="GPUSHARE_MPS",
            parse=parse_mps_mode,
            metavar="|".join(MPS_MODES),
            help="whether an MPS daemon serves the cards; auto looks for its control pipe, or "
            "every card in EXCLUSIVE_PROCESS compute mode (simulated cards: off)",
        ),
    ] = DEFAULT_MPS_MODE
    """``--mps`` / ``GPUSHARE_MPS``: ``on``/``off`` state it, ``auto`` looks (see ``mps``)."""
    mps_pipe_directory: Annotated[
        Path,
        Setting(
            flag="--mps-pipe-directory",
            env="CUDA_MPS_PIPE_DIRECTORY",
            parse=Path,
            metavar="DIR",
            help="where --mps auto looks for the MPS control daemon's pipe",
        ),
    ] = DEFAULT_MPS_PIPE_DIRECTORY
    """``--mps-pipe-directory`` / ``CUDA_MPS_PIPE_DIRECTORY``: where ``auto`` looks for the
    MPS control daemon's pipe on this machine (default ``/tmp/nvidia-mps``)."""
    front_door: Annotated[FrontDoor, FRONT_DOOR] = "extender"
    """``--front-door`` / ``GPUSHARE_FRONT_DOOR``: the node's one front door
    (``docs/dra.md``), reported with its inventory."""
    metrics_port: Annotated[int | None, dataclasses.replace(METRICS_PORT, parse=port_or_off)] = None
    """``--metrics-port`` / ``GPUSHARE_METRICS_PORT``: serve Prometheus ``/metrics`` there
    (None: not served; 0: any free port)."""
    source: Annotated[
        str,
        Setting(
            flag="--source",
            env="GPUSHARE_REPORTER_SOURCE",
            parse=one_of(*SOURCES, fold_case=True),
            metavar="|".join(SOURCES),
            help="where this machine's cards are read: NVML, or the node's Koordinator Device "
            "in the Kubernetes API (koordinator-device; needs --node-name)",
        ),
    ] = "nvml"
    """``--source`` / ``GPUSHARE_REPORTER_SOURCE``: one of :data:`SOURCES`."""
    kubeconfig: Annotated[
        str | None,
        Setting(
            env="KUBECONFIG",
            help="the kubeconfig of --source koordinator-device; unset: the pod's service account",
        ),
    ] = None
    """``KUBECONFIG``: the API that ``--source koordinator-device`` reads (None: in-cluster)."""

    @property
    def uses_nvml(self) -> bool:
        """No simulated node, no fixture, no other source: this machine's GPUs, via NVML."""
        return not self.simulated_nodes and self.fixture is None and self.source == "nvml"


def check_settings(settings: ReporterSettings) -> ReporterSettings:
    """Cross-field rules the flags alone cannot state, and the NATS URL (flag or env)."""
    settings = dataclasses.replace(settings, nats_url=parse_nats_url(settings.nats_url))
    names = [node.name for node in settings.simulated_nodes]
    koordinator = settings.source == KOORDINATOR_DEVICE
    if koordinator and settings.fixture is not None:
        raise SettingsError("--fixture replays NVML; it cannot go with --source koordinator-device")
    if settings.fixture is not None or settings.uses_nvml or koordinator:
        if not settings.node_name:
            what = "--fixture" if settings.fixture is not None else "reporting this machine's GPUs"
            raise SettingsError(f"{what} needs --node-name NAME (or NODE_NAME in the environment)")
        names.append(check_node_name(settings.node_name))
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SettingsError(f"node {', '.join(duplicates)} is given more than once")
    return settings
