"""The host configurations docs/mcp.md shows work as written: read from the page, run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_support import CLEVERAGENTS, http_server, serve_env
from tests.support.procs import EXAMPLE_SKILLS, REPO

DOC = REPO / "docs" / "mcp.md"
WORD_COUNT = "local_text-tools__local_word-count"


def _configs() -> list[dict[str, Any]]:
    """Each ``mcpServers`` entry of the page's JSON blocks."""
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    return [entry for block in blocks for entry in json.loads(block)["mcpServers"].values()]


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text)


async def _use(session: ClientSession) -> tuple[list[str], Any]:
    with anyio.fail_after(120):
        await session.initialize()
        names = [tool.name for tool in (await session.list_tools()).tools]
        return names, await session.call_tool(WORD_COUNT, {"text": "a b c"})


def test_the_stdio_config_of_the_docs_serves_the_catalogue(tmp_path: Path) -> None:
    [config] = [c for c in _configs() if "command" in c]
    assert Path(config["command"]).name == "cleveragents"
    # The page's example paths, made this machine's
    env = {**serve_env(None), **config["env"]}
    env["CLEVERAGENTS_CATALOGUE"] = str(EXAMPLE_SKILLS)
    env["CLEVERAGENTS_HOME"] = str(tmp_path / "home")
    params = StdioServerParameters(command=CLEVERAGENTS, args=config["args"], env=env, cwd=tmp_path)

    async def scenario() -> tuple[list[str], Any]:
        with (tmp_path / "stderr").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                return await _use(session)

    names, result = anyio.run(scenario)
    assert WORD_COUNT in names
    assert result.structured_content == {"words": 3}


def test_the_http_config_of_the_docs_sends_the_token_and_needs_it(tmp_path: Path) -> None:
    [config] = [c for c in _configs() if c.get("type") == "http"]
    token = os.urandom(16).hex()
    env = serve_env(None, CLEVERAGENTS_MCP_TOKEN=token, CLEVERAGENTS_HOME=str(tmp_path / "home"))
    with http_server(env, tmp_path / "serve.log") as server:
        # The page's URL, pointed at this server; its headers as a host expands them
        url = re.sub(r"^http://[^/]+", f"http://127.0.0.1:{server.port}", config["url"])
        headers = {k: _expand(v, env) for k, v in config["headers"].items()}

        async def scenario(sent: dict[str, str]) -> tuple[list[str], Any]:
            async with (
                httpx2.AsyncClient(headers=sent) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                return await _use(session)

        names, result = anyio.run(scenario, headers)
        assert WORD_COUNT in names
        assert result.structured_content == {"words": 3}
        refused = httpx2.post(url, json={}, headers={"Accept": "application/json"})
        assert refused.status_code == 401
