"""The nats-py names the rest of gpushare uses, re-exported here so that only
:mod:`gpushare.bus` imports ``nats`` (an import-linter contract). Services annotate with
these and catch these; connecting, publishing and reading stay in the bus's own modules.
"""

from __future__ import annotations

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError as NatsConnectionClosed
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

__all__ = [
    "AckPolicy",
    "Client",
    "ConsumerConfig",
    "DeliverPolicy",
    "JetStreamContext",
    "Msg",
    "NatsConnectionClosed",
    "NatsError",
    "NatsTimeout",
    "NoRespondersError",
    "NotFoundError",
    "Subscription",
]
