"""Whether an MPS control daemon serves a node's cards: a pure decision and one file check.

With MPS (CUDA's Multi-Process Service) the processes of several pods share a card through
one server that enforces each client's thread and memory limits; without it, gpushare's
shares are only a scheduling promise. The reporter publishes what it found as
``InventoryReported.mps``.

``--mps on`` and ``--mps off`` state the answer. ``--mps auto`` (the default) looks for
either sign of a running daemon:

* its ``control`` pipe in the MPS pipe directory (``CUDA_MPS_PIPE_DIRECTORY``, by default
  ``/tmp/nvidia-mps``; mount it into the reporter's container to be seen);
* every card NVML could ask in ``EXCLUSIVE_PROCESS`` compute mode, the setting MPS
  deployments use so that only the MPS server opens the card.

Simulated cards have no daemon: ``auto`` is off for them.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

MpsMode = Literal["auto", "on", "off"]
MPS_MODES: tuple[MpsMode, ...] = ("auto", "on", "off")
DEFAULT_MPS_MODE: MpsMode = "auto"

DEFAULT_MPS_PIPE_DIRECTORY = Path("/tmp/nvidia-mps")
"""Where ``nvidia-cuda-mps-control -d`` puts its pipes unless told otherwise."""

MPS_CONTROL_PIPE = "control"

NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3


def all_exclusive_process(compute_modes: Iterable[int | None]) -> bool:
    """Every card whose mode is known is ``EXCLUSIVE_PROCESS``, and at least one is known."""
    known = [mode for mode in compute_modes if mode is not None]
    return bool(known) and all(mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS for mode in known)


def decide_mps(
    mode: MpsMode, *, control_pipe: bool | None, compute_modes: Iterable[int | None] = ()
) -> bool:
    """The published ``mps``: what ``mode`` says, or under ``auto`` the evidence found."""
    if mode != "auto":
        return mode == "on"
    return bool(control_pipe) or all_exclusive_process(compute_modes)


def find_control_pipe(directory: Path) -> bool:
    """Whether ``directory`` holds an MPS control daemon's ``control`` pipe (or socket)."""
    try:
        mode = (directory / MPS_CONTROL_PIPE).stat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
