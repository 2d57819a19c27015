"""``gpushare allocator``: the kube-scheduler extender service.

Flags win over environment variables, which win over the defaults in
:class:`~gpushare.allocator.settings.AllocatorSettings`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence

import uvloop

from gpushare.allocator.settings import AllocatorSettings
from gpushare.logs import setup_logging
from gpushare.redaction import redact_text
from gpushare.settings_spec import read_settings, run_service
from gpushare.telemetry.tracing import configure_tracing

log = logging.getLogger(__name__)

PROG = "gpushare allocator"
DESCRIPTION = "The kube-scheduler extender: filter, prioritize and bind GPU-sharing pods."


def parse_settings(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> AllocatorSettings:
    """Settings from flags and environment; exits with status 2 on a bad flag (argparse)."""
    return read_settings(AllocatorSettings, argv, environ, prog=PROG, description=DESCRIPTION)


def start(settings: AllocatorSettings) -> int:
    setup_logging("allocator")
    configure_tracing("gpushare-allocator")
    from gpushare.allocator.runtime import run_allocator

    try:
        return uvloop.run(run_allocator(settings))
    except Exception as error:
        shown = redact_text(str(error))
        log.error("allocator stopped: %s", shown, exc_info=log.isEnabledFor(logging.DEBUG))
        return 1


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_settings, argv, prog=PROG, start=start)


if __name__ == "__main__":
    sys.exit(main())
