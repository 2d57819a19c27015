"""Where a message was first stored, for messages a stream copied from another.

The binders consume the allocation log through their own queue stream, which sources
it (:data:`gpushare.bus.subjects.BINDER_QUEUE_STREAM`). A sourced message keeps its
subject and body; the server names its original stream and sequence in the
``Nats-Stream-Source`` header (``<stream> <seq> <filter> <transform> <subject> <id>``).
Everything the binders compare with the fold speaks the log's sequences.
"""

from __future__ import annotations

from nats.aio.msg import Msg

SOURCE_HEADER = "Nats-Stream-Source"


def origin(msg: Msg) -> tuple[str, int]:
    """The stream and sequence ``msg`` was first stored at (its own when not sourced)."""
    source = (msg.headers or {}).get(SOURCE_HEADER, "")
    stream, _, rest = source.partition(" ")
    seq = rest.split(" ", 1)[0]
    if stream and seq.isdigit():
        return stream, int(seq)
    metadata = msg.metadata
    return metadata.stream, metadata.sequence.stream


def log_seq(msg: Msg) -> int:
    """The sequence of ``msg`` in the stream it was first stored in."""
    return origin(msg)[1]
