"""The fixture MCP server (tests/fixtures/mcp_server.py) as the remote of ``source: mcp`` tests."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import REPO, kill_group, wait_until

#: The catalogue folder of the fixture server's tools as `source: mcp` tools (stdio).
MCP_KIND_SKILLS = REPO / "tests" / "fixtures" / "mcp_kind_skills"
#: How a skill file starts the fixture server over stdio.
FIXTURE_COMMAND = ["python", "-m", "tests.fixtures.mcp_server"]


def listens(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def remote_http_server(port: int, log: Path) -> Iterator[str]:
    """The fixture server over streamable HTTP on ``port`` while the block runs; its URL."""
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.mcp_server", "--http", "--port", str(port)],
            cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_until(lambda: listens(port) or proc.poll() is not None, 60, "the fixture on HTTP")
        assert proc.poll() is None, log.read_text(errors="replace")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        kill_group(proc)
        proc.wait(10)
