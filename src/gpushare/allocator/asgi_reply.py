"""Answering an ASGI request in one piece: the guards in front of the app (body limit,
client-certificate gate) and the extender's verbs all answer this way."""

from __future__ import annotations

from typing import Any

JSON = "application/json"


async def reply(send: Any, status: int, body: bytes, content_type: str = JSON) -> None:
    """``status`` and the whole of ``body``, with its type and length."""
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
