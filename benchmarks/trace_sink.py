"""An OTLP/HTTP endpoint that takes trace exports and drops them, counting what arrived.

``compare.py --trace-sample R`` points the cleveragents worker's exporter here, so
that its spans are really built, sampled, encoded and sent, and nothing slows them
down on the way.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["TraceSink"]


class TraceSink:
    """``POST /v1/traces`` on a free loopback port: answered 200, counted, dropped."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(size)
                sink.exports += 1
                sink.bytes += size
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self, ratio: float) -> dict[str, str]:
        """A worker's standard variables: export here, sample ``ratio`` of the traces."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": (
                f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
            ),
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(ratio),
            "OTEL_SERVICE_NAME": "cleveragents-bench",
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
