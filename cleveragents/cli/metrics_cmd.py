"""``cleveragents metrics``: a Prometheus exporter for queues and invocations."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click
import redis

from cleveragents.cli.render import CliFailure
from cleveragents.metrics import render
from cleveragents.settings import Settings

__all__ = ["metrics"]


def _redis(settings: Settings) -> Any:
    url = settings.result_backend or settings.broker_url
    if not url or not url.startswith(("redis://", "rediss://", "unix://")):
        raise CliFailure("metrics need Redis: set CLEVERAGENTS_BROKER_URL to a redis:// URL")
    return redis.Redis.from_url(url, socket_timeout=10)


@click.command()
@click.option("--port", default=9808, show_default=True, help="Port to serve /metrics on.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0 to serve other machines, e.g. in a container).",
)
@click.option("--once", is_flag=True, help="Print the metrics once and exit.")
def metrics(port: int, host: str, once: bool) -> None:
    """Export queue lengths, oldest waiting ages, invocations and durations for Prometheus."""
    client = _redis(Settings.from_env())
    if once:
        try:
            click.echo(render(client), nl=False)
        except redis.RedisError as exc:
            raise CliFailure(f"cannot read metrics from Redis: {exc}") from None
        return

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            try:
                body = render(client).encode()
            except redis.RedisError as exc:
                self.send_error(503, f"Redis: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # scrapes every few seconds are not worth a log line

    server = ThreadingHTTPServer((host, port), Handler)
    click.echo(f"serving metrics on http://{host}:{port}/metrics", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
