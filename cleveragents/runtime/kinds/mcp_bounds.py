"""The output limit on an MCP session's transport: a meter of what the server sends.

A ``Meter`` counts the bytes a server sends on one session (a stdio server's
stdout, an HTTP server's response bodies) as they arrive, before anything is
parsed or kept. It trips, once, when

- a call has received more than its output limit since it started (its answer,
  and whatever the server sent meanwhile), or
- one message (a stdio line, a JSON response body) grows past the limit of the
  calls waiting, or, with none waiting, past the process's default limit.

Tripping calls ``on_trip`` (the session closes itself: a stdio server is
stopped) and raises ``OverLimit`` in the reader, which stops reading. The calls
that were past their limit then fail as ``output_too_large``; nothing larger
than the limit is ever buffered. ``bound_http`` puts a meter on an HTTP client's
responses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import httpx2

from cleveragents.runtime.output_limit import default_output_limit

__all__ = ["IDENTITY", "Meter", "OverLimit", "bound_http"]

#: The request header that asks a server not to compress its answers (see ``bound_http``).
IDENTITY = {"Accept-Encoding": "identity"}


class OverLimit(httpx2.StreamError):
    """Raised by a reader whose meter tripped: it stops reading (a stream error, to the SDK)."""

    def __init__(self) -> None:
        super().__init__("the MCP server sent more than the output limit")


#: What a server may send for an answer of the output limit: MCP answers carry a tool's
#: structured output twice (``structuredContent`` and a text copy, as the SDK's own
#: servers send it), plus JSON-RPC framing. The output itself is then measured against
#: the limit as every tool kind's is.
WIRE_FACTOR = 2
WIRE_ENVELOPE_BYTES = 65_536


def on_the_wire(limit_bytes: int) -> int:
    """The bytes a server may send in answer to a call whose output limit is ``limit_bytes``."""
    return WIRE_FACTOR * limit_bytes + WIRE_ENVELOPE_BYTES


class Meter:
    """What one session's server has sent, against the limits of the calls waiting for it.

    Used on the session pool's event loop only (readers and calls alike).
    """

    def __init__(self, on_trip: Callable[[], None]) -> None:
        self.received = 0
        self.tripped = False
        self._on_trip = on_trip
        self._calls: dict[object, tuple[int, int]] = {}  # call -> (received at its start, limit)
        self._over: set[object] = set()

    @contextmanager
    def call(self, limit_bytes: int) -> Iterator[object]:
        """Count what the server sends from now on against the wire allowance of an output
        limit of ``limit_bytes`` (``on_the_wire``); the call's token."""
        token = object()
        self._calls[token] = (self.received, on_the_wire(limit_bytes))
        try:
            yield token
        finally:
            del self._calls[token]

    def over(self, token: object) -> bool:
        """Whether the call ``token`` had been sent more than its limit when the meter tripped."""
        return token in self._over

    def _bound(self) -> int:
        limits = [limit for _, limit in self._calls.values()]
        return max(limits) if limits else on_the_wire(default_output_limit())

    def add(self, count: int, message: int) -> None:
        """Count ``count`` more bytes; ``message``: the bytes of the message being read so far.

        Raises:
            OverLimit: the meter tripped (now, or before).
        """
        self.received += count
        if self.tripped:
            raise OverLimit
        over = {t for t, (start, limit) in self._calls.items() if self.received - start > limit}
        if not over and message <= self._bound():
            return
        # One message past every waiting call's limit answers one of them: all fail with it.
        self._over = over or set(self._calls)
        self.tripped = True
        self._on_trip()
        raise OverLimit


class _Metered(httpx2.AsyncByteStream):
    """A response body counted as it arrives (a JSON body is one message; an event stream's
    events are bounded by the SDK, ``max_sse_event_size``)."""

    def __init__(self, stream: httpx2.AsyncByteStream, meter: Meter, one_message: bool) -> None:
        self._stream = stream
        self._meter = meter
        self._one_message = one_message

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            self._meter.add(len(chunk), size if self._one_message else 0)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def bound_http(meter: Meter) -> Callable[[httpx2.Response], object]:
    """An httpx ``response`` event hook that puts every response body under ``meter``.

    A body is counted as sent: the client asks for no compression (``IDENTITY``), and
    a ``Content-Encoding`` a server sends anyway is dropped, so the body is never
    expanded (a compressed answer does not parse, and fails as a parse error).
    """

    async def hook(response: httpx2.Response) -> None:
        if "content-encoding" in response.headers:
            del response.headers["content-encoding"]
        kind = response.headers.get("content-type", "").lower()
        one_message = not kind.startswith("text/event-stream")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Metered(response.stream, meter, one_message)

    return hook
