"""Hostile MCP servers for the output-bound tests: one over stdio, one over streamable HTTP.

Both speak JSON-RPC by hand with the standard library alone, so the stdio one runs
under ``/usr/bin/python3`` as the tool user of a root worker (``nobody`` cannot run
this checkout's venv). Each tool of theirs stands for one way to answer too much.

| tool | answers |
|---|---|
| ``whoami`` | the server's PID (HTTP: how many sessions it started) |
| ``sized`` | one text block of ``size`` characters |
| ``endless`` | the start of an answer, then ``x`` for ever: one line (or body) with no end |
| ``chatty`` | ``count`` log notifications of ``size`` characters, then a short answer (stdio) |
| ``error_text`` | ``isError: true`` with ``size`` characters of text |
| ``rpc_error`` | a JSON-RPC error whose message has ``size`` characters |
| ``invalid`` | ``count`` content blocks that are not content blocks (each fails many checks) |
| ``then_flood`` | its PID; half a second later, an endless line while no call waits (stdio) |
| ``sse_sized``, ``sse_endless`` | as ``sized`` and ``endless``, as an event stream (HTTP) |
| ``gzip_bomb`` | ``size`` bytes of answer, gzipped though the client asked for none (HTTP) |

A stdio server answers ``initialize`` with a JSON-RPC error of ``REFUSE_START``
characters when that variable is set.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["STDIO_SERVER", "HttpRemote", "hostile_http_server"]

STDIO_SERVER = r"""
import json, os, sys, threading, time

out = sys.stdout.buffer
writing = threading.Lock()

def send(message):
    with writing:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

def answer(message_id, result):
    send({"jsonrpc": "2.0", "id": message_id, "result": result})

def text(message_id, body, is_error=False):
    answer(message_id, {"content": [{"type": "text", "text": body}], "isError": is_error})

def endless(head):
    writing.acquire()  # for ever: nothing else is written
    out.write(head.encode())
    block = b"x" * 65536
    while True:  # until the client stops reading and the server is killed
        out.write(block)
        out.flush()

def flood_later():  # once the client has had its answer, and what it asks next
    time.sleep(0.5)
    endless("")

def head_of(message_id):
    return '{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "' % (
        json.dumps(message_id))

TOOLS = ("whoami", "sized", "endless", "chatty", "error_text", "rpc_error", "invalid",
         "then_flood")

for line in sys.stdin:
    message = json.loads(line)
    method, message_id = message.get("method"), message.get("id")
    params = message.get("params") or {}
    name, arguments = params.get("name"), params.get("arguments") or {}
    size, count = arguments.get("size", 0), arguments.get("count", 0)
    if method == "initialize" and os.environ.get("REFUSE_START"):
        send({"jsonrpc": "2.0", "id": message_id,
              "error": {"code": -32000, "message": "x" * int(os.environ["REFUSE_START"])}})
    elif method == "initialize":
        answer(message_id, {"protocolVersion": params["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "hostile", "version": "1"}})
    elif method == "tools/list":  # the client reads the tools' output schemas (none)
        answer(message_id, {"tools": [{"name": tool, "inputSchema": {"type": "object"}}
                                      for tool in TOOLS]})
    elif method != "tools/call":
        if message_id is not None:
            answer(message_id, {})
    elif name == "whoami":
        text(message_id, json.dumps({"pid": os.getpid()}))
    elif name == "sized":
        text(message_id, "x" * size)
    elif name == "endless":
        endless(head_of(message_id))
    elif name == "chatty":
        for _ in range(count):
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": "x" * size}})
        text(message_id, "done")
    elif name == "error_text":
        text(message_id, "disk full " + "x" * size, is_error=True)
    elif name == "rpc_error":
        send({"jsonrpc": "2.0", "id": message_id,
              "error": {"code": -32000, "message": "no " + "x" * size}})
    elif name == "invalid":
        answer(message_id, {"content": [{"type": "text", "text": 5}] * count})
    elif name == "then_flood":
        text(message_id, json.dumps({"pid": os.getpid()}))
        threading.Thread(target=flood_later, daemon=True).start()
"""


def _response(message_id: Any, result: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}).encode()


def _text(message_id: Any, body: str) -> bytes:
    return _response(message_id, {"content": [{"type": "text", "text": body}], "isError": False})


def _head(message_id: Any) -> bytes:
    """The start of a text answer, up to the opening quote of its text."""
    return b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "' % (
        json.dumps(message_id).encode()
    )


def _gzip_bomb(message_id: Any, size: int) -> bytes:
    """An answer of ``size`` bytes, gzip-compressed (about a thousandth of that)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
    parts = [packer.compress(_head(message_id))]
    block = b"x" * 1_000_000
    parts += [packer.compress(block) for _ in range(size // len(block))]
    parts.append(packer.compress(b'"}]}}') + packer.flush())
    return b"".join(parts)


@dataclass
class HttpRemote:
    """What the hostile HTTP server saw: sessions started, and answers the client cut off."""

    port: int
    sessions: int = 0
    cut_off: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


_HTTP_TOOLS = ("whoami", "sized", "endless", "sse_sized", "sse_endless", "gzip_bomb")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._empty(405)  # no stream of its own for server messages

    def do_DELETE(self) -> None:
        self._empty(200)

    def _send(self, body: bytes, kind: str = "application/json", **headers: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _endless(self, name: str, head: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Connection", "close")  # the body ends when the connection does
        self.end_headers()
        self.close_connection = True
        block = b"x" * 65536
        try:
            self.wfile.write(head)
            while True:
                self.wfile.write(block)
        except OSError:
            self.server.remote.cut_off.append(name)

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        method, message_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        name, arguments = params.get("name"), params.get("arguments") or {}
        if message_id is None:
            self._empty(202)
        elif method == "initialize":
            self.server.remote.sessions += 1
            result = {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile-http", "version": "1"},
            }
            session = f"session-{self.server.remote.sessions}"
            self._send(_response(message_id, result), Mcp_Session_Id=session)
        elif method == "tools/list":
            tools = [{"name": tool, "inputSchema": {"type": "object"}} for tool in _HTTP_TOOLS]
            self._send(_response(message_id, {"tools": tools}))
        elif method != "tools/call":
            self._send(_response(message_id, {}))
        elif name == "whoami":
            self._send(_text(message_id, json.dumps({"sessions": self.server.remote.sessions})))
        elif name == "sized":
            self._send(_text(message_id, "x" * arguments["size"]))
        elif name == "endless":
            self._endless(name, _head(message_id), "application/json")
        elif name == "sse_sized":
            event = b"event: message\ndata: " + _text(message_id, "x" * arguments["size"])
            self._send(event + b"\n\n", "text/event-stream")
        elif name == "sse_endless":
            self._endless(name, b"event: message\ndata: " + _head(message_id), "text/event-stream")
        elif name == "gzip_bomb":
            self._send(_gzip_bomb(message_id, arguments["size"]), Content_Encoding="gzip")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    remote: HttpRemote


@contextmanager
def hostile_http_server() -> Iterator[HttpRemote]:
    """The hostile HTTP server on a free port of 127.0.0.1, in threads, while the block runs."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.remote = HttpRemote(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.remote
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
