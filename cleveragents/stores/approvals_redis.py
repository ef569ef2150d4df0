"""Approvals in the Redis beside the results, on Redis' own clock.

Three key families, each written by one role (docs/deployment.md, "Redis users per
role"): a write worker writes the parked record (``cleveragents:approval:<id>``, a
hash) and the index of those waiting (``cleveragents:approvals``, a sorted set by
the time asked); a read-only worker the same under keys of its own
(``cleveragents:ro:approval:<id>``, ``cleveragents:ro:approvals``: ``FLEETS``), so
that a role that may not send a write can neither plant nor rewrite a record a
write worker acts on; only an approver writes a decision
(``cleveragents:decision:<id>``, a hash). A worker reads the decision; it cannot
make one. Each side is one script, so that a decision and an expiry never cross:
the approver's stores a decision only before the record's expiry, the worker's
expires a record only without one.

A decision names the digest of what the person was shown; the approver's script
stores it only while the record still has that digest, and the worker's counts it
only for a delivery whose own content has it (docs/approvals.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property, partial
from typing import Any, NamedTuple

from cleveragents.approvals.model import (
    WAITING,
    ApprovalError,
    Decision,
    Parked,
    Resolution,
    decide,
)
from cleveragents.constants import (
    APPROVAL_INDEX_KEY,
    APPROVAL_KEY_PREFIX,
    DECISION_KEY_PREFIX,
    READ_ONLY_APPROVAL_INDEX_KEY,
    READ_ONLY_APPROVAL_KEY_PREFIX,
)
from cleveragents.stores.redis_retry import retrying
from cleveragents.stores.replication import ReplicaWait
from cleveragents.stores.resp import Arg, Script

__all__ = ["FLEETS", "READ_ONLY_FLEET", "WRITE_FLEET", "ApprovalKeys", "RedisApprovalStore"]


class ApprovalKeys(NamedTuple):
    """Where one fleet's workers keep their parked records and their index."""

    record_prefix: str
    waiting: str


#: Write workers' keys, which only their Redis user may write.
WRITE_FLEET = ApprovalKeys(APPROVAL_KEY_PREFIX, APPROVAL_INDEX_KEY)
#: Read-only workers' keys, their user's own.
READ_ONLY_FLEET = ApprovalKeys(READ_ONLY_APPROVAL_KEY_PREFIX, READ_ONLY_APPROVAL_INDEX_KEY)
#: Both, as the approver and the exporter read them.
FLEETS = (WRITE_FLEET, READ_ONLY_FLEET)

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
local d = redis.call('HMGET', KEYS[2], 'outcome', 'by', 'reason', 'at', 'digest', 'channel')
if d[1] and d[5] ~= ARGV[5] then
  -- about other arguments than this delivery's: no decision about these
  d = {false, false, false, false, false, false}
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
return {state, got[1], got[2], got[3], changed, d[1], d[2], d[3], d[4], d[5], d[6]}
"""

#: KEYS: the record, the decision. ARGV: outcome, by, reason, the digest decided
#: ('': the record's), the channel it came by (cli, python, mcp, web). Stores the
#: decision only while the record waits, undecided, unexpired and with that digest;
#: returns whether it did, the record's fields, the decision's (stored now, or found)
#: and the time.
_DECIDE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local got = redis.call('HMGET', KEYS[1], 'record', 'asked_at', 'expires_at', 'state', 'digest')
local stamp = string.format('%.6f', now)
if not got[1] then
  return {0, false, false, false, false, false, false, false, false, false, false, stamp}
end
local d = redis.call('HMGET', KEYS[2], 'outcome', 'by', 'reason', 'at', 'digest', 'channel')
local other = ARGV[4] ~= '' and ARGV[4] ~= got[5]
if d[1] or other or got[4] ~= 'waiting' or now >= tonumber(got[3]) then
  return {0, got[1], got[2], got[3], got[4], d[1], d[2], d[3], d[4], d[5], d[6], stamp}
end
redis.call('HSET', KEYS[2], 'outcome', ARGV[1], 'by', ARGV[2], 'reason', ARGV[3], 'at', stamp,
  'digest', got[5], 'channel', ARGV[5])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then
  redis.call('PEXPIRE', KEYS[2], left)
end
return {1, got[1], got[2], got[3], got[4], ARGV[1], ARGV[2], ARGV[3], stamp, got[5], ARGV[5],
  stamp}
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(raw: Any, asked_at: Any, expires_at: Any, state: Any) -> Parked | None:
    if raw is None or raw is False:
        return None
    return Parked.decode(
        raw, asked_at=float(asked_at), expires_at=float(expires_at), state=_text(state)
    )


def _decision(
    outcome: Any, by: Any, reason: Any, at: Any, digest: Any = "", channel: Any = ""
) -> Decision | None:
    if outcome is None or outcome is False:
        return None
    said = _text(reason) if reason not in (None, False) else ""
    found = _text(digest) if digest not in (None, False) else ""
    way = _text(channel) if channel not in (None, False) else ""
    return Decision(_text(outcome), _text(by), said or None, float(at or 0), found, way)  # type: ignore[arg-type]


class RedisApprovalStore:
    """Approvals as Redis keys; see the module docstring for who writes which.

    ``fleets``: the keys of the fleets it reads, the first the one it parks under (a
    worker's store has its own fleet's only; a producer's and an approver's both).
    """

    def __init__(
        self,
        client: Any,
        keep_s: float,
        fleets: tuple[ApprovalKeys, ...] = FLEETS,
        replicas: ReplicaWait | None = None,
    ) -> None:
        self.client = client
        #: How long a record (and its decision) is kept past its expiry.
        self.keep_s = max(int(keep_s), 60)
        self.fleets = fleets
        #: What a decision waits for: a replica's acknowledgement (``stores/replication.py``).
        self.replicas = replicas or ReplicaWait()

    @staticmethod
    def _keys(fleet: ApprovalKeys, request_id: str) -> list[str]:
        return [f"{fleet.record_prefix}{request_id}", f"{DECISION_KEY_PREFIX}{request_id}"]

    def resolve(self, asked: Parked, ttl_s: float) -> Resolution:
        fleet = self.fleets[0]
        keys = [*self._keys(fleet, asked.request_id), fleet.waiting]
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
        args = [wanted.outcome, wanted.by, wanted.reason or "", wanted.digest, wanted.channel]
        for fleet in self.fleets:
            keys = self._keys(fleet, request_id)
            reply = retrying(partial(self._decided, keys, args))
            stored, raw, asked_at, expires_at, state, *decided, now = reply
            record = _record(raw, asked_at, expires_at, state)
            if record is None:
                continue  # parked by the other fleet, or not at all
            decision = _decision(*decided)
            if stored and decision is not None:
                return record, decision
            decide(request_id, record, decision, wanted, float(now))  # raises: it says why
            raise ApprovalError(
                f"invocation {request_id} could not be decided; nothing was changed"
            )
        decide(request_id, None, None, wanted, 0.0)  # raises: nothing waits under this id
        raise ApprovalError(f"no invocation {request_id} awaits approval")

    def get(self, request_id: str) -> tuple[Parked | None, Decision | None]:
        def read() -> tuple[Any, Any]:
            with self.client.pipeline(transaction=False) as pipe:
                for fleet in self.fleets:
                    record_key = self._keys(fleet, request_id)[0]
                    pipe.hmget(record_key, "record", "asked_at", "expires_at", "state")
                pipe.hmget(
                    f"{DECISION_KEY_PREFIX}{request_id}",
                    "outcome",
                    "by",
                    "reason",
                    "at",
                    "digest",
                    "channel",
                )
                *records, decided = pipe.execute()
            found = next((got for got in records if got[0] is not None), records[0])
            return found, decided

        got, decided = retrying(read)
        return _record(*got), _decision(*decided)

    def parked_read_only(self, request_id: str) -> bool:
        """Whether ``request_id`` is parked under read-only workers' keys (and not the write
        fleet's): such a record is their user's to write, so it may ask for no write."""
        if READ_ONLY_FLEET not in self.fleets:
            return False
        keys = [f"{fleet.record_prefix}{request_id}" for fleet in (WRITE_FLEET, READ_ONLY_FLEET)]
        # HMGET, not EXISTS: the approver's user may read records, and run nothing else
        [write] = retrying(partial(self.client.hmget, keys[0], "state"))
        [read_only] = retrying(partial(self.client.hmget, keys[1], "state"))
        return write is None and read_only is not None

    def waiting(self, limit: int = 1000) -> list[tuple[Parked, Decision | None]]:
        ids: list[tuple[Any, float]] = []
        for fleet in self.fleets:
            ids += retrying(
                partial(self.client.zrange, fleet.waiting, 0, limit - 1, withscores=True)
            )
        ids.sort(key=lambda pair: pair[1])
        found = [self.get(_text(request_id)) for request_id, _ in ids[:limit]]
        return [(r, d) for r, d in found if r is not None and r.state == WAITING]

    def oldest_asked_at(self) -> float | None:
        """When the longest-waiting invocation was parked (None: none waits)."""
        firsts: list[float] = []
        for fleet in self.fleets:
            first = retrying(partial(self.client.zrange, fleet.waiting, 0, 0, withscores=True))
            firsts += [float(first[0][1])] if first else []
        return min(firsts) if firsts else None

    @cached_property
    def _resolve(self) -> Script:
        return Script(self.client, _RESOLVE_LUA)

    def _decided(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """The decision script's reply, once a replica has the decision (``replicas``)."""
        replies = self._decide.then(keys, args, self.replicas.commands)
        self.replicas.check(replies[1:])
        return replies[0]

    @cached_property
    def _decide(self) -> Script:
        return Script(self.client, _DECIDE_LUA)
