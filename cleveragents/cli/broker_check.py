"""The CLI's first contact with its broker: a wrong URL is one line within seconds, not a wait.

The stores ride out a Redis restart for two minutes (``cleveragents.stores.redis_retry``), which
is right for a worker or a long batch run, and wrong for a command that has not
reached Redis once: a mistyped URL or a Redis that is not running looked like a
hang. So each CLI command that uses a broker pings the Redis servers it names
first, for a few seconds (a RabbitMQ broker too), and says which setting to fix.
The library keeps riding out restarts (it logs that it does: ``cleveragents.stores.redis_retry``).
"""

from __future__ import annotations

import os
import time

import click
import kombu
import redis
from amqp.exceptions import AccessRefused, AMQPError, NotAllowed
from kombu.exceptions import KombuError
from kombu.utils.url import maybe_sanitize_url

from cleveragents.cli.render import CliFailure
from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from cleveragents.stores.redis_capacity import redis_py_url
from cleveragents.traces.carriers import carrier_of

__all__ = ["FIRST_CONTACT_S", "cli_client", "require_reachable"]

#: How long a command tries to reach Redis before it says it cannot (a Redis that is
#: starting, as in ``docker compose up``, answers within this).
FIRST_CONTACT_S = 3.0


def _ping(url: str, setting: str) -> None:
    shown = maybe_sanitize_url(url)
    deadline = time.monotonic() + FIRST_CONTACT_S
    while True:
        try:
            client = redis.Redis.from_url(
                redis_py_url(url), socket_connect_timeout=1.0, socket_timeout=2.0
            )
        except Exception:  # a URL only Celery reads as it is: the command's own path says why
            return
        try:
            client.ping()
            return
        except (redis.AuthenticationError, redis.ResponseError) as exc:
            raise CliFailure(
                f"Redis at {shown} refused this client ({exc}): check the user and password "
                f"in {setting}"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise CliFailure(
                    f"cannot reach Redis at {shown} ({exc}): start it, or point {setting} "
                    "at yours"
                ) from None
        except Exception:  # not a reachability question (TLS options, say): left to the command
            return
        finally:
            client.close()
        time.sleep(0.25)


def _connect(url: str, setting: str) -> None:
    shown = maybe_sanitize_url(url)
    with kombu.Connection(url, connect_timeout=FIRST_CONTACT_S) as connection:
        try:
            connection.ensure_connection(max_retries=1, timeout=int(FIRST_CONTACT_S))
        except (KombuError, AMQPError, OSError) as exc:
            text = str(exc)
            if isinstance(exc, AccessRefused | NotAllowed):
                raise CliFailure(
                    f"RabbitMQ at {shown} refused this client ({text}): check the user, "
                    f"password and vhost in {setting}"
                ) from None
            raise CliFailure(
                f"cannot reach RabbitMQ at {shown} ({text}): start it, or point {setting} "
                "at yours"
            ) from None


def require_reachable(settings: Settings) -> None:
    """Reach each server the settings name (none on the embedded default), or fail in one line."""
    named = [("CLEVERAGENTS_BROKER_URL", settings.broker_url)]
    named.append(("CLEVERAGENTS_RESULT_BACKEND", settings.result_backend))
    for setting, url in named:
        scheme = (url or "").partition("://")[0].lower()
        if url and scheme in ("redis", "rediss"):
            _ping(url, setting)
        elif url and scheme in ("amqp", "amqps", "pyamqp"):
            _connect(url, setting)


def cli_client(settings: Settings | None = None) -> SkillClient:
    """A ``SkillClient`` for a CLI command, once the Redis it uses answers."""
    settings = settings or Settings.from_env()
    require_reachable(settings)
    client = SkillClient(settings=settings)
    # The trace a CI job or a wrapper names (TRACEPARENT, TRACESTATE): its invocations join it
    named = os.environ.get("TRACEPARENT")
    given = {"traceparent": named, "tracestate": os.environ.get("TRACESTATE")}
    client.trace_context = carrier_of(given)
    if named and not client.trace_context:
        click.echo(
            "warning: TRACEPARENT is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>):"
            " the invocations start traces of their own",
            err=True,
        )
    return client
