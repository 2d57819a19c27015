"""An answer's writes leave the allocator as one send."""

from __future__ import annotations

import asyncio

from gpushare.allocator.coalescing import CoalescingTransport


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.sent.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 4242)}.get(name, default)


def wrapped() -> tuple[RecordingTransport, CoalescingTransport]:
    """A recording transport, and the coalescing one over it on the running loop."""
    inner = RecordingTransport()
    return inner, CoalescingTransport(inner, asyncio.get_running_loop())


async def turn() -> None:
    """Let the loop run the callbacks scheduled so far."""
    await asyncio.sleep(0)


async def test_the_writes_of_one_step_leave_as_one_send_at_the_next() -> None:
    inner, transport = wrapped()
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"{}")
    assert inner.sent == []
    assert transport.get_write_buffer_size() == 40
    await turn()
    assert inner.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


async def test_writes_of_different_steps_leave_separately() -> None:
    inner, transport = wrapped()
    transport.write(b"first")
    await turn()
    transport.writelines([b"sec", memoryview(b"ond")])
    await turn()
    await turn()
    assert inner.sent == [b"first", b"second"]


async def test_closing_sends_what_is_held_first_and_nothing_after() -> None:
    inner, transport = wrapped()
    transport.write(b"last words")
    transport.close()
    assert inner.sent == [b"last words"]
    assert transport.is_closing()
    transport.write(b"too late")
    await turn()
    assert inner.sent == [b"last words"]


async def test_abort_drops_what_is_held() -> None:
    inner, transport = wrapped()
    transport.write(b"never sent")
    transport.abort()
    await turn()
    assert inner.sent == []
    assert inner.aborted


async def test_everything_else_is_the_wrapped_transports() -> None:
    _, transport = wrapped()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 4242)
    assert transport.get_extra_info("sslcontext") is None
