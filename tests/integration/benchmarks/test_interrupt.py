"""A benchmark stopped with SIGTERM runs its clean-up (what it started stops with it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.interrupt import EXIT_STATUS

ROOT = Path(__file__).resolve().parents[3]

OUTSIDE_A_LOOP = """
import time
from benchmarks.interrupt import unwind_on_sigterm
unwind_on_sigterm()
try:
    print("started", flush=True)
    time.sleep(60)
finally:
    open(CLEANED, "w").write("cleaned")
"""

INSIDE_A_LOOP = """
import asyncio
from benchmarks.interrupt import cancelled_by_sigterm, unwind_on_sigterm

async def benchmark():
    try:
        print("started", flush=True)
        await asyncio.sleep(60)
    finally:
        open(CLEANED, "w").write("cleaned")

unwind_on_sigterm()
asyncio.run(cancelled_by_sigterm(benchmark()))
"""


@pytest.mark.parametrize("body", [OUTSIDE_A_LOOP, INSIDE_A_LOOP], ids=["outside", "inside"])
def test_sigterm_runs_the_clean_up_and_exits_143(tmp_path: Path, body: str) -> None:
    cleaned = tmp_path / "cleaned"
    source = f"CLEANED = {str(cleaned)!r}\n" + textwrap.dedent(body)
    with subprocess.Popen(
        [sys.executable, "-c", source], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == EXIT_STATUS
    assert cleaned.read_text() == "cleaned"
