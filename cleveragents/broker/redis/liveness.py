"""Who holds which message, and whether they are still alive: recovery bounded by liveness.

kombu's Redis transport keeps every message a worker has taken, and not yet
acknowledged, in its ``unacked`` hash, and hands it out again only once the
visibility timeout has passed, which must outlast the longest tool run: a worker
killed whole stalls its invocations for that long. Here (as in Dramatiq's Redis
broker and Sidekiq Pro's super_fetch) recovery is bounded by liveness instead:

* **Holders.** Every consuming channel of a worker is a holder with an id of its
  own (``host:pid:random``). Each delivery records its holder beside kombu's
  record (``HELD_KEY``: delivery tag -> holder), in the same ``MULTI``.
* **Heartbeats.** A thread of the worker's process (its main process, the one
  that consumes; not blocked by tools) sets ``ALIVE_KEY_PREFIX + holder`` for each
  of its holders every ``beat_s``, expiring after ``ttl_s``: several missed beats.
* **The reaper.** Every ``reap_s`` one worker (a lock) gives back each message
  whose holder's key has expired, as kombu restores one (marked redelivered, so
  that the guard counts the delivery). A message whose holder is alive is never
  handed out again, however long its tool runs: kombu's visibility-timeout sweep
  passes it by (``cleveragents.broker.redis.transport``).

A worker's reaper acts only once its own beats have succeeded for a whole
``ttl_s``: after a Redis outage, or a restart from its append-only file with
every heartbeat expired, live holders beat again before anyone judges them.

This module is the liveness part (timing, holder ids, the heartbeat); the kombu
side is ``cleveragents.broker.redis.transport``. Nothing happens at import: a process
starts beating when it first consumes with acknowledgements.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from cleveragents.constants import (
    ALIVE_KEY_PREFIX,
    HELD_KEY,
    READ_ONLY_RECOVERY_PREFIX,
    REAPER_KEY,
)

__all__ = [
    "Heartbeat",
    "RecoveryKeys",
    "RecoveryTiming",
    "alive_key",
    "forget_holders",
    "holders_alive",
    "holds_messages",
    "new_holder_id",
    "process_heartbeat",
]

log = logging.getLogger("cleveragents.recovery")


@dataclass(frozen=True)
class RecoveryTiming:
    """The heartbeat's and the reaper's periods for a recovery time R.

    A holder is seen dead ``ttl_s`` (R/2, five beats) after its last beat, and a
    reaper looks every ``reap_s`` (R/10; the lock may make the next one wait as
    long): what it held is given back within about 0.7 R of its death. That
    leaves 0.3 R for a new worker to start, when no other is left: it must beat for
    ``ttl_s`` itself before it judges anyone.
    """

    recovery_s: float
    ttl_s: float
    beat_s: float
    reap_s: float

    @classmethod
    def of(cls, recovery_s: float) -> RecoveryTiming:
        """The timing for a recovery time of ``recovery_s`` seconds."""
        return cls(recovery_s, recovery_s / 2, recovery_s / 10, recovery_s / 10)

    @property
    def ttl_ms(self) -> int:
        """``ttl_s`` in whole milliseconds (Redis ``PX``)."""
        return max(1, round(self.ttl_s * 1000))


@dataclass(frozen=True)
class RecoveryKeys:
    """The keys of one role's recovery: what its workers hold, and who beats for it.

    Write-capable workers keep kombu's own names (``unacked``, ``unacked_index``,
    ``unacked_mutex``) and ``HELD_KEY``, ``REAPER_KEY``; read-only workers keep theirs
    under ``READ_ONLY_RECOVERY_PREFIX``, and their holder ids start with ``ro/`` (no
    host name has a ``/``), so that the read-only worker's Redis user is given only
    its own (docs/deployment.md, "Redis users per role"): it can neither read a write
    in flight, remove one, nor keep a dead write worker's holder alive. Each role's
    reaper gives back what its own dead holders held.
    """

    unacked: str = "unacked"
    unacked_index: str = "unacked_index"
    unacked_mutex: str = "unacked_mutex"
    held: str = HELD_KEY
    reaper: str = REAPER_KEY
    holder_prefix: str = ""

    @classmethod
    def of(cls, read_only: bool) -> RecoveryKeys:
        """The keys of read-only workers, or of write-capable ones."""
        if not read_only:
            return cls()
        prefix = READ_ONLY_RECOVERY_PREFIX
        return cls(
            unacked=f"{prefix}unacked",
            unacked_index=f"{prefix}unacked_index",
            unacked_mutex=f"{prefix}unacked_mutex",
            held=f"{prefix}held",
            reaper=f"{prefix}reaper",
            holder_prefix="ro/",
        )

    def kombu_options(self) -> dict[str, str]:
        """kombu's transport options naming its unacked hash, index and mutex."""
        return {
            "unacked_key": self.unacked,
            "unacked_index_key": self.unacked_index,
            "unacked_mutex_key": self.unacked_mutex,
        }


def alive_key(holder: str) -> str:
    """The heartbeat key of ``holder``."""
    return f"{ALIVE_KEY_PREFIX}{holder}"


def holders_alive(client: redis.Redis) -> bool:
    """True while some worker consumes from this Redis (a holder beats)."""
    cursor, keys = client.scan(0, match=f"{ALIVE_KEY_PREFIX}*", count=1000)
    while not keys and cursor:
        cursor, keys = client.scan(cursor, match=f"{ALIVE_KEY_PREFIX}*", count=1000)
    return bool(keys)


def holds_messages(client: redis.Redis, pid: int) -> bool:
    """True while a consumer of process ``pid`` on this host holds unacknowledged messages."""
    mark = f"{socket.gethostname()}:{pid}:"
    for keys in (RecoveryKeys.of(False), RecoveryKeys.of(True)):
        for holder in client.hvals(keys.held):
            text = holder.decode() if isinstance(holder, bytes) else str(holder)
            if text.removeprefix(keys.holder_prefix).startswith(mark):
                return True
    return False


def forget_holders(client: redis.Redis, pid: int) -> int:
    """Delete the heartbeat keys of process ``pid`` on this host, once it is gone: what it
    held is given back at the next reap, not once its keys expire, and a wait for a worker
    no longer takes it for one. Returns how many were deleted."""
    host = socket.gethostname()
    keys = [
        key
        for prefix in ("", RecoveryKeys.of(True).holder_prefix)
        for key in client.scan_iter(match=f"{ALIVE_KEY_PREFIX}{prefix}{host}:{pid}:*", count=1000)
    ]
    return int(client.delete(*keys)) if keys else 0


def new_holder_id(prefix: str = "") -> str:
    """A new holder id: this host and process, and a random part (pids are reused)."""
    return f"{prefix}{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Heartbeat:
    """One process's heartbeat: a thread that keeps its holders' keys alive.

    ``steady()`` says whether its beats have succeeded for the last ``ttl_s``;
    only then may this process judge other holders dead.
    """

    def __init__(self, client: redis.Redis, timing: RecoveryTiming) -> None:
        self.client = client
        self.timing = timing
        self._lock = threading.Lock()
        self._holders: set[str] = set()
        self._retired: set[str] = set()
        self._pid = os.getpid()
        self._ok_since: float | None = None
        self._last_ok = float("-inf")
        self._failing = False
        self._said_level = logging.WARNING  # the level its failure was said at
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, holder: str) -> None:
        """Beat for ``holder`` from now on (and start beating, the first time)."""
        with self._lock:
            self._holders.add(holder)
            self._retired.discard(holder)
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="cleveragents-heartbeat", daemon=True
                )
                self._thread.start()

    def release(self, holder: str) -> None:
        """Stop beating for ``holder``; its key is deleted at the next beat."""
        with self._lock:
            if holder in self._holders:
                self._holders.discard(holder)
                self._retired.add(holder)

    def holds(self, holder: str) -> bool:
        """True while this process beats for ``holder``."""
        with self._lock:
            return holder in self._holders

    def steady(self) -> bool:
        """True when every beat of the last ``ttl_s`` succeeded, the latest one lately."""
        now = time.monotonic()
        since = self._ok_since
        return (
            since is not None
            and now - since >= self.timing.ttl_s
            and now - self._last_ok <= self.timing.ttl_s / 2
        )

    def beat(self) -> bool:
        """Set every holder's key, delete released ones' keys; True when Redis took it."""
        with self._lock:
            holders, retired = sorted(self._holders), sorted(self._retired)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for holder in holders:
                    pipe.set(alive_key(holder), "1", px=self.timing.ttl_ms)
                for holder in retired:
                    pipe.delete(alive_key(holder))
                if not holders and not retired:
                    pipe.ping()  # a beat is also this process's own check of Redis
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            self._ok_since = None
            if not self._failing:
                self._failing = True
                # Redis away: the consumer says so, once (worker/reconnect_log.py); any
                # other refusal (an ACL without a command) is the heartbeat's own to say.
                away = isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError))
                self._said_level = logging.DEBUG if away else logging.WARNING
                log.log(
                    self._said_level,
                    "heartbeat failed, retrying every %.1fs: %s",
                    self.timing.beat_s,
                    exc,
                )
            return False
        now = time.monotonic()
        if self._ok_since is None:
            self._ok_since = now
        self._last_ok = now
        if self._failing:
            self._failing = False
            log.log(min(self._said_level, logging.INFO), "heartbeat back")
        with self._lock:
            self._retired.difference_update(retired)
        return True

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.beat()
            except Exception:  # the heartbeat never dies of a bug: it logs and beats on
                log.exception("heartbeat")
            self._stopped.wait(self.timing.beat_s)

    def stop(self) -> None:
        """Stop beating, and delete every key of this process's holders (a clean exit).

        What the holders still hold is then given back by the next reaper, at once.
        """
        if os.getpid() != self._pid:  # a forked child inherited this object: not its own
            return
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(self.timing.beat_s + 1)
        with self._lock:
            self._retired.update(self._holders)
            self._holders.clear()
        self.beat()


_process_lock = threading.Lock()
_process: Heartbeat | None = None


def process_heartbeat(make_client: Callable[[], redis.Redis], timing: RecoveryTiming) -> Heartbeat:
    """This process's heartbeat, made (with ``make_client()``) on the first call in it.

    One per process: holders of every channel share it, and a channel that is
    replaced (a reconnection) does not restart it. It stops, deleting its keys,
    when the process exits normally.
    """
    global _process
    with _process_lock:
        current = _process
        if current is None or current._pid != os.getpid():
            current = _process = Heartbeat(make_client(), timing)
            atexit.register(current.stop)
        return current
