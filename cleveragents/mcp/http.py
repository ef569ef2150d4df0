"""Streamable HTTP at ``/mcp``: who may call, and how many sessions it keeps.

The server binds to 127.0.0.1 unless told otherwise. Off the loopback interface
it refuses to start without a token; with a token every HTTP request must carry
it (401 otherwise), compared in constant time (``BearerGuard``). On loopback
without a token it serves any process on this machine, with a warning, and
``HostGuard`` keeps web pages out: a request whose Host or Origin names anything
but the listen address or a loopback name is refused (DNS rebinding). Either
way ``SessionLimit`` keeps at most ``--max-sessions`` sessions, and at most
``--max-sessions-per-client`` of them for one client (one peer address): a new
session closes the least recently used idle session of its own client, never
another's, so one client can neither lock out nor evict the others.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cleveragents.errors import ConfigurationError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SESSIONS_PER_CLIENT",
    "DEFAULT_PORT",
    "DEFAULT_SESSION_IDLE_TIMEOUT",
    "MCP_PATH",
    "TOKEN_ENV",
    "BearerGuard",
    "HostGuard",
    "SessionLimit",
    "check_http_options",
    "guarded_app",
    "is_loopback",
]

log = logging.getLogger("cleveragents.mcp")

#: The environment variable holding the bearer token HTTP clients must send.
TOKEN_ENV = "CLEVERAGENTS_MCP_TOKEN"
#: Where the streamable-HTTP endpoint is served.
MCP_PATH = "/mcp"
#: Defaults of ``cleveragents mcp serve --transport http``.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: Default of ``--max-sessions``: open MCP sessions one server keeps at most.
DEFAULT_MAX_SESSIONS = 100
#: Default of ``--max-sessions-per-client``: open sessions one client (peer address) keeps at
#: most; an MCP host needs one per server connection, a handful at most.
DEFAULT_MAX_SESSIONS_PER_CLIENT = 16
#: Default of ``--session-idle-timeout``: seconds without a request before a session is closed.
DEFAULT_SESSION_IDLE_TIMEOUT = 300.0


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
    await _answer(
        send, 401,
        {"error": "invalid_token", "error_description": f"send Authorization: Bearer ${TOKEN_ENV}"},
        (b"www-authenticate", b'Bearer realm="cleveragents-mcp"'),
    )


async def _answer(send: Send, status: int, body: object, *headers: tuple[bytes, bytes]) -> None:
    """A whole JSON response, for requests refused before the SDK sees them."""
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower-case) in ASGI headers."""
    return [bytes(value) for key, value in headers if bytes(key).lower() == name]


# --- Host and Origin: no DNS rebinding on any spelling of loopback -------------------

#: Names every tokenless server answers to besides its listen address: what a local
#: client writes in its URL. An IP literal cannot be rebound; ``localhost`` is never
#: resolved through DNS (RFC 6761), so none of them can point a web page here.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _name_key(name: str) -> str | ipaddress.IPv4Address | ipaddress.IPv6Address:
    """What two names are compared by: the address for an IP literal (any spelling), else the
    lower-cased name."""
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return name.lower()


def _authority_name(authority: str) -> str | None:
    """The host name of ``host[:port]`` (``[v6][:port]``), or None when it is malformed."""
    if authority.startswith("["):
        name, bracket, port = authority[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return None
        port = port[1:]
    else:
        name, _, port = authority.partition(":")
    if not name or (port != "" and not port.isdigit()):
        return None
    return name


class HostGuard:
    """ASGI middleware: without a token, only requests to this server's own names pass.

    DNS rebinding points a name the attacker owns at 127.0.0.1 (any 127.x, ``::1``):
    the browser then sends ``Host: attacker.example`` and ``Origin:
    http://attacker.example``. Host must name the listen address or a loopback name
    (421 otherwise: the request was meant for another site); Origin, when sent, must
    be ``http(s)://`` one of the same names (403 otherwise: a page of another site).
    Ports are not compared: a rebinding page cannot change the name, and a port
    forward (``ssh -L``) legitimately changes the port.
    """

    def __init__(self, app: ASGIApp, listen_host: str) -> None:
        self.app = app
        self._names = {_name_key(name) for name in (listen_host.strip("[]"), *LOOPBACK_NAMES)}

    def _ours(self, authority: bytes) -> bool:
        name = _authority_name(authority.decode("latin-1").strip())
        return name is not None and _name_key(name) in self._names

    def host_allowed(self, scope: Scope) -> bool:
        """Exactly one Host header, naming this server."""
        hosts = _header_values(scope.get("headers", ()), b"host")
        return len(hosts) == 1 and self._ours(hosts[0])

    def origin_allowed(self, scope: Scope) -> bool:
        """No Origin header, or only ones naming this server (``null`` is a foreign page)."""
        for origin in _header_values(scope.get("headers", ()), b"origin"):
            scheme, sep, authority = origin.strip().partition(b"://")
            if not sep or scheme.lower() not in (b"http", b"https") or b"/" in authority:
                return False
            if not self._ours(authority):
                return False
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if not self.host_allowed(scope):
                await _answer(send, 421, {"error": "misdirected_request", "error_description":
                                          "the Host header does not name this server"})
                return
            if not self.origin_allowed(scope):
                await _answer(send, 403, {"error": "forbidden_origin", "error_description":
                                          "requests from other sites' pages are refused"})
                return
        await self.app(scope, receive, send)


# --- Sessions: a bounded table where a client's own idle sessions make room ----------

#: The response header (and request header) that carries a session's id.
SESSION_HEADER = b"mcp-session-id"
#: Seconds past the idle timeout after which a session is surely closed by the SDK.
_IDLE_SLACK = 1.0
#: At most one warning about the session limit per this many seconds.
_WARN_EVERY = 60.0
#: The client key of a request whose peer the server does not know (no ``client`` in scope).
_UNKNOWN_PEER = "unknown"


def peer_of(scope: Scope) -> str:
    """The client a request counts against: its peer's IP address (the TCP connection's).

    Not the bearer token, which every client of a server shares, and not
    ``X-Forwarded-For``, which any client can write (``mcp serve`` turns uvicorn's
    proxy headers off, so ``scope["client"]`` is the connection's own address).
    """
    client = scope.get("client")
    return str(client[0]) if client else _UNKNOWN_PEER


@dataclass
class _Use:
    """What the limit knows of one open session."""

    in_flight: int
    last_active: float
    #: The client (peer address) that opened it.
    peer: str = _UNKNOWN_PEER


class SessionLimit:
    """ASGI middleware: at most ``max_sessions`` MCP sessions, ``max_per_client`` per client.

    A client is a peer address (``peer_of``). A session is idle when no request of
    it is in flight (an open GET stream is one). When a request without a session
    id would give its client more than ``max_per_client`` sessions, that client's
    own least recently used idle session is closed through the SDK's own front
    door (a DELETE with its id); when none of its sessions is idle, the new one is
    refused with 429. When it would make more than ``max_sessions`` in all, the
    victim is an idle session of the client holding the most sessions, this
    client's own first on a tie, and never one of a client holding no more
    sessions than this one; without such a victim the new one is refused with 503.
    One client opening sessions in a loop thus only ever recycles its own idle
    sessions and never closes, nor locks out, another client's; a client that
    keeps a stream open keeps its session. The table never holds more than
    ``max_sessions`` sessions; one the SDK closed after ``idle_timeout`` is
    forgotten soon after.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_sessions: int,
        idle_timeout: float,
        *,
        max_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
        path: str = MCP_PATH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1 or max_per_client < 1 or not idle_timeout > 0:
            raise ValueError("max_sessions, max_per_client and idle_timeout must be positive")
        self.app = app
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client
        self.idle_timeout = idle_timeout
        self._path = path
        self._clock = clock
        self._sessions: dict[str, _Use] = {}
        #: Sessions being opened (no id yet), by client.
        self._opening: dict[str, int] = {}
        self._closed = 0
        self._warned_at: float | None = None

    @property
    def open_sessions(self) -> int:
        """Sessions known to be open (for tests and logs)."""
        return len(self._sessions)

    def sessions_of(self, peer: str) -> int:
        """Sessions of one client, open or being opened."""
        held = sum(1 for use in self._sessions.values() if use.peer == peer)
        return held + self._opening.get(peer, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != self._path:
            await self.app(scope, receive, send)
            return
        ids = _header_values(scope.get("headers", ()), SESSION_HEADER)
        if ids:
            await self._in_session(ids[0].decode("latin-1"), scope, receive, send)
        elif scope.get("method") == "POST":
            await self._opening_request(scope, receive, send)
        else:
            await self.app(scope, receive, send)  # the SDK refuses it; it opens nothing

    async def _in_session(self, session_id: str, scope: Scope, receive: Receive,
                          send: Send) -> None:
        use = self._sessions.get(session_id)
        if use is None:  # unknown or closed: the SDK answers 404
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        use.in_flight += 1
        try:
            await self.app(scope, receive, watch)
        finally:
            use.in_flight -= 1
            use.last_active = self._clock()
            ended = status == 404 or (scope.get("method") == "DELETE" and status == 200)
            if ended and self._sessions.get(session_id) is use:
                del self._sessions[session_id]

    async def _opening_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._forget_expired()
        peer = peer_of(scope)
        victim, refusal = self._make_room(peer)
        if refusal is not None:
            status, message = refusal
            self._warn(message)
            await _answer(send, status, {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32000, "message": message}})
            return
        self._opening[peer] = self._opening.get(peer, 0) + 1
        opened: _Use | None = None

        async def watch(message: Message) -> None:
            nonlocal opened
            if message["type"] == "http.response.start" and opened is None:
                ids = _header_values(message.get("headers", ()), SESSION_HEADER)
                if message["status"] < 400 and ids:
                    opened = _Use(1, self._clock(), peer)
                    self._sessions[ids[0].decode("latin-1")] = opened
                    self._done_opening(peer)
            await send(message)

        try:
            if victim is not None:
                await self._close(victim, scope)
            await self.app(scope, receive, watch)
        finally:
            if opened is None:
                self._done_opening(peer)
            else:
                opened.in_flight -= 1
                opened.last_active = self._clock()

    def _make_room(self, peer: str) -> tuple[str | None, tuple[int, str] | None]:
        """The session to close to make room for one more of ``peer``'s, and the refusal.

        ``(victim or None, None)`` when the new session may open once the victim, if
        any, is closed; ``(None, (status, message))`` when it is refused. The victim
        leaves the table here, before any await, so two requests never pick the same one.
        """
        held = self.sessions_of(peer)
        if held >= self.max_per_client:
            victim = self._least_recently_used_idle(lambda use: use.peer == peer)
            if victim is None:
                return None, (429, f"too many open sessions for this client: all its "
                                  f"{self.max_per_client} are in use; retry when one ends")
            why = (f"a client at its {self.max_per_client} sessions: closing its own least "
                   "recently used idle one")
        elif len(self._sessions) + sum(self._opening.values()) >= self.max_sessions:
            victim = self._fairest_victim(peer, held)
            if victim is None:
                return None, (503, f"too many open sessions: all {self.max_sessions} are in "
                                   "use; retry when one ends")
            why = (f"{self.max_sessions} sessions open: closing an idle one of the client "
                   "holding the most")
        else:
            return None, None
        del self._sessions[victim]
        self._closed += 1
        self._warn(why)
        return victim, None

    def _fairest_victim(self, peer: str, held: int) -> str | None:
        """An idle session of the client holding the most (``peer``'s own first on a tie).

        Never one of another client holding ``held`` sessions or fewer: a new session never
        costs a client with no more sessions than its own client one of theirs.
        """
        counts: dict[str, int] = {}
        for use in self._sessions.values():
            counts[use.peer] = counts.get(use.peer, 0) + 1
        candidates = [
            (-counts[use.peer], use.peer != peer, use.last_active, sid)
            for sid, use in self._sessions.items()
            if not use.in_flight and (use.peer == peer or counts[use.peer] > held)
        ]
        return min(candidates)[3] if candidates else None

    def _done_opening(self, peer: str) -> None:
        left = self._opening.get(peer, 0) - 1
        if left > 0:
            self._opening[peer] = left
        else:
            self._opening.pop(peer, None)

    def _forget_expired(self) -> None:
        """Forget sessions idle past the timeout: the SDK has closed them."""
        horizon = self._clock() - self.idle_timeout - _IDLE_SLACK
        for session_id, use in list(self._sessions.items()):
            if not use.in_flight and use.last_active < horizon:
                del self._sessions[session_id]

    def _least_recently_used_idle(self, among: Callable[[_Use], bool]) -> str | None:
        idle = [(use.last_active, sid) for sid, use in self._sessions.items()
                if not use.in_flight and among(use)]
        return min(idle)[1] if idle else None

    async def _close(self, session_id: str, scope: Scope) -> None:
        """End a session as its client would: DELETE with its id, straight to the SDK."""
        hosts = [(b"host", host) for host in _header_values(scope.get("headers", ()), b"host")]
        closing = {**scope, "method": "DELETE", "query_string": b"",
                   "headers": [*hosts, (SESSION_HEADER, session_id.encode("latin-1"))]}
        requested = False

        async def receive() -> Message:
            nonlocal requested
            if requested:
                return {"type": "http.disconnect"}
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(message: Message) -> None:
            return None

        try:
            await self.app(closing, receive, discard)
        except Exception:  # the SDK closes it on its own at the idle timeout anyway
            log.warning("could not close an idle session to make room", exc_info=True)

    def _warn(self, what: str) -> None:
        now = self._clock()
        if self._warned_at is None or now - self._warned_at >= _WARN_EVERY:
            self._warned_at = now
            log.warning("%s (%d idle sessions closed so far)", what, self._closed)


def guarded_app(
    app: ASGIApp,
    *,
    host: str,
    token: str | None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout: float = DEFAULT_SESSION_IDLE_TIMEOUT,
    max_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
) -> ASGIApp:
    """The SDK's app behind the session limit, then the token or, without one, Host and Origin.

    The outer guard refuses first, so a refused request never costs a session its place.
    """
    limited = SessionLimit(app, max_sessions, idle_timeout, max_per_client=max_per_client)
    return BearerGuard(limited, token) if token else HostGuard(limited, host)
