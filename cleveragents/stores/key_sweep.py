"""Keys a producer makes once get a time to live from a worker: a slow sweep of Redis.

A producer's Redis user makes request-id bindings and batch seals with ``SETNX``,
which can never replace another's key but sets no time to live; and it may not
``EXPIRE`` either, which would let it shorten or end another's. A worker gives a
binding its time to live when it runs the request (``stores/redis.py``), but a
binding no message ever follows (an id squatted by a hostile producer, a producer
that died between binding and sending) and a seal would stay for ever. So one
worker at a time (a lock) walks the keyspace with ``SCAN``, a few thousand keys a
round, and gives every binding, seal and cancel mark without a time to live the
results' (``EXPIRE ... NX``: a key that has one keeps it, never shortened). A key is
swept within one pass of the keyspace after it is made: at 10,000 keys a round
every ``SWEEP_EVERY_S``, a Redis of ten million keys takes under three hours.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from cleveragents.constants import BIND_KEY_PREFIX, CANCEL_KEY_PREFIX, SEAL_KEY_PREFIX

__all__ = ["SWEEP_EVERY_S", "KeySweep"]

log = logging.getLogger("cleveragents.worker")

#: Seconds between two rounds of the fleet's sweep (one worker at a time).
SWEEP_EVERY_S = 10.0
#: ``SCAN`` calls per round, and keys each looks at.
SCANS_PER_ROUND = 10
SCAN_COUNT = 1_000
#: The families a producer makes with no time to live.
SWEPT_PREFIXES = (BIND_KEY_PREFIX, SEAL_KEY_PREFIX, CANCEL_KEY_PREFIX)
#: The lock of a round, and where the pass has got to (kept a day; lost, a pass restarts).
LOCK_KEY = "cleveragents:sweep:lock"
CURSOR_KEY = "cleveragents:sweep:cursor"
_CURSOR_KEPT_S = 86_400


class KeySweep:
    """Gives producers' keys without a time to live ``ttl_s``, a round at a time."""

    def __init__(self, client: redis.Redis, ttl_s: int, every_s: float = SWEEP_EVERY_S) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.every_s = every_s
        self._stopped = threading.Event()
        self._failing = False

    def round(self) -> int:
        """One round, if this process takes the lock: how many keys got a time to live."""
        lock_ms = max(1, round(self.every_s * 1000))
        if not self.client.set(LOCK_KEY, "1", nx=True, px=lock_ms):
            return 0
        raw: Any = self.client.get(CURSOR_KEY)
        cursor = int(raw or 0)
        given = 0
        for _ in range(SCANS_PER_ROUND):
            cursor, keys = self.client.scan(cursor, match="cleveragents:*", count=SCAN_COUNT)
            given += self._expire([k for k in keys if _swept(k)])
            if cursor == 0:
                break
        self.client.set(CURSOR_KEY, cursor, ex=_CURSOR_KEPT_S)
        return given

    def _expire(self, keys: list[Any]) -> int:
        if not keys:
            return 0
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.expire(key, self.ttl_s, nx=True)
            return sum(1 for given in pipe.execute() if given)

    def start(self) -> None:
        """Sweep in a daemon thread of this process from now on: a round now, then
        every ``every_s``."""
        threading.Thread(target=self._run, name="cleveragents-key-sweep", daemon=True).start()

    def stop(self) -> None:
        """End the thread after its current round."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                given = self.round()
            except redis.RedisError as exc:  # Redis away, or a user without the rights
                if not self._failing:
                    # Redis away is said by the consumer, once (worker/reconnect_log.py)
                    away = isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
                    log.log(
                        logging.DEBUG if away else logging.WARNING,
                        "could not give producers' keys a time to live: %s",
                        exc,
                    )
                self._failing = True
            else:
                if given:
                    log.info("gave %d request-id binding(s) or seal(s) a time to live", given)
                self._failing = False
            self._stopped.wait(self.every_s)


def _swept(key: Any) -> bool:
    text = key.decode() if isinstance(key, bytes) else str(key)
    return text.startswith(SWEPT_PREFIXES)
