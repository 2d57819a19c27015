"""bench-kube's per-process figures: which processes count, under which names."""

from __future__ import annotations

from pathlib import Path

from benchmarks.kube_scheduler import CLOCK_TICKS, usage


def process(proc: Path, pid: int, argv: list[str], *, ticks: int, io: tuple[int, int]) -> None:
    """A /proc/<pid> with its command line, CPU ticks (user + system) and its read and
    write calls."""
    reads, writes = io
    root = proc / str(pid)
    root.mkdir(parents=True)
    (root / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
    fields = ["S", *["0"] * 10, str(ticks), "0", *["0"] * 30]
    (root / "stat").write_text(f"{pid} (x y) {' '.join(fields)}\n")
    (root / "io").write_text(
        f"rchar: 9999\nwchar: 9999\nsyscr: {reads}\nsyscw: {writes}\nread_bytes: 4096\n"
    )


def test_components_and_services_count_under_their_names_and_others_not_at_all(
    tmp_path: Path,
) -> None:
    service = ["/v/bin/python", "-m", "gpushare.cli.main", "node-agent", "--node", "n1"]
    apiserver = ["/opt/k8s/kube-apiserver", "--secure-port=6443"]
    reference = ["/v/bin/python", "-m", "benchmarks.null_extender", "9"]
    process(tmp_path, 10, apiserver, ticks=250, io=(11, 12))
    process(tmp_path, 20, service, ticks=30, io=(4, 1))
    process(tmp_path, 21, service, ticks=20, io=(3, 0))
    process(tmp_path, 30, reference, ticks=10, io=(5, 6))
    process(tmp_path, 40, ["/usr/bin/sleep", "100"], ticks=900, io=(99, 99))
    (tmp_path / "self").mkdir()

    used = usage(tmp_path)
    assert used.cpu_seconds == {
        "kube-apiserver": 250 / CLOCK_TICKS,
        "gpushare node-agent": 50 / CLOCK_TICKS,
        "reference extender": 10 / CLOCK_TICKS,
    }
    assert used.io_calls == {
        ("kube-apiserver", "reads"): 11,
        ("kube-apiserver", "writes"): 12,
        ("gpushare node-agent", "reads"): 7,
        ("gpushare node-agent", "writes"): 1,
        ("reference extender", "reads"): 5,
        ("reference extender", "writes"): 6,
    }
