"""Where an unclosed socket was made, in the warning it causes.

An unclosed socket warns when the collector finds it (``filterwarnings = error`` makes
that a failure), in whatever test happens to be running then, and says only its
addresses. Each socket of the test process remembers the stack that made it, and one
collected unclosed says so in its warning (then is closed, so the interpreter does not
warn a second time without it).
"""

from __future__ import annotations

import socket
import traceback
import warnings
from typing import Any

_made_at: dict[int, str] = {}
"""By the socket's ``id``, from its making to its finalizer. Not a weak mapping: the
collector clears weak references to garbage in a reference cycle before it runs the
finalizers, so a socket collected that way (the flake this is for) was never found."""
_init = socket.socket.__init__


def _remembering_init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    _made_at[id(self)] = "".join(traceback.format_stack(limit=16)[:-1])


def _finalize(self: socket.socket) -> None:
    made = _made_at.pop(id(self), "(made before the test session began)\n")
    if self.fileno() == -1:
        return
    described = repr(self)
    self.close()
    warnings.warn(f"unclosed {described}, made at:\n{made}", ResourceWarning, stacklevel=1)


def install() -> None:
    socket.socket.__init__ = _remembering_init  # type: ignore[method-assign]
    socket.socket.__del__ = _finalize  # type: ignore[attr-defined]
