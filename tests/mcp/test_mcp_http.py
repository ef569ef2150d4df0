"""`cleveragents mcp serve --transport http`: streamable HTTP at /mcp behind a bearer token."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.support.mcp_support import (
    CLEVERAGENTS,
    INITIALIZE,
    WORD_COUNT,
    Fleet,
    HttpServer,
    http_server,
    http_session,
    running_fleet,
    serve_env,
    text_of,
)

TOKEN = "s3cret-token-for-tests"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def fleet(session_redis_url: str) -> Iterator[Fleet]:
    with running_fleet(session_redis_url) as running:
        yield running


@pytest.fixture(scope="module")
def server(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    log = tmp_path_factory.mktemp("http") / "serve.log"
    env = serve_env(fleet.broker, CLEVERAGENTS_MCP_TOKEN=TOKEN)
    with http_server(env, log) as running:
        yield running


def post_initialize(url: str, headers: dict[str, str]) -> httpx2.Response:
    """One raw ``initialize`` POST, as any HTTP client would send it."""
    return httpx2.post(url, content=json.dumps(INITIALIZE), headers={**ACCEPT, **headers})


def test_with_the_token_a_client_lists_and_calls_tools(server: HttpServer) -> None:
    async def scenario() -> tuple[list[str], Any]:
        async with http_session(server.url, TOKEN) as session:
            names = [tool.name for tool in (await session.list_tools()).tools]
            return names, await session.call_tool(WORD_COUNT, {"text": "a b"})

    names, result = anyio.run(scenario)

    assert WORD_COUNT in names
    assert result.structured_content == {"words": 2}, text_of(result)


def test_without_a_token_the_endpoint_answers_401(server: HttpServer) -> None:
    response = post_initialize(server.url, {})

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert TOKEN not in response.text


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN, "Bearer"],
)
def test_with_a_wrong_token_the_endpoint_answers_401(
    server: HttpServer, authorization: str
) -> None:
    assert post_initialize(server.url, {"Authorization": authorization}).status_code == 401


def test_the_right_token_passes_the_guard(server: HttpServer) -> None:
    response = post_initialize(server.url, {"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200, response.text


def test_a_non_loopback_host_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [CLEVERAGENTS, "mcp", "serve", "--transport", "http", "--host", "0.0.0.0"],
        env=serve_env(None), cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )

    assert done.returncode == 2
    assert "CLEVERAGENTS_MCP_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""
    assert not (tmp_path / ".cleveragents" / "logs").exists()  # no local worker was started


def test_the_server_log_never_shows_the_token(server: HttpServer) -> None:
    post_initialize(server.url, {"Authorization": "Bearer wrong"})

    assert TOKEN not in server.log_text()
    assert "listening on http://127.0.0.1" in server.log_text()


def test_a_port_already_in_use_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [CLEVERAGENTS, "mcp", "serve", "--transport", "http", "--port", str(port)],
            env=serve_env(None), cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )

    assert done.returncode == 2
    expected = f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert done.stderr.strip() == expected
