"""Fetching from the Redis queues with nothing lost in flight.

kombu takes a message with ``BRPOP`` and records it as unacknowledged afterwards,
from the worker: a reply lost between the two (a connection cut, a Redis killed
after it popped) loses the message for good. Here one Lua script does both, the
way Dramatiq's Redis broker and Sidekiq's ``super_fetch`` fetch: it pops the first
message of the queues (in the order kombu's ``BRPOP`` would), records it in
kombu's ``unacked`` hash and index and under its holder, and renews the holder's
heartbeat, all at once. A message is then always in a queue or held; a holder
that stops beating has its messages given back (``cleveragents.broker.redis.transport``).

A script cannot block. When every queue is empty the consumer waits on the
queues' doorbells instead (``BRPOP`` on ``cleveragents:door:<queue>``, which a
producer of this transport rings as it publishes, in the same round trip), for
at most ``WAIT_S``: a producer on kombu's own transport (a plain ``send_task``)
rings no bell, and its message is fetched by the next poll. Losing a doorbell
costs nothing but that wait.
"""

from __future__ import annotations

from typing import Any

from cleveragents.constants import (
    DOOR_KEY_PREFIX,
    HELD_KEY,
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
)

__all__ = [
    "DOOR_CAP",
    "DOOR_TTL_MS",
    "FETCH_LUA",
    "SKILL_QUEUES",
    "WAIT_S",
    "door_key",
    "fetch_command",
    "skill_routing",
]

#: The queues whose messages are recorded and delivered under the queue they came from.
SKILL_QUEUES = frozenset({QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE})

#: The longest an idle consumer waits before it looks at its queues again.
WAIT_S = 0.25
#: A queue's doorbell keeps this many rings at most (one wakes one idle consumer).
DOOR_CAP = 64
#: A doorbell nobody waits on (a reply queue's, say) is gone this long after its last ring.
DOOR_TTL_MS = 60_000

#: KEYS: unacked hash, unacked index, held hash, the holder's heartbeat key, then
#: ARGV[4] doorbells, then the queues, first looked at first.
#: ARGV: now (seconds), holder id, heartbeat time-to-live (ms), number of doorbells,
#: then per queue the exchange and routing key to record for its messages ('': the
#: message's own). A skill queue's messages are recorded under the queue they were
#: taken from, whatever they say: a message pushed onto a read queue that names a
#: write queue must not be given back to the write queue (``skill_routing``).
#: Returns {queue key, message} or nil, having emptied the doorbells.
FETCH_LUA = """
local now, holder, ttl, doors = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
for i = 5 + doors, #KEYS do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local ok, message = pcall(cjson.decode, item)
    local props = ok and type(message) == 'table' and message.properties
    local tag = type(props) == 'table' and props.delivery_tag
    local info = type(props) == 'table' and props.delivery_info
    if type(tag) == 'string' and type(info) == 'table' then
      local exchange = info.exchange == nil and cjson.null or info.exchange
      local routing_key = info.routing_key == nil and cjson.null or info.routing_key
      local taken_from = ARGV[i - doors]
      if taken_from and taken_from ~= '' then
        exchange, routing_key = taken_from, taken_from
      end
      -- kombu's unacked record, [message, exchange, routing_key], with the message
      -- as it was sent (decoding and encoding it again could change it).
      redis.call('HSET', KEYS[1], tag,
        '[' .. item .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
      redis.call('ZADD', KEYS[2], now, tag)
      redis.call('HSET', KEYS[3], tag, holder)
      redis.call('SET', KEYS[4], '1', 'PX', ttl)
    end
    return {KEYS[i], item}
  end
end
for i = 5, 4 + doors do
  redis.call('DEL', KEYS[i])
end
return false
"""


def door_key(queue: str) -> str:
    """The doorbell of ``queue``: rung as a message is published to it."""
    return f"{DOOR_KEY_PREFIX}{queue}"


def fetch_command(
    sha: str,
    *,
    queue_keys: list[str],
    queues: list[str],
    unacked: tuple[str, str],
    holder: str,
    alive: str,
    held: str = HELD_KEY,
    ttl_ms: int,
    now: float,
    taken_from: list[str] | None = None,
) -> list[Any]:
    """The ``EVALSHA`` of ``FETCH_LUA`` that takes the first message of ``queue_keys``
    (``taken_from``: per queue key, the queue its messages are recorded under, or '')."""
    doors = [door_key(queue) for queue in dict.fromkeys(queues)]
    keys = [*unacked, held, alive, *doors, *queue_keys]
    stamps = taken_from if taken_from is not None else [""] * len(queue_keys)
    return ["EVALSHA", sha, len(keys), *keys, repr(now), holder, ttl_ms, len(doors), *stamps]


def skill_routing(queue: str) -> str:
    """The routing key a message taken from ``queue`` is recorded and delivered under:
    the skill queue itself ('' for any other queue: the message's own)."""
    return queue if queue in SKILL_QUEUES else ""
