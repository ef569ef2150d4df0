"""Approvals in the Redis beside the results, on Redis' own clock.

Three key families, each written by one role (docs/deployment.md, "Redis users per
role"): a worker writes the parked record (``cleveragents:approval:<id>``, a hash)
and the index of those waiting (``cleveragents:approvals``, a sorted set by the
time asked); only an approver writes a decision (``cleveragents:decision:<id>``, a
hash). A worker reads the decision; it cannot make one. Each side is one script,
so that a decision and an expiry never cross: the approver's stores a decision
only before the record's expiry, the worker's expires a record only without one.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from cleveragents.approvals.model import (
    WAITING,
    ApprovalError,
    Decision,
    Parked,
    Resolution,
    decide,
)
from cleveragents.constants import APPROVAL_INDEX_KEY, APPROVAL_KEY_PREFIX, DECISION_KEY_PREFIX
from cleveragents.stores.redis_retry import retrying
from cleveragents.stores.resp import Arg, Script

__all__ = ["RedisApprovalStore"]

#: KEYS: the record, the decision, the index. ARGV: the record's JSON, its time to
#: expiry (ms), the keys' time to live (s), the request id. Returns the state, the
#: record's fields, whether this call changed it, and the decision's fields.
_RESOLVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local got = redis.call('HMGET', KEYS[1], 'record', 'asked_at', 'expires_at', 'state', 'digest')
if not got[1] then
  local expires = now + tonumber(ARGV[2]) / 1000
  redis.call('HSET', KEYS[1], 'record', ARGV[1], 'asked_at', string.format('%.6f', now),
    'expires_at', string.format('%.6f', expires), 'state', 'waiting', 'digest', ARGV[5])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', KEYS[3], now, ARGV[4])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
  return {'waiting', ARGV[1], string.format('%.6f', now), string.format('%.6f', expires), 1}
end
local d = redis.call('HMGET', KEYS[2], 'outcome', 'by', 'reason', 'at', 'digest')
if d[1] and d[5] ~= got[5] then
  d = {false, false, false, false, false}  -- about other arguments: no decision about these
end
local state, changed = got[4], 0
if state == 'waiting' then
  if d[1] then
    state, changed = d[1], 1
  elseif now >= tonumber(got[3]) then
    state, changed = 'expired', 1
  end
  if changed == 1 then
    redis.call('HSET', KEYS[1], 'state', state)
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
end
return {state, got[1], got[2], got[3], changed, d[1], d[2], d[3], d[4], d[5]}
"""

#: KEYS: the record, the decision. ARGV: outcome, by, reason. Stores the decision
#: only while the record waits, undecided and unexpired; returns whether it did,
#: the record's fields, the decision's (stored now, or found) and the time.
_DECIDE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local got = redis.call('HMGET', KEYS[1], 'record', 'asked_at', 'expires_at', 'state', 'digest')
local stamp = string.format('%.6f', now)
if not got[1] then
  return {0, false, false, false, false, false, false, false, false, false, stamp}
end
local d = redis.call('HMGET', KEYS[2], 'outcome', 'by', 'reason', 'at', 'digest')
if d[1] or got[4] ~= 'waiting' or now >= tonumber(got[3]) then
  return {0, got[1], got[2], got[3], got[4], d[1], d[2], d[3], d[4], d[5], stamp}
end
redis.call('HSET', KEYS[2], 'outcome', ARGV[1], 'by', ARGV[2], 'reason', ARGV[3], 'at', stamp,
  'digest', got[5])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then
  redis.call('PEXPIRE', KEYS[2], left)
end
return {1, got[1], got[2], got[3], got[4], ARGV[1], ARGV[2], ARGV[3], stamp, got[5], stamp}
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(raw: Any, asked_at: Any, expires_at: Any, state: Any) -> Parked | None:
    if raw is None or raw is False:
        return None
    return Parked.decode(
        raw, asked_at=float(asked_at), expires_at=float(expires_at), state=_text(state)
    )


def _decision(outcome: Any, by: Any, reason: Any, at: Any, digest: Any = "") -> Decision | None:
    if outcome is None or outcome is False:
        return None
    said = _text(reason) if reason not in (None, False) else ""
    found = _text(digest) if digest not in (None, False) else ""
    return Decision(_text(outcome), _text(by), said or None, float(at or 0), found)  # type: ignore[arg-type]


class RedisApprovalStore:
    """Approvals as Redis keys; see the module docstring for who writes which."""

    def __init__(self, client: Any, keep_s: float) -> None:
        self.client = client
        #: How long a record (and its decision) is kept past its expiry.
        self.keep_s = max(int(keep_s), 60)

    @staticmethod
    def _keys(request_id: str) -> list[str]:
        return [f"{APPROVAL_KEY_PREFIX}{request_id}", f"{DECISION_KEY_PREFIX}{request_id}"]

    def resolve(self, asked: Parked, ttl_s: float) -> Resolution:
        keys = [*self._keys(asked.request_id), APPROVAL_INDEX_KEY]
        args: list[Arg] = [
            asked.encode(),
            round(ttl_s * 1000),
            int(ttl_s) + self.keep_s,
            asked.request_id,
            asked.digest,
        ]
        reply = retrying(lambda: self._resolve(keys=keys, args=args))
        state, raw, asked_at, expires_at, changed, *decided = reply
        record = _record(raw, asked_at, expires_at, state)
        assert record is not None
        decision = _decision(*decided) if decided else None
        return Resolution(_text(state), record, decision, bool(changed))

    def decide(self, request_id: str, wanted: Decision) -> tuple[Parked, Decision]:
        args = [wanted.outcome, wanted.by, wanted.reason or ""]
        reply = retrying(lambda: self._decide(keys=self._keys(request_id), args=args))
        stored, raw, asked_at, expires_at, state, *decided, now = reply
        record = _record(raw, asked_at, expires_at, state)
        decision = _decision(*decided)
        if stored and record is not None and decision is not None:
            return record, decision
        decide(request_id, record, decision, wanted, float(now))  # raises: it says why
        raise ApprovalError(f"invocation {request_id} could not be decided; nothing was changed")

    def get(self, request_id: str) -> tuple[Parked | None, Decision | None]:
        record_key, decision_key = self._keys(request_id)

        def read() -> tuple[Any, Any]:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hmget(record_key, "record", "asked_at", "expires_at", "state")
                pipe.hmget(decision_key, "outcome", "by", "reason", "at", "digest")
                got, decided = pipe.execute()
            return got, decided

        got, decided = retrying(read)
        return _record(*got), _decision(*decided)

    def waiting(self, limit: int = 1000) -> list[tuple[Parked, Decision | None]]:
        ids = retrying(lambda: self.client.zrange(APPROVAL_INDEX_KEY, 0, limit - 1))
        found = [self.get(_text(request_id)) for request_id in ids]
        return [(r, d) for r, d in found if r is not None and r.state == WAITING]

    def oldest_asked_at(self) -> float | None:
        """When the longest-waiting invocation was parked (None: none waits)."""
        first = retrying(lambda: self.client.zrange(APPROVAL_INDEX_KEY, 0, 0, withscores=True))
        return float(first[0][1]) if first else None

    @cached_property
    def _resolve(self) -> Script:
        return Script(self.client, _RESOLVE_LUA)

    @cached_property
    def _decide(self) -> Script:
        return Script(self.client, _DECIDE_LUA)
