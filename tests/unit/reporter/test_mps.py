"""Whether MPS serves a node: the decision table, and how the control pipe is found."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pynvml
import pytest

from gpushare.reporter.mps import (
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    MpsMode,
    decide_mps,
    find_control_pipe,
)

DEFAULT = pynvml.NVML_COMPUTEMODE_DEFAULT
EXCLUSIVE = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
PROHIBITED = pynvml.NVML_COMPUTEMODE_PROHIBITED


def test_exclusive_process_is_nvmls_value() -> None:
    assert EXCLUSIVE == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


@pytest.mark.parametrize(
    ("mode", "control_pipe", "compute_modes", "mps"),
    [
        # on and off say it, whatever is found
        ("on", False, (DEFAULT, DEFAULT), True),
        ("on", None, (), True),
        ("off", True, (EXCLUSIVE, EXCLUSIVE), False),
        # auto: the daemon's pipe is enough
        ("auto", True, (), True),
        ("auto", True, (DEFAULT, DEFAULT), True),
        # auto: or every card NVML could ask in EXCLUSIVE_PROCESS
        ("auto", False, (EXCLUSIVE, EXCLUSIVE), True),
        ("auto", None, (EXCLUSIVE, None), True),
        ("auto", False, (EXCLUSIVE, DEFAULT), False),
        ("auto", False, (EXCLUSIVE, PROHIBITED), False),
        ("auto", False, (DEFAULT,), False),
        # auto with no evidence at all
        ("auto", False, (), False),
        ("auto", None, (None, None), False),
    ],
)
def test_the_mps_decision(
    mode: MpsMode, control_pipe: bool | None, compute_modes: tuple[int | None, ...], mps: bool
) -> None:
    assert decide_mps(mode, control_pipe=control_pipe, compute_modes=compute_modes) is mps


def test_no_directory_no_daemon(tmp_path: Path) -> None:
    assert not find_control_pipe(tmp_path / "nvidia-mps")


def test_an_empty_directory_no_daemon(tmp_path: Path) -> None:
    assert not find_control_pipe(tmp_path)


def test_a_plain_file_named_control_is_not_a_daemon(tmp_path: Path) -> None:
    (tmp_path / "control").write_text("")
    assert not find_control_pipe(tmp_path)


def test_the_daemons_named_pipe_is_found(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "control")
    assert find_control_pipe(tmp_path)


def test_a_control_socket_is_found(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(tmp_path / "control"))
        assert find_control_pipe(tmp_path)
