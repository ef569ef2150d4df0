"""`cleveragents mcp serve` on the embedded default: no broker, a local worker for its lifetime."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.mcp_support import (
    CLEVERAGENTS,
    INITIALIZE,
    WORD_COUNT,
    serve_env,
    stdio_session,
    text_of,
)
from tests.support.procs import free_port, kill_group, wait_until


def processes_in(folder: Path) -> list[int]:
    """Pids of the processes whose working directory is ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(os.readlink(entry / "cwd")) == folder:
                    found.append(int(entry.name))
    return found


def embedded_env() -> dict[str, str]:
    """No broker and no catalogue configured: the embedded default and the bundled examples."""
    env = serve_env(None)
    del env["CLEVERAGENTS_CATALOGUE"]
    return env


def test_with_no_broker_mcp_serve_runs_its_own_worker_lists_and_calls_a_tool(
    tmp_path: Path,
) -> None:
    async def scenario() -> tuple[list[str], Any]:
        with (tmp_path / "serve.err").open("w") as errlog:
            async with stdio_session(env=embedded_env(), errlog=errlog, cwd=tmp_path) as session:
                names = [tool.name for tool in (await session.list_tools()).tools]
                return names, await session.call_tool(WORD_COUNT, {"text": "a b c d"})

    names, result = anyio.run(scenario)

    assert WORD_COUNT in names
    assert result.structured_content == {"words": 4}, text_of(result)
    assert (tmp_path / ".cleveragents" / "logs" / "local-worker.log").exists()
    assert "starting a local worker" in (tmp_path / "serve.err").read_text()
    # The client closed stdin: the server ended and took its local worker with it.
    wait_until(lambda: not processes_in(tmp_path), 30, "the local worker to stop")




@pytest.mark.parametrize("when", ["starting", "serving"])
def test_sigterm_stops_the_server_and_its_local_worker_even_with_stdin_open(
    tmp_path: Path, when: str
) -> None:
    worker_log = tmp_path / ".cleveragents" / "logs" / "local-worker.log"
    with subprocess.Popen(
        [CLEVERAGENTS, "mcp", "serve"], env=embedded_env(), cwd=tmp_path,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    ) as proc:
        try:
            wait_until(lambda: len(processes_in(tmp_path)) > 2, 60, "the local worker to start")
            wait_until(worker_log.exists, 60, "the local worker's log")
            if when == "serving":
                assert proc.stdin is not None
                assert proc.stdout is not None
                proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
                proc.stdin.flush()
                answer = json.loads(proc.stdout.readline())
                assert answer["result"]["serverInfo"]["name"] == "cleveragents"

            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)

            assert proc.returncode == 0, err.decode()
            assert out == b""  # nothing but protocol on stdout
            assert "SIGTERM" in err.decode()
            wait_until(lambda: not processes_in(tmp_path), 30, "the local worker to stop")
        finally:
            kill_group(proc)
            for pid in processes_in(tmp_path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)



def _listens(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_stops_an_http_server_and_its_local_worker(tmp_path: Path) -> None:
    port = free_port()
    with subprocess.Popen(
        [CLEVERAGENTS, "mcp", "serve", "--transport", "http", "--port", str(port)],
        env=embedded_env(), cwd=tmp_path, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    ) as proc:
        try:
            wait_until(lambda: _listens(port) or proc.poll() is not None, 60, "listening")

            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)

            assert proc.returncode == 0, err.decode()
            assert "stopped by SIGTERM" in err.decode()
            assert out == b""
            wait_until(lambda: not processes_in(tmp_path), 30, "the local worker to stop")
        finally:
            kill_group(proc)
            for pid in processes_in(tmp_path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
