"""``make bench-kube``'s reference: the least an extender with a bind verb can cost here.

It decides nothing and records nothing. Filter decodes kube-scheduler's arguments and
answers one of the names it was given (round robin); bind decodes its arguments and
POSTs the pod's ``Binding`` to the API server, then answers. One process, one event
loop (uvloop), HTTP/1.1 with keep-alive parsed by hand, the Binding sent by the binder's
own call (aiohttp), without annotations: Python's floor for the two round trips every
pod makes through an extender, measured beside gpushare in the same run. What gpushare
costs above it is its own work (the fold, the log, the binder's hop), not the extender
protocol's.

Its pods get no card shares, so ``bench-kube`` deletes them before the node side runs,
as it does the baseline's. Run as ``python -m benchmarks.null_extender --port P
--kubeconfig FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Any, cast

import msgspec
import uvloop

from gpushare.kube.binding import bind_pod
from gpushare.kube.client import KubeClient

MAX_HEAD = 64 * 1024


class FilterArgs(msgspec.Struct):
    NodeNames: list[str] | None = None


class BindArgs(msgspec.Struct):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


_filter_args = msgspec.json.Decoder(FilterArgs)
_bind_args = msgspec.json.Decoder(BindArgs)
_json = msgspec.json.Encoder()


def answer(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class Binder:
    """Binds pods through the binder's own call (:func:`gpushare.kube.binding.bind_pod`:
    a ``Binding`` POSTed through aiohttp), with no annotations."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def bind(self, args: BindArgs) -> str:
        """The extender's ``Error`` field: empty once the API server accepted it."""
        outcome = await bind_pod(
            self._kube,
            namespace=args.PodNamespace,
            name=args.PodName,
            uid=args.PodUID,
            node=args.Node,
            annotations={},
        )
        return "" if outcome.bound else f"binding: {outcome.status} {outcome.message}"

    async def close(self) -> None:
        await self._kube.aclose()


class NullExtender(asyncio.Protocol):
    """One connection: requests answered in the order they came (HTTP/1.1 pipelining)."""

    def __init__(self, binder: Binder, picks: itertools.count[int]) -> None:
        self._binder = binder
        self._picks = picks
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._answers: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._writer = asyncio.get_running_loop().create_task(self._write_answers())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._writer is not None:
            self._writer.cancel()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (request := self._next_request()) is not None:
            path, body = request
            self._answers.put_nowait(asyncio.ensure_future(self._answer(path, body)))

    def _next_request(self) -> tuple[bytes, bytes] | None:
        head, found, rest = self._buffer.partition(b"\r\n\r\n")
        if not found:
            if len(self._buffer) > MAX_HEAD and self._transport is not None:
                self._transport.close()
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = -1
        if length < 0 and self._transport is not None:
            self._transport.close()
            return None
        if len(rest) < length:
            return None
        self._buffer = rest[length:]
        return head.split(b" ", 2)[1], rest[:length]

    async def _answer(self, path: bytes, body: bytes) -> bytes:
        try:
            if path.endswith(b"/filter"):
                names = _filter_args.decode(body).NodeNames or []
                chosen = [names[next(self._picks) % len(names)]] if names else []
                reply: dict[str, Any] = {"NodeNames": chosen, "FailedNodes": {}, "Error": ""}
            elif path.endswith(b"/bind"):
                reply = {"Error": await self._binder.bind(_bind_args.decode(body))}
            else:
                return answer(b"404 Not Found", b'{"Error":"no such verb"}')
        except msgspec.DecodeError as error:
            return answer(b"400 Bad Request", _json.encode({"Error": str(error)}))
        return answer(b"200 OK", _json.encode(reply))

    async def _write_answers(self) -> None:
        while True:
            answered = await (await self._answers.get())
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(answered)


async def serve(
    port: int,
    binder: Binder,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve on 127.0.0.1 until cancelled."""
    picks = itertools.count()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: NullExtender(binder, picks), "127.0.0.1", port)
    if ready is not None:
        ready.set()
    try:
        await server.serve_forever()
    finally:
        server.close()
        await binder.close()


def main(argv: list[str] | None = None) -> None:
    parse = argparse.ArgumentParser(prog="python -m benchmarks.null_extender")
    parse.add_argument("--port", type=int, required=True)
    parse.add_argument("--kubeconfig", required=True)
    args = parse.parse_args(argv)
    uvloop.run(serve(args.port, Binder(KubeClient.connect(args.kubeconfig))))


if __name__ == "__main__":
    main()
