"""``gpushare reporter``: publish each node's GPU inventory to NATS, with a heartbeat.

    gpushare reporter --node-name "$NODE_NAME"                 # this machine, via NVML
    gpushare reporter --node gpu-a=16276,16276 --node gpu-b=16276,16276,32510
    gpushare reporter --node gpu-c=81559,81559,81559,81559 --topology nvlink-pairs --mps on
    gpushare reporter --fixture h100x8.json --node-name gpu-h100-1

Exit codes: 0 after a clean stop (SIGTERM, SIGINT), 1 when NVML or a fixture cannot be
used, 2 for flags that make no sense.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import uvloop

from gpushare.collector import settle
from gpushare.logs import setup_logging
from gpushare.reporter.nvml import NvmlUnavailable
from gpushare.reporter.recording import RecordingError
from gpushare.reporter.running import open_backends, serve
from gpushare.reporter.settings import ReporterSettings, check_settings
from gpushare.settings_spec import read_settings, run_service
from gpushare.telemetry.tracing import configure_tracing

PROG = "gpushare reporter"
DESCRIPTION = "Publish each node's GPU inventory (NVML, simulated or a fixture) to NATS."


def parse_settings(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> ReporterSettings:
    """Flags first, then the environment; raises ``SystemExit`` (argparse) or SettingsError."""
    return check_settings(
        read_settings(ReporterSettings, argv, environ, prog=PROG, description=DESCRIPTION)
    )


def start(settings: ReporterSettings) -> int:
    setup_logging("reporter")
    configure_tracing("gpushare-reporter")
    try:
        backends = open_backends(settings)
    except NvmlUnavailable as error:
        print(
            f"{PROG}: {error}. Is the NVIDIA driver loaded and the GPU visible to "
            "this container? Use --simulate-if-no-gpu to report simulated cards instead.",
            file=sys.stderr,
        )
        return 1
    except RecordingError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    settle("reporter")
    return uvloop.run(serve(settings, backends))


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_settings, argv, prog=PROG, start=start)


if __name__ == "__main__":
    sys.exit(main())
