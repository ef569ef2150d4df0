"""``cleveragents metrics``: a Prometheus exporter for queues and invocations."""

from __future__ import annotations

from typing import Any

import click
import redis

from cleveragents.broker.celery_settings import needs_server
from cleveragents.broker.rabbitmq import RabbitQueues, uses_amqp
from cleveragents.broker.redis.sentinel import sentinel_client
from cleveragents.cli.render import CliFailure
from cleveragents.constants import QUEUE_DEAD
from cleveragents.embedded.server import join_server
from cleveragents.embedded.urls import HomeUrls
from cleveragents.metrics.exporter import QUEUES, QueueGauges, metrics_app, render, serve
from cleveragents.settings import Settings

__all__ = ["metrics"]


def _redis(settings: Settings) -> Any:
    url = settings.result_backend or settings.broker_url
    if needs_server(settings):  # the embedded default's server, for as long as this runs
        join_server(settings.home)
        url = HomeUrls.of(settings.home).client
    if url and url.startswith("sentinel://"):  # the primary the Sentinels name, each time
        return sentinel_client(url, settings.sentinel_master, socket_timeout=10)
    if not url or not url.startswith(("redis://", "rediss://", "unix://")):
        raise CliFailure(
            "metrics need Redis: set CLEVERAGENTS_BROKER_URL to a redis:// or sentinel:// URL "
            "(or, with RabbitMQ as the broker, CLEVERAGENTS_RESULT_BACKEND)"
        )
    return redis.Redis.from_url(url, socket_timeout=10)


def _queues(settings: Settings) -> QueueGauges | None:
    # RabbitMQ's queues are read from RabbitMQ, skills.dead included; None: the Redis lists.
    if uses_amqp(settings):
        return RabbitQueues(settings.broker_url or "", (*QUEUES, QUEUE_DEAD))
    return None


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
    settings = Settings.from_env()
    client = _redis(settings)
    queues = _queues(settings)
    if once:
        try:
            click.echo(render(client, queues), nl=False)
        except redis.RedisError as exc:
            raise CliFailure(f"cannot read metrics from Redis: {exc}") from None
        except ConnectionError as exc:
            raise CliFailure(str(exc)) from None
        return

    server = serve(metrics_app(client, queues), host, port)
    click.echo(f"serving metrics on http://{host}:{port}/metrics", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
