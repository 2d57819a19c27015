"""Creating the two streams, idempotently, with the settings the design relies on."""

from __future__ import annotations

import logging

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, StreamSource
from nats.js.errors import NotFoundError

from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALL_DECISIONS,
    ALL_INVENTORY,
    ALL_REJECTED,
    ALLOCATION_STREAM,
    BINDER_QUEUE_STREAM,
    DECISION_STREAM,
    INVENTORY_STREAM,
    REJECTED_STREAM,
)

log = logging.getLogger(__name__)

DUPLICATE_WINDOW_SECONDS = 120.0
DECISION_MAX_AGE_SECONDS = 7 * 24 * 3600.0
DECISION_MAX_BYTES = 1 << 30
REJECTED_MAX_AGE_SECONDS = 90 * 24 * 3600.0
BINDER_QUEUE_MAX_AGE_SECONDS = 7 * 24 * 3600.0
"""The binders' copy of the log keeps a week: the log itself keeps everything."""

INVENTORY_MAX_MSG_BYTES = 64 * 1024
"""The largest inventory message a stream takes: 16 cards fully linked by NVLink, with
long names and health reasons, is about 9 KiB (``tests/unit/bus/test_stream_limits.py``)."""
ALLOCATION_MAX_MSG_BYTES = 256 * 1024
"""The largest allocation event: a pod of 64 containers each on 8 cards is about 110 KiB;
a ``ContainerAssigned`` writes its device IDs as runs (:mod:`gpushare.core.device_ids`)."""
REJECTED_MAX_MSG_BYTES = ALLOCATION_MAX_MSG_BYTES + 16 * 1024
"""A rejected record holds the refused message whole, plus headers saying where it was."""
DECISION_MAX_MSG_BYTES = 1024 * 1024
"""A filter record names every candidate node with its reason (thousands of nodes)."""


def inventory_config(replicas: int = 1) -> StreamConfig:
    """Last value per node: a node's reporter republishes on change and as a heartbeat."""
    return StreamConfig(
        name=INVENTORY_STREAM,
        subjects=[ALL_INVENTORY],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        max_msgs_per_subject=1,
        max_msg_size=INVENTORY_MAX_MSG_BYTES,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
        allow_direct=True,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    )


def allocation_config(replicas: int = 1) -> StreamConfig:
    """The allocation log: every event kept, on file, never deleted or purged."""
    return StreamConfig(
        name=ALLOCATION_STREAM,
        subjects=[ALL_ALLOCATIONS],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        max_msgs_per_subject=-1,
        max_msg_size=ALLOCATION_MAX_MSG_BYTES,
        deny_delete=True,
        deny_purge=True,
        num_replicas=replicas,
        allow_direct=True,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    )


def binder_queue_config(replicas: int = 1) -> StreamConfig:
    """The binders' work: the allocation log sourced into a stream of its own (the
    original stream and sequence of each message are in its ``Nats-Stream-Source``)."""
    return StreamConfig(
        name=BINDER_QUEUE_STREAM,
        sources=[StreamSource(name=ALLOCATION_STREAM)],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        max_age=BINDER_QUEUE_MAX_AGE_SECONDS,
        max_msg_size=ALLOCATION_MAX_MSG_BYTES,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
    )


def decision_config(replicas: int = 1) -> StreamConfig:
    """What the extender reasoned about each pod, for ``gpushare explain``: a week, 1 GiB."""
    return StreamConfig(
        name=DECISION_STREAM,
        subjects=[ALL_DECISIONS],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        max_age=DECISION_MAX_AGE_SECONDS,
        max_bytes=DECISION_MAX_BYTES,
        max_msg_size=DECISION_MAX_MSG_BYTES,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
        allow_direct=True,
    )


def rejected_config(replicas: int = 1) -> StreamConfig:
    """Poison messages, as they were, with where they came from and why they were refused."""
    return StreamConfig(
        name=REJECTED_STREAM,
        subjects=[ALL_REJECTED],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        max_age=REJECTED_MAX_AGE_SECONDS,
        max_msg_size=REJECTED_MAX_MSG_BYTES,
        deny_delete=True,
        num_replicas=replicas,
        allow_direct=True,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    )


async def ensure_streams(js: JetStreamContext, replicas: int | None = None) -> None:
    """Create the streams, or bring an existing stream's settings up to date (only when
    they drifted). ``replicas`` applies when a stream is created (``None``: one); an existing
    stream keeps its count, which only an admin may change."""
    configs = (
        inventory_config(replicas or 1),
        allocation_config(replicas or 1),
        binder_queue_config(replicas or 1),
        decision_config(replicas or 1),
        rejected_config(replicas or 1),
    )
    for config in configs:
        assert config.name is not None
        try:
            info = await js.stream_info(config.name)
        except NotFoundError:
            await js.add_stream(config)
        else:
            if replicas is not None and info.config.num_replicas != replicas:
                log.warning(
                    "stream %s has %s replicas, not %d: only an admin may change that "
                    "(nats stream edit %s --replicas %d)",
                    config.name,
                    info.config.num_replicas,
                    replicas,
                    config.name,
                    replicas,
                )
            config.num_replicas = info.config.num_replicas  # set at creation only
            if drifted(info.config, config):
                await js.update_stream(config)


def drifted(current: StreamConfig, wanted: StreamConfig) -> bool:
    """Whether a setting ``wanted`` names differs on the server (a zero is a default the
    server filled in). Services then never update a stream needlessly: only admin may
    update the audit streams (:mod:`gpushare.bus.permissions`)."""
    have = current.as_dict()
    return any(
        have.get(key) != value
        for key, value in wanted.as_dict().items()
        if not (type(value) is int and value == 0)
    )
