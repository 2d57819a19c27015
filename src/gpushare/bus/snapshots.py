"""Snapshots of the fold in the JetStream KV bucket ``GPUSHARE_SNAPSHOTS``.

A snapshot is compressed (:mod:`gpushare.core.snapshot`) and may still exceed what one
NATS message carries, so it is written as chunks under ``chunk.<writer>.<seq>.<n>`` and
then a small head under ``state`` naming them with their SHA-256. A reader that finds
the chunks damaged, missing or from another stream simply replays the log instead: a
snapshot only ever saves time, it is never the truth.

Any replica that folds the whole log may write one (:class:`SnapshotKeeper`); the head
is replaced with compare-and-set, and never by an older snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Callable
from datetime import datetime

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from gpushare.bus.subjects import ALLOCATION_STREAM, SNAPSHOT_BUCKET
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.ports import Clock
from gpushare.core.snapshot import (
    EncodedSnapshot,
    SnapshotUnreadable,
    StateSnapshot,
    decode_snapshot,
)

log = logging.getLogger(__name__)

HEAD_KEY = "state"
CHUNK_BYTES = 512 * 1024
"""Under the default NATS max_payload of 1 MiB, with room for headers."""


class SnapshotHead(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    writer: str
    chunks: int
    size: int
    sha256: str
    taken_at: datetime


_head_decoder = msgspec.json.Decoder(SnapshotHead)


def _key_token(text: str) -> str:
    return re.sub(r"[^-_A-Za-z0-9]", "_", text)[:64] or "_"


def _chunk_key(head: SnapshotHead, index: int) -> str:
    return f"chunk.{_key_token(head.writer)}.{head.seq}.{index}"


async def snapshot_bucket(js: JetStreamContext, replicas: int | None = None) -> KeyValue:
    """The bucket, created on first use (one value per key: old snapshots are not kept),
    with as many replicas as the allocation stream unless told."""
    try:
        return await js.key_value(SNAPSHOT_BUCKET)
    except BucketNotFoundError:
        if replicas is None:
            replicas = (await js.stream_info(ALLOCATION_STREAM)).config.num_replicas or 1
        config = KeyValueConfig(
            bucket=SNAPSHOT_BUCKET,
            history=1,
            storage=StorageType.FILE,
            replicas=replicas,
            description="gpushare: folded allocation-log state, for fast start-up",
        )
        return await js.create_key_value(config)


async def stream_created(js: JetStreamContext) -> datetime | None:
    """When the allocation stream was created (snapshots name the stream they cover)."""
    info = await js.stream_info(ALLOCATION_STREAM)
    created = getattr(info, "created", None)
    if isinstance(created, datetime):
        return created
    if isinstance(created, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(created.replace("Z", "+00:00"))
    return None


async def _read_head(bucket: KeyValue) -> tuple[SnapshotHead, int] | None:
    try:
        entry = await bucket.get(HEAD_KEY)
    except KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    return _head_decoder.decode(entry.value), int(entry.revision or 0)


async def load_snapshot(js: JetStreamContext) -> StateSnapshot | None:
    """The newest readable snapshot, or None (no bucket, none written, or damaged)."""
    try:
        bucket = await js.key_value(SNAPSHOT_BUCKET)
        found = await _read_head(bucket)
        if found is None:
            return None
        head = found[0]
        parts = [(await bucket.get(_chunk_key(head, n))).value or b"" for n in range(head.chunks)]
        data = b"".join(parts)
        if len(data) != head.size or hashlib.sha256(data).hexdigest() != head.sha256:
            log.warning("snapshot at seq %d is damaged; replaying the whole log", head.seq)
            return None
        return decode_snapshot(data)
    except (BucketNotFoundError, KeyNotFoundError, SnapshotUnreadable, msgspec.MsgspecError) as e:
        log.warning("no usable snapshot (%s); replaying the whole log", e)
        return None


async def save_snapshot(js: JetStreamContext, snapshot: StateSnapshot) -> bool:
    """Write ``snapshot`` unless the bucket already holds one as new; True if written."""
    return await save_encoded(js, await asyncio.to_thread(EncodedSnapshot.of, snapshot))


async def save_encoded(js: JetStreamContext, snapshot: EncodedSnapshot) -> bool:
    """Write the encoded ``snapshot`` unless the bucket already holds one as new; True if
    written."""
    bucket = await snapshot_bucket(js)
    data = snapshot.data
    head = SnapshotHead(
        seq=snapshot.seq,
        writer=snapshot.taken_by,
        chunks=max(1, -(-len(data) // CHUNK_BYTES)),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        taken_at=snapshot.taken_at,
    )
    current = await _read_head(bucket)
    if current is not None and current[0].seq >= head.seq:
        return False
    for index in range(head.chunks):
        chunk = data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        await bucket.put(_chunk_key(head, index), chunk)
    try:
        await bucket.update(HEAD_KEY, msgspec.json.encode(head), last=current[1] if current else 0)
    except KeyWrongLastSequenceError:
        await _drop_chunks(bucket, head)  # another replica wrote first
        return False
    if current is not None:
        await _drop_chunks(bucket, current[0])
    return True


async def _drop_chunks(bucket: KeyValue, head: SnapshotHead) -> None:
    for index in range(head.chunks):
        with contextlib.suppress(Exception):
            await bucket.purge(_chunk_key(head, index))


Taker = Callable[[datetime], Callable[[], EncodedSnapshot]]
"""Captures the fold as it is now (on the event loop, quickly); what it returns builds and
encodes the snapshot (on a worker thread)."""


class SnapshotKeeper:
    """Writes a snapshot every ``interval_s`` once ``min_events`` have been folded since."""

    def __init__(
        self,
        js: JetStreamContext,
        take: Taker,
        applied: Callable[[], int],
        *,
        interval_s: float = 30.0,
        min_events: int = 1000,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._js = js
        self._clock = clock
        self._take = take
        self._applied = applied
        self.interval_s = interval_s
        self.min_events = min_events
        self.written_seq = 0

    async def write_now(self, force: bool = False) -> bool:
        """Snapshot the fold if enough is new since the last one (or ``force``)."""
        if not force and self._applied() - self.written_seq < self.min_events:
            return False
        build = self._take(self._clock.now())
        snapshot = await asyncio.to_thread(build)
        written = await save_encoded(self._js, snapshot)
        self.written_seq = snapshot.seq  # or someone wrote a newer one: equally good
        if written:
            log.info("snapshot written at seq %d (%d nodes)", snapshot.seq, snapshot.nodes)
        return written

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.write_now()
            except Exception as error:  # NATS away, bucket full: the next round retries
                log.warning("writing a snapshot failed: %s", error)
