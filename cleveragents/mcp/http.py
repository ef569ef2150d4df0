"""Streamable HTTP at ``/mcp``, behind ``Authorization: Bearer $CLEVERAGENTS_MCP_TOKEN``.

The server binds to 127.0.0.1 unless told otherwise. Off the loopback interface
it refuses to start without a token; with a token every HTTP request must carry
it (401 otherwise), compared in constant time. On loopback without a token it
serves anyone on this machine, with a warning (the SDK's DNS-rebinding check
keeps web pages out).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket

from starlette.types import ASGIApp, Receive, Scope, Send

from cleveragents.errors import ConfigurationError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "MCP_PATH",
    "TOKEN_ENV",
    "BearerGuard",
    "check_http_options",
    "is_loopback",
]

#: The environment variable holding the bearer token HTTP clients must send.
TOKEN_ENV = "CLEVERAGENTS_MCP_TOKEN"
#: Where the streamable-HTTP endpoint is served.
MCP_PATH = "/mcp"
#: Defaults of ``cleveragents mcp serve --transport http``.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_http_options(host: str, token: str | None, port: int | None = None) -> None:
    """Refuse (``ConfigurationError``) to serve HTTP beyond loopback without a token.

    With ``port``, also refuse when that address cannot be bound (in use, or not
    an address of this machine), before anything is started.
    """
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"refusing to serve MCP on {host} without a token: set {TOKEN_ENV} "
            "(clients then send Authorization: Bearer <token>), or bind to 127.0.0.1"
        )
    if port is not None:
        _check_bindable(host, port)


def _check_bindable(host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            probe.bind(address)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, credentials = bytes(value).partition(b" ")
            return credentials.strip() if scheme.lower() == b"bearer" else None
    return None


class BearerGuard:
    """ASGI middleware: HTTP requests without the right bearer token get 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    def authorised(self, scope: Scope) -> bool:
        """Whether the request carries the token (compared in constant time)."""
        given = _bearer(scope)
        return given is not None and hmac.compare_digest(given, self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.authorised(scope):
            await _unauthorised(send)
            return
        await self.app(scope, receive, send)


async def _unauthorised(send: Send) -> None:
    body = json.dumps(
        {"error": "invalid_token", "error_description": f"send Authorization: Bearer ${TOKEN_ENV}"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="cleveragents-mcp"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
