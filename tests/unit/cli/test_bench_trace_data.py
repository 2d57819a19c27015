"""``gpushare bench trace`` finds its trace with ``--trace-dir`` (or ``GPUSHARE_TRACE_DIR``,
or a checkout's ``benchmarks/traces``), and says which flag to use when there is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.tracebench import cli
from gpushare.tracebench.trace import TraceError

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,V100M16\nn1,64000,262144,1,T4\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time\n"
    "p0,1000,1024,1,500,,LS,Running,0,10,0\n"
    "p1,1000,1024,1,1000,,LS,Running,1,10,1\n"
)


def small_trace(directory: Path) -> Path:
    directory.mkdir()
    (directory / cli.NODES_FILE).write_text(NODES)
    (directory / cli.PODS_FILE).write_text(PODS)
    return directory


def test_the_checkout_holds_the_trace_and_is_the_default() -> None:
    assert cli.trace_dir(None, {}) == cli.BUNDLED
    assert cli.trace_files(None, None, None, {}) == (cli.DEFAULT_NODES, cli.DEFAULT_PODS)


def test_trace_dir_then_the_environment_then_the_checkout(tmp_path: Path) -> None:
    given, from_env = tmp_path / "given", tmp_path / "env"
    environ = {cli.TRACE_DIR_VARIABLE: str(from_env)}
    assert cli.trace_dir(given, environ) == given
    assert cli.trace_dir(None, environ) == from_env
    trace = small_trace(tmp_path / "trace")
    own_pods = tmp_path / "pods.csv"
    own_pods.write_text(PODS)
    assert cli.trace_files(trace, None, own_pods, {}) == (trace / cli.NODES_FILE, own_pods)


def test_no_trace_is_said_with_the_flag_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "BUNDLED", tmp_path / "site-packages" / "benchmarks")
    monkeypatch.delenv(cli.TRACE_DIR_VARIABLE, raising=False)
    with pytest.raises(TraceError, match=r"this is not a checkout.*--trace-dir DIR"):
        cli.trace_files(None, None, None, {})
    with pytest.raises(SystemExit) as exited:
        cli.main(["trace", "--trace-dir", str(tmp_path / "nowhere")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"no trace data: {tmp_path / 'nowhere' / cli.NODES_FILE}" in err
    assert "pass --trace-dir DIR" in err


def test_a_trace_dir_is_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = small_trace(tmp_path / "trace")
    code = cli.main(["trace", "--trace-dir", str(trace), "--workers", "1", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary
