"""The TCP settings of every connection to Redis: a half-open one is dropped within seconds.

A Redis host that vanishes (power, a kernel panic, a partition) sends no FIN and no RST:
its peers' connections stay open, and a command on one waits for the socket time-out, and
an idle pooled one is found dead only when next used. Linux's defaults keep such a
connection for hours (keepalive after 2 h idle; retransmissions for about 15 minutes).
Every connection the broker transport, the result backend and the stores open to Redis
sets, as dramatiq and Sidekiq advise for cloud networks:

* ``TCP_USER_TIMEOUT``: data unacknowledged for ``HALF_OPEN_S`` seconds ends the
  connection (a command to a lost host fails after that, not after ``socket_timeout``);
* keepalive after ``KEEPALIVE_IDLE_S`` idle, then every ``KEEPALIVE_INTERVAL_S`` (an idle
  pooled connection to a lost host is found dead within about ``HALF_OPEN_S`` too).

Measured in the multi-host rig (``benchmarks/soak_hosts.py``, docs/operations.md).
"""

from __future__ import annotations

import socket

import redis

__all__ = [
    "HALF_OPEN_S",
    "KEEPALIVE_IDLE_S",
    "KEEPALIVE_INTERVAL_S",
    "harden",
    "keepalive_options",
]

#: Seconds of unacknowledged data (or of unanswered keepalive probes) that end a connection.
HALF_OPEN_S = 10
#: Seconds a connection may be idle before the first keepalive probe.
KEEPALIVE_IDLE_S = 5
#: Seconds between keepalive probes.
KEEPALIVE_INTERVAL_S = 2


def keepalive_options() -> dict[int, int]:
    """redis-py's ``socket_keepalive_options`` (``IPPROTO_TCP`` options), those this
    platform has."""
    wanted = {
        "TCP_KEEPIDLE": KEEPALIVE_IDLE_S,
        "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S,
        "TCP_KEEPCNT": max(1, (HALF_OPEN_S - KEEPALIVE_IDLE_S) // KEEPALIVE_INTERVAL_S),
        "TCP_USER_TIMEOUT": HALF_OPEN_S * 1000,  # milliseconds
    }
    return {getattr(socket, name): value for name, value in wanted.items()
            if hasattr(socket, name)}


def harden(client: redis.Redis) -> redis.Redis:
    """``client``'s pool opens its next connections with ``keepalive_options`` (a producer's
    result backend is Celery's own, which passes none); returns ``client``. A Unix socket's
    (the embedded default's server) is left as it is: no TCP there."""
    pool = client.connection_pool
    if issubclass(pool.connection_class, redis.UnixDomainSocketConnection):
        return client
    pool.connection_kwargs.update(socket_keepalive=True,
                                  socket_keepalive_options=keepalive_options())
    return client
