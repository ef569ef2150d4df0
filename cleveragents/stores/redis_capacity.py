"""Redis's memory: a worker refuses a Redis that evicts keys, and warns before one fills.

Every promise rests on keys staying until their time to live ends: a queued
message and its ``unacked`` record (an invocation not lost), a write claim (a write
run once), a stored result (answered by request id for ``CLEVERAGENTS_RESULT_EXPIRES_S``).
A Redis with an evicting ``maxmemory-policy`` drops such keys without a word when it
is full (``allkeys-*`` any key, ``volatile-*`` exactly those with a time to live). So
a worker reads ``INFO memory`` of each Redis it uses as it starts, and refuses one
that evicts unless ``CLEVERAGENTS_ALLOW_EVICTION`` accepts the risk. With
``noeviction`` a full Redis refuses writes instead, loudly, and nothing already
stored is lost.

While it runs, the worker's main process samples ``used_memory`` (``MemoryWatch``):
when the growth of the last ``WINDOW_S`` would reach ``maxmemory`` before a result
stored now expires, it warns, at most once per ``WARN_EVERY_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import redis
from kombu.utils.url import maybe_sanitize_url

__all__ = [
    "ALLOW_SETTING",
    "EVICTING_POLICIES",
    "EvictingRedis",
    "MemoryWatch",
    "RedisMemory",
    "check_eviction",
    "eviction_problem",
    "read_memory",
    "redis_py_url",
]

log = logging.getLogger("cleveragents.worker")

#: Every maxmemory-policy that drops keys when Redis is full (all but ``noeviction``).
EVICTING_POLICIES = frozenset(
    {
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
    }
)
ALLOW_SETTING = "CLEVERAGENTS_ALLOW_EVICTION"
#: How often the watch samples ``used_memory``, how much history it judges growth
#: on, and how often it may say the same thing again.
SAMPLE_EVERY_S = 60.0
WINDOW_S = 1800.0
MIN_WINDOW_S = 300.0
WARN_EVERY_S = 3600.0
#: Used memory past this share of ``maxmemory`` is said whatever the growth.
NEARLY_FULL = 0.9


@dataclass(frozen=True)
class RedisMemory:
    """What ``INFO memory`` says of a Redis: bytes used, its limit (0: none), its policy."""

    used_bytes: int
    max_bytes: int
    policy: str

    @property
    def evicts(self) -> bool:
        return self.policy in EVICTING_POLICIES


def redis_py_url(url: str) -> str:
    """``url`` as redis-py reads it: Celery's ``ssl_cert_reqs=CERT_REQUIRED`` spelling too."""
    for celery, redis_py in (("CERT_REQUIRED", "required"), ("CERT_OPTIONAL", "optional")):
        url = url.replace(f"ssl_cert_reqs={celery}", f"ssl_cert_reqs={redis_py}")
    return url.replace("ssl_cert_reqs=CERT_NONE", "ssl_cert_reqs=none")


def read_memory(client: Any) -> RedisMemory:
    """``INFO memory`` of ``client``'s Redis (raises redis-py's errors, NOPERM included)."""
    info = client.info("memory")
    return RedisMemory(
        int(info.get("used_memory", 0)),
        int(info.get("maxmemory", 0)),
        str(info.get("maxmemory_policy", "noeviction")),
    )


def eviction_problem(memory: RedisMemory, shown_url: str) -> str:
    """The one line a worker says of a Redis that evicts."""
    limit = f"maxmemory {_mb(memory.max_bytes)}" if memory.max_bytes else "no maxmemory yet"
    return (
        f"Redis at {shown_url} evicts keys when it is full (maxmemory-policy {memory.policy}, "
        f"{limit}): it would drop queued invocations, write claims and stored results without "
        "a word. fix: set maxmemory-policy noeviction (redis-cli CONFIG SET maxmemory-policy "
        f"noeviction, and in redis.conf), or set {ALLOW_SETTING}=1 to run on it anyway "
        '(docs/operations.md, "Sizing Redis")'
    )


def check_eviction(urls: list[str], *, allow: bool) -> list[tuple[int, str]]:
    """Read each Redis's policy; return what to log, as (level, line).

    Raises ``EvictingRedis`` for one that evicts, unless ``allow``. A Redis that cannot
    be read (not up yet, or its user may not run ``INFO``) is said and passed: the
    worker rides out a Redis that is not up, and the check is the operator's then.
    """
    notes: list[tuple[int, str]] = []
    for url in dict.fromkeys(urls):  # the broker and the results are often one Redis
        shown = maybe_sanitize_url(url)
        try:
            client = redis.Redis.from_url(
                redis_py_url(url), socket_connect_timeout=2.0, socket_timeout=5.0
            )
            try:
                memory = read_memory(client)
            finally:
                client.close()
        except redis.ResponseError as exc:  # NOPERM: a user without +info
            notes.append(
                (
                    logging.WARNING,
                    f"could not read Redis's maxmemory-policy at {shown} ({exc}): make sure it "
                    "is noeviction; the worker user of docs/deployment.md may run INFO",
                )
            )
            continue
        except (redis.ConnectionError, redis.TimeoutError, ValueError) as exc:
            notes.append(
                (
                    logging.WARNING,
                    f"could not read Redis's maxmemory-policy at {shown} ({exc}); not checked",
                )
            )
            continue
        if memory.evicts:
            line = eviction_problem(memory, shown)
            if not allow:
                raise EvictingRedis(line)
            notes.append((logging.WARNING, f"{ALLOW_SETTING} is set: running on it. {line}"))
    return notes


class EvictingRedis(Exception):
    """A Redis the worker would use evicts keys, and nothing accepted the risk."""


class MemoryWatch:
    """Samples a Redis's used memory; warns when its growth would fill ``maxmemory``
    before a result stored now expires (``expires_s``)."""

    def __init__(
        self,
        client: Any,
        shown_url: str,
        expires_s: float,
        *,
        every_s: float = SAMPLE_EVERY_S,
        window_s: float = WINDOW_S,
        min_window_s: float = MIN_WINDOW_S,
    ) -> None:
        self.client = client
        self.shown_url = shown_url
        self.expires_s = expires_s
        self.every_s = every_s
        self.window_s = window_s
        self.min_window_s = min_window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._said_at = float("-inf")
        self._stopped = threading.Event()

    def observe(self, memory: RedisMemory, now: float) -> str | None:
        """Take one sample; the warning it calls for, if any (at most one a WARN_EVERY_S)."""
        self._samples.append((now, memory.used_bytes))
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        line = self._judge(memory, now)
        if line is None or now - self._said_at < WARN_EVERY_S:
            return None
        self._said_at = now
        return line

    def _judge(self, memory: RedisMemory, now: float) -> str | None:
        if memory.max_bytes <= 0:
            return None
        where = (
            f"Redis at {self.shown_url} uses {_mb(memory.used_bytes)} of its maxmemory "
            f"{_mb(memory.max_bytes)}"
        )
        fix = (
            "fix: raise maxmemory, or lower CLEVERAGENTS_RESULT_EXPIRES_S "
            '(docs/operations.md, "Sizing Redis")'
        )
        if memory.used_bytes >= NEARLY_FULL * memory.max_bytes:
            return f"{where}: it is nearly full, and then refuses new invocations. {fix}"
        first_at, first_used = self._samples[0]
        span = now - first_at
        growth = (memory.used_bytes - first_used) / span if span >= self.min_window_s else 0.0
        if growth <= 0:
            return None
        full_in = (memory.max_bytes - memory.used_bytes) / growth
        if full_in >= self.expires_s:
            return None
        return (
            f"{where} and grows by {_mb(growth * 3600)} an hour: full in about "
            f"{_duration(full_in)}, before the results stored now expire "
            f"(CLEVERAGENTS_RESULT_EXPIRES_S={self.expires_s:g}). {fix}"
        )

    def start(self) -> None:
        """Sample in a daemon thread of this process from now on."""
        threading.Thread(target=self._run, name="cleveragents-memory-watch", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            try:
                line = self.observe(read_memory(self.client), time.time())
            except redis.RedisError:
                continue  # Redis away, or INFO refused: said at start, and ridden out
            if line:
                log.warning("%s", line)


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"  # as redis.conf counts: 1mb is 1,048,576 bytes


def _duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"
