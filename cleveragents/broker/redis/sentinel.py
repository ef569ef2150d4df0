"""The liveness transport on Redis Sentinel: ``sentinel://`` brokers keep bounded recovery.

kombu's ``SentinelChannel`` only changes where a channel's connections go: every
pool it makes (its ``_get_pool``, through ``_sentinel_managed_pool``) is a
``SentinelConnectionPool``, whose connections ask the Sentinels for the current
primary each time they connect. This transport puts that channel
under the liveness channel of ``cleveragents.broker.redis.transport`` (holders,
heartbeats, the fetch script, the doorbells), so a ``sentinel://`` broker hands a
dead worker's messages out again within ``CLEVERAGENTS_RECOVERY_S``, as a
``redis://`` one does, instead of after kombu's visibility timeout.

After a failover every connection to the old primary fails (refused, reset, or
``READONLY`` once it is a replica: redis-py turns that into a connection error); kombu
reconnects the channel, and the new connections find the new primary through the
Sentinels. The heartbeat has a client of its own (``heartbeat_client``), on the same
Sentinels, with short time-outs. Every pool here follows a failover as soon as the
Sentinels name a new primary (``sentinel_follow.follow``), not when its connections to the
lost one are found half-open.

Written for kombu 5.7's ``SentinelChannel`` (``broker/internals.py``, ``redis-transport``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from kombu.transport import redis as kombu_redis
from redis.connection import SSLConnection
from redis.sentinel import Sentinel

from cleveragents.broker.redis.sentinel_follow import follow, sentinel_kwargs
from cleveragents.broker.redis.transport import Channel, Transport
from cleveragents.broker.url_tls import sentinel_tls

__all__ = ["SentinelChannel", "SentinelTransport", "sentinel_addresses", "sentinel_client"]

#: The Sentinel's port when a ``sentinel://`` URL names none.
SENTINEL_PORT = 26379


def sentinel_addresses(urls: list[str], default_port: int = SENTINEL_PORT) -> list[tuple[str, int]]:
    """The (host, port) of each Sentinel a ``sentinel://a:1;sentinel://b:2`` URL names."""
    found = []
    for url in urls:
        for part in url.split(";"):
            scheme, _, rest = part.strip().partition("://")
            if scheme.lower() != "sentinel" or not rest:
                continue
            netloc = re.split("[/?]", rest, maxsplit=1)[0].rsplit("@", 1)[-1]
            host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
            found.append((host or "127.0.0.1", int(port) if port else default_port))
    return found


def sentinel_client(
    url: str, master: str, setting: str = "CLEVERAGENTS_RESULT_BACKEND", **options: Any
) -> redis.Redis:
    """A client of the primary that the Sentinels of ``url`` monitor as ``master``: each
    of its connections asks them where the primary is now. The password and database
    are the first URL's (Celery's and kombu's reading), TLS the URLs' (``url_tls.py``,
    errors naming ``setting``); ``options`` go to redis-py."""
    url, tls = sentinel_tls(url, setting)
    first = urlsplit(url.split(";", 1)[0].strip())
    path = first.path.strip("/")
    params: dict[str, Any] = {"db": int(path) if path.isdigit() else 0, **options}
    if first.password:
        params["password"] = unquote(first.password)
    if first.username:
        params["username"] = unquote(first.username)
    if tls:
        params.update(ssl=True, **tls)
    sentinels = Sentinel(sentinel_addresses([url]), sentinel_kwargs=sentinel_kwargs(tls))
    credentials = {k: params.pop(k) for k in ("username", "password") if k in params}
    client: redis.Redis = sentinels.master_for(master, redis.Redis, **credentials, **params)
    follow(client.connection_pool)
    return client


class SentinelChannel(kombu_redis.SentinelChannel, Channel):  # type: ignore[misc]
    """kombu's Sentinel channel under the liveness channel: holders, beats, the fetch."""

    from_transport_options = (
        *Channel.from_transport_options,
        "master_name",
        "min_other_sentinels",
        "sentinel_kwargs",
        "sentinel_fanout_compat",
    )
    master_name: str | None = None
    min_other_sentinels: int = 0
    sentinel_kwargs: dict[str, Any] | None = None

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        return follow(super()._sentinel_managed_pool(asynchronous))  # type: ignore[misc]

    def heartbeat_client(self) -> redis.Redis:
        """A client of its own for the heartbeat, on the primary the Sentinels name now."""
        params: dict[str, Any] = self._connparams()  # type: ignore[attr-defined]
        seconds = min(max(self.recovery_timing.beat_s, 1.0), 10.0)
        # TLS as the channel's (kombu puts broker_use_ssl's ssl_* into its parameters).
        params["ssl"] = issubclass(params.get("connection_class", object), SSLConnection)
        for name in ("host", "port", "connection_class", "max_connections"):
            params.pop(name, None)
        # A beat that hangs must fail before the next is due, and never retry in place.
        params.update(socket_timeout=seconds, socket_connect_timeout=seconds)
        params["retry_on_timeout"] = False
        conninfo: Any = self.connection.client
        addresses = sentinel_addresses(list(conninfo.alt or [])) or [
            (conninfo.hostname or "127.0.0.1", SENTINEL_PORT)
        ]
        sentinels = Sentinel(
            addresses,
            min_other_sentinels=self.min_other_sentinels,
            sentinel_kwargs=self.sentinel_kwargs or sentinel_kwargs(),  # the fleet sets them
            **params,
        )
        if not self.master_name:
            raise ValueError("'master_name' transport option must be specified.")
        credentials = {k: params[k] for k in ("username", "password") if params.get(k)}
        client: redis.Redis = sentinels.master_for(self.master_name, redis.Redis, **credentials)
        follow(client.connection_pool)
        return client


class SentinelTransport(Transport):
    """The liveness transport with its connections found through Redis Sentinel."""

    Channel = SentinelChannel
    default_port = SENTINEL_PORT
