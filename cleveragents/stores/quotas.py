"""Where a tool's fleet-wide limits are kept: the gate, in Redis (the embedded default's too).

The policy (which limits a delivery takes, and in what order) is ``pipeline/quotas.py``.

One Lua script per check, in the Redis beside the results (every worker of a role
that shares the broker shares it: write workers one set of keys, read-only workers
their own, so that neither role's user can hold the other's slots), on Redis' own
clock (``TIME``): a run takes a slot and a start only when both are free, in one
step, so that two workers never both take the last one. A slot whose lease ends
later than a lease from now, or a start still to come, was not made by this script:
it is swept as the script runs (a forged token cannot hold a slot for ever).
A slot is a lease: its holder renews it while the tool runs (every
``recovery_s / 10``) and it lapses ``recovery_s / 2`` after the last renewal, so a
slot held by a worker that died (``kill -9``, a lost machine) comes back within
``CLEVERAGENTS_RECOVERY_S``, as the messages it held do. A start is remembered for
one window (a sliding log, as the ``limits`` package's moving window keeps it).

Over its limit, an invocation does not wait in its pool process: the task sends it
back to the broker with the wait the script computed (``tasks/invoke.py``), and the
process takes the next message.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from cleveragents.constants import LIMIT_KEY_PREFIX
from cleveragents.skills.policies import Limits
from cleveragents.stores.redis_retry import retrying
from cleveragents.stores.resp import Arg, Script

__all__ = ["LimitGate", "Permit", "RedisLimitGate", "kept_for"]

#: The shortest and longest wait of an invocation refused for want of a concurrency
#: slot: a slot frees when a run ends, which nothing announces.
MIN_WAIT_S = 0.05
MAX_SLOT_WAIT_S = 0.5
#: The part of a rate's window a start is counted for beyond it (``kept_for``).
WINDOW_MARGIN = 0.1

#: KEYS[1]: the running slots (a sorted set: token -> lease end, ms); KEYS[2]: the
#: starts of the window (member -> start, ms). ARGV: concurrency (0: none), starts
#: per window (0: none), window (ms), lease (ms), the token, the longest wait for a
#: slot (ms). Returns 0 when the slot and the start were taken, else the
#: milliseconds to wait.
_TAKE_LUA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local concurrency, starts = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local wait = 0
if concurrency > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  -- No slot of this gate's ends later than a lease from now: one that does was not
  -- taken or renewed here (a forged token meant to hold a slot for ever).
  redis.call('ZREMRANGEBYSCORE', KEYS[1], string.format('(%d', now + lease + 1000), '+inf')
  if redis.call('ZCARD', KEYS[1]) >= concurrency then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    wait = math.max(wait, math.min(tonumber(first[2]) - now, tonumber(ARGV[6])))
  end
end
if starts > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], string.format('(%d', now + 1000), '+inf')  -- to come
  if redis.call('ZCARD', KEYS[2]) >= starts then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now)
  end
end
if wait > 0 then
  return wait
end
if concurrency > 0 then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[5])
  redis.call('PEXPIRE', KEYS[1], lease * 2)
end
if starts > 0 then
  redis.call('ZADD', KEYS[2], now, ARGV[5])
  redis.call('PEXPIRE', KEYS[2], window * 2)
end
return 0
"""
#: KEYS[1]: the running slots. ARGV: the token, the lease (ms). Renews the token's
#: lease if it still holds its slot; 1 when it did.
_RENEW_LUA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
"""


def kept_for(window_s: float) -> float:
    """How long a start is counted: its window and a margin (10 %, at most 1 s).

    The limit is kept on the permits; a tool starts a few tens of milliseconds after
    its permit (more on a loaded machine), so that, counted on the tools' own clocks,
    a window could otherwise hold one batch's late starts and the next one's early
    ones: 7 starts in one second of a "5/s" tool were seen without it.
    """
    return window_s + min(window_s * WINDOW_MARGIN, 1.0) if window_s else 0.0


@dataclass
class Permit:
    """A run's place under its limits: released when the run ends, renewed meanwhile."""

    gate: LimitGate
    key: str
    token: str
    holds_slot: bool
    _stop: threading.Event | None = None

    def release(self) -> None:
        """Give the slot back (a start stays counted for its window)."""
        if self._stop is not None:
            self._stop.set()
        if self.holds_slot:
            self.gate.release(self.key, self.token)


class LimitGate(Protocol):
    """Takes and gives back places under a tool's limits."""

    def take(self, key: str, limits: Limits) -> float | Permit:
        """A permit for one run, or the seconds to wait before asking again."""
        ...

    def release(self, key: str, token: str) -> None:
        """Give a slot back."""
        ...


class RedisLimitGate:
    """Limits in the Redis beside the results, one script per check."""

    def __init__(self, client: Any, recovery_s: float, prefix: str = LIMIT_KEY_PREFIX) -> None:
        self.client = client
        self.lease_ms = max(100, round(recovery_s * 1000 / 2))
        self.renew_s = max(0.05, recovery_s / 10)
        #: Whose slots: write workers' (``LIMIT_KEY_PREFIX``) or read-only workers' own
        #: (``READ_ONLY_LIMIT_KEY_PREFIX``), which the other role's user may not touch.
        self.prefix = prefix

    def _keys(self, key: str) -> list[str]:
        return [f"{self.prefix}{key}:running", f"{self.prefix}{key}:starts"]

    def take(self, key: str, limits: Limits) -> float | Permit:
        """One script: both places taken, or the wait before the next try."""
        starts, window_s = limits.per_window or (0, 0.0)
        window_s = kept_for(window_s)
        token = secrets.token_hex(8)
        args: list[Arg] = [
            limits.concurrency or 0,
            starts,
            round(window_s * 1000),
            self.lease_ms,
            token,
            round(MAX_SLOT_WAIT_S * 1000),
        ]
        wait_ms = retrying(lambda: self._take(keys=self._keys(key), args=args))
        if int(wait_ms) > 0:
            return max(MIN_WAIT_S, int(wait_ms) / 1000)
        permit = Permit(self, key, token, holds_slot=limits.concurrency is not None)
        if permit.holds_slot:
            permit._stop = self._renewing(key, token)
        return permit

    def release(self, key: str, token: str) -> None:
        """Remove the token from the running slots."""
        running = self._keys(key)[0]
        retrying(lambda: self.client.zrem(running, token))

    def _renewing(self, key: str, token: str) -> threading.Event:
        stop = threading.Event()
        running = self._keys(key)[0]

        def renew() -> None:
            while not stop.wait(self.renew_s):
                try:
                    self._renew(keys=[running], args=[token, self.lease_ms])
                except Exception:  # Redis away a moment: the lease covers a few misses
                    continue

        threading.Thread(target=renew, name="cleveragents-limit-lease", daemon=True).start()
        return stop

    @cached_property
    def _take(self) -> Script:
        return Script(self.client, _TAKE_LUA)

    @cached_property
    def _renew(self) -> Script:
        return Script(self.client, _RENEW_LUA)
