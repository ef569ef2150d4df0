"""`mcp serve --transport http` without a token: web pages and session floods stay out.

Issue 29, attacks 7 and 12, against real `cleveragents mcp serve` processes:

- DNS rebinding on other loopback spellings (127.0.0.2, ``0:0:0:0:0:0:0:1``,
  ``LOCALHOST``): a request whose Host or Origin names another site is refused
  (421 or 403) and never sees the tool list.
- Session lock-out: one client opening sessions as fast as it can neither locks
  out the next client nor grows the server without bound.

Issue 42, attack 8: nor does it close another client's idle session. A client is
a peer address; the tests' clients bind distinct loopback addresses
(127.0.0.3, 127.0.0.4, ...), as distinct machines would have.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import httpx2
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cleveragents.mcp.http import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    HostGuard,
    SessionLimit,
    guarded_app,
)
from tests.support.mcp_support import (
    CLEVERAGENTS,
    INITIALIZE,
    WORD_COUNT,
    http_session,
    serve_env,
)
from tests.support.procs import REPO, free_port, kill_group, wait_until

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
SESSION = "mcp-session-id"
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


@dataclass(frozen=True)
class Listening:
    """A `cleveragents mcp serve --transport http --host HOST` process."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log: Path

    @property
    def authority(self) -> str:
        """``host:port`` as a Host header writes it (an IPv6 address in brackets)."""
        name = f"[{self.host}]" if ":" in self.host else self.host
        return f"{name}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.authority}/mcp"


def _accepts(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def listening(broker: str, log: Path, host: str, *args: str) -> Iterator[Listening]:
    """Serve HTTP on ``host`` and a free port without a token; stop the process by its PID."""
    port = free_port()
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [CLEVERAGENTS, "mcp", "serve", "--transport", "http", "--host", host,
             "--port", str(port), *args],
            env=serve_env(broker), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: _accepts(host, port) or proc.poll() is not None, 60, "mcp serve")
        if proc.poll() is not None:
            pytest.fail(f"mcp serve exited early:\n{log.read_text(errors='replace')}")
        yield Listening(proc, host, port, log)
    finally:
        kill_group(proc)  # the process group whose id is the server's PID
        proc.wait(10)


def post(
    server: Listening, message: Mapping[str, object], headers: dict[str, str] | None = None
) -> httpx2.Response:
    """One raw JSON-RPC POST to ``/mcp`` (the Host header is the server's unless given)."""
    return httpx2.post(
        server.url, content=json.dumps(message), headers={**ACCEPT, **(headers or {})}, timeout=30
    )


def open_session(server: Listening) -> str:
    """A new session, by a raw ``initialize`` POST; its id."""
    response = post(server, INITIALIZE)
    assert response.status_code == 200, response.text
    return response.headers[SESSION]


def session_status(server: Listening, session_id: str) -> int:
    """What a notification on ``session_id`` answers: 202 while it is open, 404 once closed."""
    return post(server, INITIALIZED, {SESSION: session_id}).status_code


# --- attack 7: DNS rebinding on every spelling of loopback ---------------------------


@pytest.fixture(scope="module", params=["127.0.0.2", "0:0:0:0:0:0:0:1", "LOCALHOST"])
def loopback(
    request: pytest.FixtureRequest, session_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Listening]:
    """A tokenless server on a loopback spelling the SDK's own check does not cover."""
    log = tmp_path_factory.mktemp("rebinding") / "serve.log"
    with listening(session_redis_url, log, request.param) as server:
        yield server


HOSTILE = [
    pytest.param("attacker.example:{port}", "http://attacker.example:{port}", 421, id="rebound"),
    pytest.param("attacker.example:{port}", None, 421, id="host-only"),
    pytest.param("localhost.attacker.example:{port}", None, 421, id="lookalike-host"),
    pytest.param("{authority}", "http://attacker.example:{port}", 403, id="foreign-origin"),
    pytest.param("{authority}", "null", 403, id="null-origin"),
]


@pytest.mark.parametrize(("host", "origin", "status"), HOSTILE)
def test_a_foreign_host_or_origin_is_refused_before_any_session(
    loopback: Listening, host: str, origin: str | None, status: int
) -> None:
    headers = {"Host": host.format(port=loopback.port, authority=loopback.authority)}
    if origin is not None:
        headers["Origin"] = origin.format(port=loopback.port)

    response = post(loopback, INITIALIZE, headers)

    assert response.status_code == status, response.text
    assert SESSION not in response.headers


def test_a_rebound_page_never_reads_the_tool_list(loopback: Listening) -> None:
    # Given a session opened by a local client, whose id the page has somehow learnt
    session_id = open_session(loopback)
    assert session_status(loopback, session_id) == 202
    rebound = {"Host": f"attacker.example:{loopback.port}", "Origin": "http://attacker.example"}

    # When the page asks for the tools in it, and the local client does the same
    refused = post(loopback, TOOLS_LIST, {SESSION: session_id, **rebound})
    served = post(loopback, TOOLS_LIST, {SESSION: session_id})

    # Then only the local client sees them
    assert refused.status_code == 421
    assert WORD_COUNT not in refused.text
    assert served.status_code == 200
    assert WORD_COUNT in served.text


ACCEPTED = [
    pytest.param("{authority}", None, id="listen-address"),
    pytest.param("{authority}", "http://{authority}", id="same-origin"),
    pytest.param("localhost:{port}", "http://localhost:{port}", id="localhost"),
    pytest.param("127.0.0.1:{port}", None, id="127.0.0.1"),
    pytest.param("[::1]:{port}", "http://[::1]:{port}", id="ipv6-loopback"),
]


@pytest.mark.parametrize(("host", "origin"), ACCEPTED)
def test_the_listen_address_and_the_loopback_names_are_served(
    loopback: Listening, host: str, origin: str | None
) -> None:
    fill = {"port": loopback.port, "authority": loopback.authority}
    headers = {"Host": host.format(**fill)}
    if origin is not None:
        headers["Origin"] = origin.format(**fill)

    response = post(loopback, INITIALIZE, headers)

    assert response.status_code == 200, response.text
    assert response.headers[SESSION]


def test_the_sdk_client_lists_the_tools_on_the_listen_address(loopback: Listening) -> None:
    async def tool_names() -> list[str]:
        async with http_session(loopback.url, None) as session:
            return [tool.name for tool in (await session.list_tools()).tools]

    assert WORD_COUNT in anyio.run(tool_names)


# --- attack 12: one client opening sessions does not lock the others out --------------


@pytest.fixture(scope="module")
def default_server(
    session_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Listening]:
    """A tokenless server with the default session limits."""
    log = tmp_path_factory.mktemp("sessions") / "serve.log"
    with listening(session_redis_url, log, "127.0.0.2") as server:
        yield server


def test_a_session_flood_closes_the_oldest_idle_sessions_and_the_next_client_is_served(
    default_server: Listening,
) -> None:
    # Given one client that opened more sessions than the limit and left them idle
    extra = 10
    started = time.monotonic()
    flood = [open_session(default_server) for _ in range(DEFAULT_MAX_SESSIONS + extra)]
    flooding = time.monotonic() - started

    # When another client comes
    async def tool_names() -> list[str]:
        async with http_session(default_server.url, None) as session:
            return [tool.name for tool in (await session.list_tools()).tools]

    # Then it is served, the oldest idle sessions made room (bounded memory), the newest live
    assert WORD_COUNT in anyio.run(tool_names)
    assert [session_status(default_server, sid) for sid in flood[: extra + 1]] == [404] * (
        extra + 1
    )
    assert session_status(default_server, flood[-1]) == 202
    assert flooding < 60, f"{len(flood)} sessions took {flooding:.1f} s"


def _from(address: str) -> httpx2.Client:
    """An HTTP client whose connections come from ``address`` (a loopback address: a peer)."""
    return httpx2.Client(transport=httpx2.HTTPTransport(local_address=address), timeout=30)


def _flood_then_list(
    server: Listening, flooder: httpx2.Client, headers: dict[str, str] | None = None
) -> tuple[int, str, list[int]]:
    """A second client's idle session, one client's flood of ``initialize``, then the second
    client's ``tools/list``: its status and body, and the statuses of the flood."""
    with _from("127.0.0.4") as victim:
        # Given another client's session, initialized and left idle
        opened = victim.post(server.url, content=json.dumps(INITIALIZE), headers=ACCEPT)
        assert opened.status_code == 200, opened.text
        session = {SESSION: opened.headers[SESSION]}
        ready = victim.post(server.url, content=json.dumps(INITIALIZED),
                            headers={**ACCEPT, **session})
        assert ready.status_code == 202, ready.text
        # When one client opens far more sessions than the whole server keeps
        flood = [
            flooder.post(server.url, content=json.dumps(INITIALIZE),
                         headers={**ACCEPT, **(headers or {})}).status_code
            for _ in range(DEFAULT_MAX_SESSIONS + 50)
        ]
        # Then the other client's session still answers
        listed = victim.post(server.url, content=json.dumps(TOOLS_LIST),
                             headers={**ACCEPT, **session})
        return listed.status_code, listed.text, flood


def test_a_session_flood_never_closes_another_clients_idle_session(
    default_server: Listening,
) -> None:
    with _from("127.0.0.3") as flooder:
        status, body, flood = _flood_then_list(default_server, flooder)

    assert status == 200, body
    assert WORD_COUNT in body
    assert flood == [200] * len(flood)  # the flood recycled its own idle sessions


def test_a_forged_x_forwarded_for_does_not_make_a_flood_count_as_another_client(
    default_server: Listening,
) -> None:
    # From 127.0.0.1, which uvicorn trusts for proxy headers by default, naming the victim
    with _from("127.0.0.1") as flooder:
        status, body, _ = _flood_then_list(
            default_server, flooder, {"X-Forwarded-For": "127.0.0.4"}
        )

    assert status == 200, body
    assert WORD_COUNT in body


@pytest.fixture(scope="module")
def small_server(
    session_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Listening]:
    """A tokenless server that keeps three sessions, each at most two idle seconds."""
    log = tmp_path_factory.mktemp("small") / "serve.log"
    args = ("--max-sessions", "3", "--session-idle-timeout", "2")
    with listening(session_redis_url, log, "127.0.0.2", *args) as server:
        yield server


def test_when_every_session_is_in_use_a_new_one_gets_a_clear_503(small_server: Listening) -> None:
    url = small_server.url

    async def scenario() -> tuple[httpx2.Response, int]:
        async with httpx2.AsyncClient(timeout=30) as http, contextlib.AsyncExitStack() as held:
            # Given three sessions, each with a request in flight (an open GET stream)
            streams = []
            for _ in range(3):
                opened = await http.post(url, content=json.dumps(INITIALIZE), headers=ACCEPT)
                assert opened.status_code == 200, opened.text
                get = http.stream(
                    "GET", url, headers={"Accept": "text/event-stream",
                                         SESSION: opened.headers[SESSION]},
                )
                stream = await held.enter_async_context(get)
                assert stream.status_code == 200
                streams.append(stream)
            # When a fourth client opens one, then again once a stream has ended
            refused = await http.post(url, content=json.dumps(INITIALIZE), headers=ACCEPT)
            await streams[0].aclose()
            await anyio.sleep(0)  # the server sees the closed stream
            with anyio.fail_after(10):
                while True:
                    again = await http.post(url, content=json.dumps(INITIALIZE), headers=ACCEPT)
                    if again.status_code != 503:
                        break
                    await anyio.sleep(0.05)
            return refused, again.status_code

    refused, later = anyio.run(scenario)

    # Then the first is refused with a clear answer and no session, the second served
    assert refused.status_code == 503
    assert "sessions" in refused.text
    assert SESSION not in refused.headers
    assert later == 200


def test_an_idle_session_is_closed_after_the_idle_timeout(small_server: Listening) -> None:
    session_id = open_session(small_server)

    # Each probe is itself activity: probing less often than the timeout lets it expire
    wait_until(lambda: session_status(small_server, session_id) == 404, 30,
               "the idle session to be closed", interval=3)


# --- the guards in process, against a stand-in for the SDK's session manager ----------


class SdkStandIn:
    """Opens a session for a POST without an id and ends it on DELETE, as the SDK does.

    A GET on a session is held open until ``release`` is set: a request in flight.
    """

    def __init__(self) -> None:
        self.open: list[str] = []
        self.deleted: list[str] = []
        self.release = anyio.Event()
        #: GETs held open now (requests in flight).
        self.held = 0

    async def holding(self, count: int) -> None:
        """Return once ``count`` GETs are held open (at most 5 s)."""
        with anyio.fail_after(5):
            while self.held < count:
                await anyio.sleep(0)  # a checkpoint: the held requests start meanwhile

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        session = headers.get(SESSION.encode(), b"").decode()
        if not session:
            session = f"s{len(self.open) + len(self.deleted)}"
            self.open.append(session)
            await _respond(send, 200, [(SESSION.encode(), session.encode())])
        elif session not in self.open:
            await _respond(send, 404)
        elif scope["method"] == "DELETE":
            self.open.remove(session)
            self.deleted.append(session)
            await _respond(send, 200)
        elif scope["method"] == "GET":
            self.held += 1
            await self.release.wait()
            self.held -= 1
            await _respond(send, 200)
        else:
            await _respond(send, 202)


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers or []})
    await send({"type": "http.response.body", "body": b""})


async def call(
    app: ASGIApp, method: str = "POST", session: str | None = None, host: str = "127.0.0.2:1",
    *, peer: str | None = None, **more: str,
) -> tuple[int, dict[bytes, bytes]]:
    """One request straight into an ASGI app (from ``peer``): its status and headers."""
    headers = [(b"host", host.encode())] if host else []
    if session is not None:
        headers.append((SESSION.encode(), session.encode()))
    headers += [(name.encode(), value.encode()) for name, value in more.items()]
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers,
             "query_string": b""}
    if peer is not None:
        scope["client"] = (peer, 50000)
    answered: list[tuple[int, dict[bytes, bytes]]] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answered.append((message["status"], dict(message.get("headers") or [])))

    await app(scope, receive, send)
    return answered[0]


async def opened(app: ASGIApp, peer: str | None = None) -> str:
    status, headers = await call(app, peer=peer)
    assert status == 200
    return headers[SESSION.encode()].decode()


def test_the_session_table_never_grows_past_the_limit() -> None:
    async def scenario() -> tuple[SdkStandIn, SessionLimit, list[str]]:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=5, idle_timeout=300)
        ids = [await opened(limit) for _ in range(50)]
        return sdk, limit, ids

    sdk, limit, ids = anyio.run(scenario)

    assert limit.open_sessions == 5
    assert sdk.open == ids[-5:]
    assert sdk.deleted == ids[:-5]  # the oldest first


def test_the_least_recently_used_idle_session_makes_room_and_a_busy_one_never_does() -> None:
    async def scenario() -> SdkStandIn:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=3, idle_timeout=300)
        busy, used, unused = [await opened(limit) for _ in range(3)]
        assert (await call(limit, session=used))[0] == 202
        async with anyio.create_task_group() as group:
            group.start_soon(call, limit, "GET", busy)  # a stream held open: oldest, but busy
            await sdk.holding(1)
            await opened(limit)
            sdk.release.set()
        assert sdk.deleted == [unused]
        return sdk

    anyio.run(scenario)


def test_when_every_session_is_busy_a_new_one_is_refused_with_503_and_nothing_opens() -> None:
    async def scenario() -> tuple[int, SdkStandIn]:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=1, idle_timeout=300)
        held = await opened(limit)
        async with anyio.create_task_group() as group:
            group.start_soon(call, limit, "GET", held)
            await sdk.holding(1)
            status, _ = await call(limit)
            sdk.release.set()
        return status, sdk

    status, sdk = anyio.run(scenario)

    assert status == 503
    assert len(sdk.open) == 1
    assert sdk.deleted == []


def test_a_session_the_sdk_closed_when_idle_is_forgotten_without_a_delete() -> None:
    now = [0.0]

    async def scenario() -> SdkStandIn:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=1, idle_timeout=10, clock=lambda: now[0])
        first = await opened(limit)
        now[0] += 12  # past the idle timeout: the SDK has closed it
        sdk.open.remove(first)
        await opened(limit)
        return sdk

    assert anyio.run(scenario).deleted == []


def test_a_session_its_client_deleted_frees_its_place() -> None:
    async def scenario() -> SessionLimit:
        limit = SessionLimit(SdkStandIn(), max_sessions=2, idle_timeout=300)
        first = await opened(limit)
        assert (await call(limit, "DELETE", first))[0] == 200
        return limit

    assert anyio.run(scenario).open_sessions == 0


def test_a_client_at_its_cap_recycles_only_its_own_least_recently_used_idle_session() -> None:
    async def scenario() -> tuple[SdkStandIn, SessionLimit, str, list[str]]:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=10, idle_timeout=300, max_per_client=2)
        other = await opened(limit, "10.0.0.1")
        flood = [await opened(limit, "10.0.0.2") for _ in range(6)]
        return sdk, limit, other, flood

    sdk, limit, other, flood = anyio.run(scenario)

    assert sdk.deleted == flood[:4]  # its own, oldest first
    assert sdk.open == [other, *flood[4:]]
    assert limit.sessions_of("10.0.0.2") == 2


def test_a_client_whose_every_session_is_busy_gets_429_and_nothing_else_closes() -> None:
    async def scenario() -> tuple[int, SdkStandIn]:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=10, idle_timeout=300, max_per_client=1)
        await opened(limit, "10.0.0.1")
        held = await opened(limit, "10.0.0.2")
        async with anyio.create_task_group() as group:
            group.start_soon(partial(call, limit, "GET", held, peer="10.0.0.2"))
            await sdk.holding(1)
            status, _ = await call(limit, peer="10.0.0.2")
            sdk.release.set()
        return status, sdk

    status, sdk = anyio.run(scenario)

    assert status == 429
    assert sdk.deleted == []
    assert len(sdk.open) == 2


def test_a_full_table_takes_room_from_the_client_holding_most_never_from_a_smaller_one() -> None:
    async def scenario() -> tuple[SdkStandIn, list[str], str, int]:
        sdk = SdkStandIn()
        limit = SessionLimit(sdk, max_sessions=4, idle_timeout=300, max_per_client=3)
        big = [await opened(limit, "10.0.0.1") for _ in range(3)]
        small = await opened(limit, "10.0.0.2")
        await opened(limit, "10.0.0.3")  # the table is full: the big client gives way
        # Now every client holds one or two; one holding one, all busy, asks for a second
        sessions = [sid for sid in sdk.open if sid != small]
        async with anyio.create_task_group() as group:
            for sid in sessions:
                group.start_soon(partial(call, limit, "GET", sid))
            await sdk.holding(len(sessions))
            status, _ = await call(limit, peer="10.0.0.3")
            sdk.release.set()
        return sdk, big, small, status

    sdk, big, small, status = anyio.run(scenario)

    assert sdk.deleted == big[:1]
    # The small client's idle session is never taken for a client holding as many
    assert small in sdk.open
    assert status == 503


@pytest.mark.parametrize(
    "host",
    ["127.0.0.2", "127.0.0.2:8765", "127.0.0.2:", "localhost:1", "LocalHost", "127.0.0.1:9",
     "[::1]:9", "[0:0:0:0:0:0:0:1]", "[::0001]:9"],
)
def test_host_guard_accepts_the_listen_address_and_loopback_names(host: str) -> None:
    assert HostGuard(SdkStandIn(), "127.0.0.2").host_allowed(
        {"headers": [(b"host", host.encode())]}
    )


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "attacker.example:8765", "127.0.0.2.attacker.example",
     "localhost.attacker.example", "localhost.", "127.0.0.3:1", "0.0.0.0:1", "[::1", "::1",
     "[::1]x", "localhost:port", "", "127.0.0.2@attacker.example"],
)
def test_host_guard_refuses_any_other_name(host: str) -> None:
    assert not HostGuard(SdkStandIn(), "127.0.0.2").host_allowed(
        {"headers": [(b"host", host.encode())]}
    )


def test_host_guard_refuses_a_missing_or_a_second_host_header() -> None:
    host_guard = HostGuard(SdkStandIn(), "127.0.0.2")

    assert not host_guard.host_allowed({"headers": []})
    assert not host_guard.host_allowed(
        {"headers": [(b"host", b"127.0.0.2"), (b"host", b"attacker.example")]}
    )


@pytest.mark.parametrize(
    ("listen", "origin", "allowed"),
    [
        ("127.0.0.2", "http://127.0.0.2:8765", True),
        ("127.0.0.2", "https://localhost:3000", True),
        ("0:0:0:0:0:0:0:1", "http://[::1]:8765", True),
        ("LOCALHOST", "http://localhost:8765", True),
        ("127.0.0.2", "http://attacker.example", False),
        ("127.0.0.2", "null", False),
        ("127.0.0.2", "file://", False),
        ("127.0.0.2", "ftp://localhost", False),
        ("127.0.0.2", "http://localhost/path", False),
        ("LOCALHOST", "http://localhost.attacker.example", False),
    ],
)
def test_host_guard_checks_the_origin_by_its_name(listen: str, origin: str, allowed: bool) -> None:
    scope = {"headers": [(b"origin", origin.encode())]}

    assert HostGuard(SdkStandIn(), listen).origin_allowed(scope) is allowed


def test_a_refused_host_never_costs_a_session_its_place() -> None:
    async def scenario() -> tuple[int, SdkStandIn]:
        sdk = SdkStandIn()
        app = guarded_app(sdk, host="127.0.0.2", token=None, max_sessions=1)
        await opened(app)
        status, _ = await call(app, host="attacker.example")
        return status, sdk

    status, sdk = anyio.run(scenario)

    assert status == 421
    assert sdk.deleted == []


def test_with_a_token_the_token_is_the_check_and_any_host_may_carry_it() -> None:
    # A reverse proxy in front of a tokened server passes its own Host through.
    async def scenario() -> tuple[int, int]:
        app = guarded_app(SdkStandIn(), host="127.0.0.1", token="t0ken")
        without, _ = await call(app, host="mcp.example.com")
        with_it, _ = await call(app, host="mcp.example.com", authorization="Bearer t0ken")
        return without, with_it

    assert anyio.run(scenario) == (401, 200)


def test_the_command_line_defaults_are_the_documented_ones() -> None:
    from cleveragents.cli.mcp_cmd import serve_command

    defaults = {param.name: param.default for param in serve_command.params}

    assert defaults["max_sessions"] == DEFAULT_MAX_SESSIONS == 100
    assert defaults["max_sessions_per_client"] == DEFAULT_MAX_SESSIONS_PER_CLIENT == 16
    assert defaults["session_idle_timeout"] == DEFAULT_SESSION_IDLE_TIMEOUT == 300
