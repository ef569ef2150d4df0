"""The CLI's first contact with its broker: a wrong URL is one line within seconds, not a wait.

The stores ride out a Redis restart for two minutes (``cleveragents.stores.redis_retry``), which
is right for a worker or a long batch run, and wrong for a command that has not
reached Redis once: a mistyped URL or a Redis that is not running looked like a
hang. So each CLI command that uses a broker pings the Redis servers it names
first, for a few seconds (a RabbitMQ broker too), and says which setting to fix.
The library keeps riding out restarts (it logs that it does: ``cleveragents.stores.redis_retry``).

A Redis named by both settings is pinged once, and a command's own client is pinged
through: the connection the check opens is the result backend's, which the command
then uses (one ``submit --wait`` on one Redis holds three connections: the backend's,
its result subscription's and the broker channel's).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import click
import kombu
import redis
from amqp.exceptions import AccessRefused, AMQPError, NotAllowed
from kombu.exceptions import KombuError
from kombu.utils.url import maybe_sanitize_url

from cleveragents.broker.url_tls import amqps_tls
from cleveragents.cli.render import CliFailure
from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from cleveragents.stores.redis_capacity import redis_py_url
from cleveragents.traces.carriers import carrier_of

__all__ = ["FIRST_CONTACT_S", "cli_client", "require_reachable"]

#: How long a command tries to reach Redis before it says it cannot (a Redis that is
#: starting, as in ``docker compose up``, answers within this).
FIRST_CONTACT_S = 3.0


#: The connect time-out of a connection the check opens.
CONNECT_S = 1.0


def _redis_pool(client: SkillClient | None, url: str) -> Any:
    """The connection pool of ``client``'s result backend when it is the Redis at ``url``."""
    backend = client.app.backend if client is not None else None
    redis_client = getattr(backend, "client", None)
    if not isinstance(redis_client, redis.Redis) or getattr(backend, "url", None) != url:
        return None
    return redis_client.connection_pool


@contextlib.contextmanager
def _first_contact(pool: Any) -> Iterator[None]:
    """The check's connect time-out on what ``pool`` connects meanwhile (then its own)."""
    if pool is None:
        yield
        return
    kwargs = pool.connection_kwargs
    before = kwargs.get("socket_connect_timeout")
    kwargs["socket_connect_timeout"] = CONNECT_S
    try:
        yield
    finally:
        kwargs["socket_connect_timeout"] = before


def _ping(url: str, setting: str, pool: Any = None) -> None:
    """Ping the Redis at ``url`` (through ``pool``, a client's, if given) for a few seconds."""
    with _first_contact(pool):
        _ping_until(url, setting, pool)


def _ping_until(url: str, setting: str, pool: Any) -> None:
    shown = maybe_sanitize_url(url)
    deadline = time.monotonic() + FIRST_CONTACT_S
    while True:
        try:
            client = (
                redis.Redis(connection_pool=pool)
                if pool is not None
                else redis.Redis.from_url(
                    redis_py_url(url), socket_connect_timeout=CONNECT_S, socket_timeout=2.0
                )
            )
        except Exception:  # a URL only Celery reads as it is: the command's own path says why
            return
        try:
            client.ping()
            return
        except redis.ResponseError as exc:
            if "db index" in str(exc).lower():  # SELECT of a database this Redis lacks
                raise CliFailure(_no_such_database(url, setting, exc)) from None
            raise CliFailure(
                f"Redis at {shown} refused this client ({exc}): check the user and password "
                f"in {setting}"
            ) from None
        except redis.AuthenticationError as exc:
            raise CliFailure(
                f"Redis at {shown} refused this client ({exc}): check the user and password "
                f"in {setting}"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise CliFailure(
                    f"cannot reach Redis at {shown} ({exc}): start it, or point {setting} at yours"
                ) from None
        except Exception:  # not a reachability question (TLS options, say): left to the command
            return
        finally:
            if pool is None:  # a client's pool stays open for the client
                client.close()
        time.sleep(0.25)


def _no_such_database(url: str, setting: str, exc: Exception) -> str:
    """The line for a URL whose database number this Redis does not have (``/99``)."""
    number = urlsplit(url).path.strip("/") or "0"
    return (
        f"Redis at {maybe_sanitize_url(url)} has no database {number} ({exc}): the number at "
        f"the end of {setting} is the database; a Redis has 16 (0 to 15) unless its "
        "`databases` setting says otherwise"
    )


def _tls_refused(exc: BaseException | None) -> bool:
    """True when ``exc``, or what it wraps (kombu's ``OperationalError``), is a TLS failure."""
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _connect(url: str, setting: str) -> None:
    shown = maybe_sanitize_url(url)
    plain, tls = amqps_tls(url, setting)
    with kombu.Connection(plain, ssl=tls or False, connect_timeout=FIRST_CONTACT_S) as connection:
        try:
            connection.ensure_connection(max_retries=1, timeout=int(FIRST_CONTACT_S))
        except (KombuError, AMQPError, OSError) as exc:
            text = str(exc)
            if _tls_refused(exc):
                raise CliFailure(
                    f"RabbitMQ at {shown} was not trusted over TLS ({text}): the CA of "
                    f"ssl_ca_certs in {setting} must have signed the node's certificate, "
                    "and the certificate must name the host the URL gives"
                ) from None
            if isinstance(exc, AccessRefused | NotAllowed):
                raise CliFailure(
                    f"RabbitMQ at {shown} refused this client ({text}): check the user, "
                    f"password and vhost in {setting}"
                ) from None
            raise CliFailure(
                f"cannot reach RabbitMQ at {shown} ({text}): start it, or point {setting} at yours"
            ) from None


def require_reachable(settings: Settings, client: SkillClient | None = None) -> None:
    """Reach each server the settings name (none on the embedded default), or fail in one line.

    A Redis is pinged once whichever settings name it, through ``client``'s result
    backend where that is the one.
    """
    named = [("CLEVERAGENTS_BROKER_URL", settings.broker_url)]
    named.append(("CLEVERAGENTS_RESULT_BACKEND", settings.result_backend))
    pinged: set[str] = set()
    for setting, url in named:
        scheme = (url or "").partition("://")[0].lower()
        if url and scheme in ("redis", "rediss") and url not in pinged:
            pinged.add(url)
            _ping(url, setting, _redis_pool(client, url))
        elif url and scheme in ("amqp", "amqps", "pyamqp"):
            _connect(url, setting)


def cli_client(settings: Settings | None = None) -> SkillClient:
    """A ``SkillClient`` for a CLI command, once the Redis it uses answers."""
    settings = settings or Settings.from_env()
    client = SkillClient(settings=settings)
    try:
        require_reachable(settings, client)
    except BaseException:
        client.close()
        raise
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
