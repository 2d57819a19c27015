"""The settings every service shares, declared once (see :mod:`gpushare.settings_spec`)."""

from __future__ import annotations

from gpushare.core.dra import FRONT_DOORS
from gpushare.core.requests import MEMORY_UNITS_MIB
from gpushare.settings_spec import Setting, number, one_of

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

NATS = Setting(
    flag="--nats",
    env="GPUSHARE_NATS_URL",
    help="NATS server URL(s), comma-separated for a cluster",
)
STREAM_REPLICAS = Setting(
    flag="--stream-replicas",
    env="GPUSHARE_STREAM_REPLICAS",
    parse=number(int, low=1, high=5),
    metavar="1-5",
    help="JetStream replicas of the streams and snapshot bucket it creates (at creation "
    "only): 3 on a 3-server NATS cluster",
)
MEMORY_UNIT = Setting(
    flag="--memory-unit",
    env="GPUSHARE_MEMORY_UNIT",
    parse=one_of(*sorted(MEMORY_UNITS_MIB)),
    metavar="|".join(sorted(MEMORY_UNITS_MIB)),
    help="unit of aliyun.com/gpu-mem, cluster-wide: pod requests, node capacity and device "
    "IDs all count in it",
)
FRONT_DOOR = Setting(
    flag="--front-door",
    env="GPUSHARE_FRONT_DOOR",
    parse=one_of(*FRONT_DOORS, fold_case=True),
    metavar="|".join(FRONT_DOORS),
    help="how pods get this node's cards: extender (aliyun.com/gpu-mem & co.) or dra "
    "(ResourceClaims of DeviceClass gpu.gpushare.io); deploy/ sets it from the node's "
    "gpushare.io/front-door label, the same for the reporter and the node agent",
)
METRICS_PORT = Setting(
    flag="--metrics-port",
    env="GPUSHARE_METRICS_PORT",
    parse=int,
    help="serve Prometheus /metrics on this port; 0: off",
)
