"""Every process on Redis Sentinel follows a failover within a second of the Sentinels.

redis-py's Sentinel pools ask the Sentinels where the primary is only when a connection
connects. After the primary's host is lost, a connection already open to it (a worker's
``BRPOP``, a producer's result subscription, a pooled store connection) waits until it is
found half-open (``stores/redis_sockets.py``: ``HALF_OPEN_S``), and each pool of a process
meets its own: the rig measured 14 to 60 s before a process served again, against a
failover of about 5 s. Java's Jedis and Node's ioredis watch the Sentinels instead; so
does this module:

* every connection of the fleet's Sentinel pools (``follow``: kombu's channels, the
  heartbeat's client, the result backend and the stores on it) is ``Following``,
  registered as it connects;
* one thread per process and Sentinel service asks a Sentinel where the primary is every
  ``WATCH_S`` (``SENTINEL GET-MASTER-ADDR-BY-NAME``, with ``SENTINEL_TIMEOUT_S``; a
  Sentinel that does not answer is passed over for the next);
* when the answer changes, every registered connection to another address is shut down
  (``shutdown(2)``: a thread waiting on it wakes with the connection closed), so each
  user reconnects at once through its own pool, the way it does after any dropped
  connection, and finds the new primary. A reconnection asks the Sentinel that answered
  last first (``SENTINEL_TIMEOUT_S`` spent on a lost one at most once per pool).

A cut the Sentinels did not mean (a stale answer) costs a reconnection to the same
primary, nothing more: where a connection goes is still redis-py's ``discover_master``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import redis
from redis.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
)

__all__ = [
    "SENTINEL_TIMEOUT_S",
    "WATCH_S",
    "Following",
    "follow",
    "sentinel_kwargs",
]

#: Seconds a Sentinel may take to connect or to answer before the next one is asked.
SENTINEL_TIMEOUT_S = 2.0
#: Seconds between two questions of a process's watcher to the Sentinels.
WATCH_S = 1.0
#: Seconds a connection asks the Sentinels again while none names a healthy primary
#: (right after a failover one may still flag the new primary down for a second), and
#: between two questions then.
SETTLE_S = 3.0
SETTLE_STEP_S = 0.2

Address = tuple[str, int]

log = logging.getLogger(__name__)


def sentinel_kwargs(tls: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """redis-py's ``sentinel_kwargs`` for the fleet's pools: short time-outs (Celery's
    result backend passed none, so a lost Sentinel's host held a reconnection for the
    kernel's two minutes of SYN retries), and ``tls``, a ``sentinel://`` URL's TLS
    options (``broker/url_tls.py``), for the Sentinels too."""
    given = {"socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S}
    return {**given, "ssl": True, **tls} if tls else given


def follow(pool: Any) -> Any:
    """``pool``'s connections follow a failover at once; returns ``pool`` (made by
    ``Sentinel.master_for``, before it opened any connection). Its connection class is
    kept under ``Following`` (kombu's asynchronous one unregisters from its poller)."""
    base = pool.connection_class
    if issubclass(base, SentinelManagedConnection) and not issubclass(base, Following):
        pool.connection_class = type(f"Following{base.__name__}", (Following, base), {})
    return pool


class Following(SentinelManagedConnection):
    """A Sentinel-managed connection its process's watcher cuts after a failover."""

    def connect_to(self, address: Any) -> None:
        """Connect to ``address``, watched from before its handshake: a handshake with a
        primary that has stopped answering is cut as a command on it is."""
        _watcher(self.connection_pool).watch(self)
        self.host, self.port = address
        super().connect_check_health(check_health=self.connection_pool.check_connection,
                                     retry_socket_connect=False)

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        """Connect where the Sentinels say the primary is now. redis-py's retry of a
        command reconnects its connection here, to the address it had: after a failover,
        the lost primary's (a connect time-out, twice, before the command failed)."""
        if not self._sock:
            self._connect_retry()

    def _connect_retry(self) -> None:
        _watcher(self.connection_pool).prefer_answering(self.connection_pool.sentinel_manager)
        deadline = time.monotonic() + SETTLE_S
        while True:
            try:
                return super()._connect_retry()  # type: ignore[no-untyped-call,no-any-return]
            except MasterNotFoundError:
                if time.monotonic() >= deadline:
                    raise
                # Mid-failover, for a moment no Sentinel names a healthy primary (one
                # still flags the new one down): ask again shortly.
                time.sleep(SETTLE_STEP_S)


class _Watcher:
    """One process's watch on one Sentinel service: asks, and cuts on a change."""

    def __init__(self, pool: SentinelConnectionPool) -> None:
        self.service: str = pool.service_name
        self.sentinels = [_short(node) for node in pool.sentinel_manager.sentinels]
        self.answering: Address | None = None  # the Sentinel that answered last
        self.primary: Address | None = None
        self.answers = 0  # how many questions a Sentinel answered
        self.connections: weakref.WeakSet[Following] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"sentinel-follow-{self.service}",
                                       daemon=True)
        self.thread.start()

    def watch(self, connection: Following) -> None:
        """Cut ``connection`` at the next question that names another primary."""
        with self.lock:
            self.connections.add(connection)

    def prefer_answering(self, manager: Any) -> None:
        """Put the Sentinel that answered last first in ``manager``'s list."""
        if self.answering is not None:  # a new list: another thread may be reading the old
            manager.sentinels = sorted(manager.sentinels,
                                       key=lambda node: _address(node) != self.answering)

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_S)  # the watch's pace: a question a second per process
            primary = self._ask()
            if primary is None:
                continue
            with self.lock:
                self.answers += 1
                before, self.primary = self.primary, primary
                stale = [c for c in self.connections if (str(c.host), int(c.port)) != primary]
            if before not in (None, primary):
                log.warning("the Sentinels name %s:%d the primary of %r", *primary, self.service)
            # Each question, not only on a change: a connection may have gone to the old
            # primary after the change, named by a Sentinel that had not heard of it yet.
            for connection in stale:
                _cut(connection)

    def _ask(self) -> Address | None:
        for node in sorted(self.sentinels, key=lambda n: _address(n) != self.answering):
            try:
                reply = node.execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service
                )
            except (redis.RedisError, OSError):
                continue
            if reply:
                self.answering = _address(node)
                host, port = reply
                return (host.decode() if isinstance(host, bytes) else str(host), int(port))
        return None


_watchers: dict[tuple[str, tuple[Address, ...]], _Watcher] = {}
_watchers_lock = threading.Lock()


def _watcher(pool: Any) -> _Watcher:
    key = (pool.service_name, tuple(sorted(_address(n) for n in pool.sentinel_manager.sentinels)))
    with _watchers_lock:
        found = _watchers.get(key)
        if found is None:
            found = _watchers[key] = _Watcher(pool)
        return found


def _address(node: redis.Redis) -> Address:
    kwargs = node.connection_pool.connection_kwargs
    return (str(kwargs.get("host")), int(kwargs.get("port") or 0))


def _short(node: redis.Redis) -> redis.Redis:
    """A client of the Sentinel ``node`` with the watch's own short time-outs."""
    pool = node.connection_pool
    kwargs = {**pool.connection_kwargs, **sentinel_kwargs()}
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **kwargs))


def _cut(connection: Following) -> None:
    sock = getattr(connection, "_sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed meanwhile by its own thread
        pass


def _forget_in_child() -> None:
    # A forked child (a pool process) has none of its parent's threads: its own watchers
    # start with its first connection.
    global _watchers_lock
    _watchers.clear()
    _watchers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
