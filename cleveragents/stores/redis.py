"""The Redis stores: keys beside Celery's results, every call through one retry policy.

Each call rides out a Redis restart (``cleveragents.stores.redis_retry.retrying``). A write
whose reply was lost to a broken connection is sent again: setting a key or
deleting one is idempotent, and a write claim recognises its own token; a
counter (``INCRBY``, ``HINCRBY``), a dead letter or a ledger append (``LPUSH``,
``RPUSH``) caught that way may count twice, the one cost of never losing one.
The commands are those the worker's and producer's Redis users may run
(docs/deployment.md, "Redis users per role").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property, partial
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from cleveragents.constants import (
    BATCH_KEY_PREFIX,
    BIND_KEY_PREFIX,
    CANCEL_KEY_PREFIX,
    CLAIM_KEY_PREFIX,
    DEAD_LETTER_KEY,
    DEAD_LETTER_LIMIT,
    DURATIONS_KEY,
    INVOCATIONS_KEY,
    SEAL_KEY_PREFIX,
)
from cleveragents.stores.base import Binding, Claim, MetricCounts, StartedMark, bind_then_start
from cleveragents.stores.redis_retry import retrying
from cleveragents.stores.replication import ReplicaWait
from cleveragents.stores.resp import Arg, Script, pipelined
from cleveragents.stores.result_meta import KeyValueResults
from cleveragents.stores.state_lua import STORE_STATE_LUA

__all__ = ["RedisBatchLedger", "RedisGuardStore", "RedisMetricStore", "RedisResultStore"]

log = logging.getLogger(__name__)

#: Ledger ids read from Redis at once.
_PAGE = 10_000

#: Many ids are bound by one script, not a pipeline of commands: the script's
#: condition (a producer's binding gets its time to live) would be a second command per
#: key, 3-4 us more of the caller's CPU per key for 0-1 us less of Redis's (100 keys at
#: once). Redis checks each command a script runs against the caller's user, as if
#: sent alone.
#: KEYS: bind keys; ARGV[1]: time to live (s), then a digest per key. Returns what each
#: key held before (nil where it was free, and is now bound). A key already bound to
#: its digest gets the time to live: a producer binds with ``SETNX``, which sets none.
_BIND_LUA = """
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('SET', KEYS[i], ARGV[i + 1], 'NX', 'GET', 'EX', ARGV[1])
  if out[i] == ARGV[i + 1] then
    redis.call('EXPIRE', KEYS[i], ARGV[1])
  end
end
return out
"""
#: KEYS[1]: the id's bind key, KEYS[2]: its result key, KEYS[3]: its cancel mark. ARGV:
#: the digest, the bind's time to live (s), the encoded STARTED state, its time to live
#: (s, 0: none). Binds the id; where it is cancelled and nothing is stored under it
#: (no run of it ever started), stores nothing; else stores STARTED where the run
#: starts for sure: the id was free (unless a SUCCESS is stored: that is never
#: overwritten), or bound to this digest with no finished state stored. Returns what
#: the bind key held before (nil: it was free), 1 where STARTED was stored (else 0),
#: and 1 where it was cancelled (else 0).
_BIND_STARTING_LUA = (
    STORE_STATE_LUA
    + """
local cancelled = redis.call('EXISTS', KEYS[3]) == 1  -- first: refused, nothing is written
local before = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'EX', ARGV[2])
if before and before ~= ARGV[1] then
  return {before, 0, 0}
end
if before then  -- bound by its producer (SETNX: no time to live yet)
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
if cancelled and not redis.call('GET', KEYS[2]) then
  return {before, 0, 1}
end
if store_state(KEYS[2], ARGV[3], ARGV[4], before) then
  return {before, 1, 0}
end
return {before, 0, 0}
"""
)


def _refused(exc: Exception) -> bool:
    """Whether Redis refused a command for the user's rights (inside a script, Redis 7
    answers a plain error that says so)."""
    text = str(exc)
    return isinstance(exc, NoPermissionError) or "NOPERM" in text or "can't access" in text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisGuardStore:
    """Guard records as Redis keys: ``INCR`` counters, ``SET NX`` claims, a dead-letter list."""

    def __init__(
        self,
        client: Any,
        ttl_s: float,
        *,
        marks_redeliveries: bool = True,
        scripted: bool = False,
        replicas: ReplicaWait | None = None,
    ) -> None:
        self.client = client
        self.ttl = max(int(ttl_s), 60)
        #: What a claim, a write's outcome and a binding with STARTED wait for: a
        #: replica's acknowledgement (``stores/replication.py``; off by default).
        self.replicas = replicas or ReplicaWait()
        #: Bind ids with a script (a worker's Redis user may; a producer's may not run
        #: scripts, and binds with ``SETNX``, which never replaces another's binding).
        self.scripted = scripted
        #: Whether the broker marks redeliveries: kombu's Redis transport marks a
        #: restored message (the embedded default's server too), AMQP a redelivered one.
        self.marks_redeliveries = marks_redeliveries
        #: Redis refused the bind-and-start script (an older ACL): two steps instead.
        self._bind_starting_refused = False
        #: Redis refused a producer's ``SETNX`` (an older ACL): ``SET NX GET`` instead.
        self._setnx_refused = False

    def _key(self, kind: str, request_id: str) -> str:
        return f"{CLAIM_KEY_PREFIX}{kind}:{request_id}"

    def attempt(self, request_id: str) -> int:
        """Count one more delivery of ``request_id``; return how many have been counted."""
        key = self._key("attempts", request_id)

        def count() -> int:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.incr(key)
                pipe.expire(key, self.ttl)
                total, _ = pipe.execute()
            return int(total)

        return retrying(count)

    def _decisive(self, command: Sequence[Arg]) -> Any:
        """``command``, then the replica wait on its connection; the command's reply."""
        replies = pipelined(self.client, [command, *self.replicas.commands], inline_errors=True)
        if isinstance(replies[0], ResponseError):
            raise replies[0]
        self.replicas.check(replies[1:])
        return replies[0]

    def claim(self, request_id: str, claim: Claim) -> Claim | None:
        """Take the write claim atomically: None when taken, else the claim already held."""
        key, text = self._key("write", request_id), claim.encode()
        if retrying(lambda: self._decisive(("SET", key, text, "NX", "EX", self.ttl))):
            return None
        raw = retrying(lambda: self.client.get(key))
        if raw is None:  # expired in between: the earlier run is long over
            return Claim("", 0, 0.0)
        stored = Claim.decode(raw)
        # Our own SET NX, whose reply was lost to a broken connection, made the key.
        return None if stored.same_as(claim) else stored

    def read_claim(self, request_id: str) -> Claim | None:
        """The write claim of ``request_id``, if any."""
        key = self._key("write", request_id)
        raw = retrying(lambda: self.client.get(key))
        return Claim.decode(raw) if raw else None

    def finish(self, request_id: str, payload: dict[str, Any]) -> None:
        """Record the result of a claimed write in its claim."""
        key, text = self._key("write", request_id), Claim.finished(payload).encode()
        retrying(lambda: self._decisive(("SET", key, text, "EX", self.ttl)))

    def dead_letter(self, request_id: str, record: dict[str, Any]) -> None:
        """Keep a poison invocation for inspection (newest first, the last 10,000)."""
        text = json.dumps({"request_id": request_id, **record})

        def push() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.lpush(DEAD_LETTER_KEY, text)
                pipe.ltrim(DEAD_LETTER_KEY, 0, DEAD_LETTER_LIMIT - 1)
                pipe.execute()

        retrying(push)

    def bind(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """Bind ids to digests: one ``SET NX GET`` each (Redis 7), in one round trip."""
        if not pairs:
            return []

        keys = [f"{BIND_KEY_PREFIX}{request_id}" for request_id, _ in pairs]
        digests = [digest for _, digest in pairs]

        def bind_all() -> list[Any]:
            if self.scripted:
                return list(self._bind_script(keys=keys, args=[self.ttl, *digests]))
            return self._bind_as_producer(keys, digests)

        # A reply lost to a broken connection is sent again and finds its own digest:
        # the same request, as it is.
        return [None if raw is None else _text(raw) for raw in retrying(bind_all)]

    def _bind_as_producer(self, keys: list[str], digests: list[str]) -> list[Any]:
        """``SETNX`` each key, then ``GET`` those already bound (a second round trip only
        when some were: a resumed batch, a request sent again): a producer's user may not
        ``SET`` bindings, so that no producer can replace the binding of another's waiting
        request (and have its own request answer it). The worker gives the key its time
        to live."""
        if not self._setnx_refused:
            try:
                took = pipelined(
                    self.client, [("SETNX", k, d) for k, d in zip(keys, digests, strict=True)]
                )
            except NoPermissionError as exc:
                self._setnx_refused = True
                log.warning(
                    "Redis refused SETNX on request-id bindings (%s): the producer's Redis "
                    "user has older rules, which let any producer replace another's "
                    "binding; give it (~cleveragents:bind:* +setnx +get) instead of "
                    '(~cleveragents:bind:* +set) (docs/deployment.md, "Redis users per '
                    'role"); until then it binds with SET NX',
                    exc,
                )
            else:
                held = [key for key, new in zip(keys, took, strict=True) if not new]
                found = iter(pipelined(self.client, [("GET", key) for key in held]))
                # A key deleted between the two reads is free: the worker binds it.
                return [None if new else next(found) for new in took]
        return pipelined(
            self.client,
            [
                ("SET", key, digest, "NX", "GET", "EX", self.ttl)
                for key, digest in zip(keys, digests, strict=True)
            ],
        )

    @cached_property
    def _bind_script(self) -> Script:
        return Script(self.client, _BIND_LUA)

    def binding(self, request_id: str) -> str | None:
        """The digest under the id's bind key, if any."""
        raw = retrying(lambda: self.client.get(f"{BIND_KEY_PREFIX}{request_id}"))
        return None if raw is None else _text(raw)

    def bind_starting(self, request_id: str, digest: str, mark: StartedMark) -> Binding:
        """Bind the id and store ``mark`` in one round trip (a worker's; see the script),
        or find the id cancelled before it ever started.

        A producer, whose Redis user runs no scripts, or a mark without its encoded
        form, takes two steps (``bind_then_start``).
        """
        if not self.scripted or mark.key is None or self._bind_starting_refused:
            return bind_then_start(self, request_id, digest, mark)
        keys = [f"{BIND_KEY_PREFIX}{request_id}", mark.key, f"{CANCEL_KEY_PREFIX}{request_id}"]
        args: list[Arg] = [digest, self.ttl, mark.value, mark.ttl_s]
        try:
            # Sent again after a lost reply, it finds its own digest and its own
            # STARTED: stored again, which is harmless.
            before, stored, cancelled = retrying(lambda: self._bind_starting(keys, args))
        except (NoPermissionError, ResponseError) as exc:
            if not _refused(exc):
                raise
            # A Redis user set up by an older docs/deployment.md: refused before the
            # script ran, or by its first command, so nothing happened. Two steps from
            # now on, said once.
            self._bind_starting_refused = True
            log.warning(
                "Redis refused the script that binds a request id and stores STARTED at "
                "once (%s): add ~celery-task-meta-* and ~cleveragents:cancel:* to the "
                "worker user's (~cleveragents:bind:* +set +evalsha) selector, and a "
                "selector (~cleveragents:cancel:* +exists) (docs/deployment.md, "
                '"Redis users per role"); until then it takes two round trips and finds '
                "no cancellation",
                exc,
            )
            return bind_then_start(self, request_id, digest, mark)
        return Binding(None if before is None else _text(before), bool(stored), bool(cancelled))

    def cancel(self, request_id: str) -> bool:
        """Mark the id cancelled for as long as its result would be kept (a producer's
        user may: ``SET`` on ``cleveragents:cancel:*``)."""
        key = f"{CANCEL_KEY_PREFIX}{request_id}"
        retrying(lambda: self.client.set(key, "1", ex=self.ttl))
        return True

    def _bind_starting(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        replies = self._bind_starting_script.then(keys, args, self.replicas.commands)
        self.replicas.check(replies[1:])
        return replies[0]

    @cached_property
    def _bind_starting_script(self) -> Script:
        return Script(self.client, _BIND_STARTING_LUA)


class RedisResultStore(KeyValueResults):
    """Results in the Redis result backend: one ``MGET`` to read, one round trip to write."""

    def __init__(
        self,
        client: Any,
        key_for: Callable[[str], Any],
        expires_s: int | None,
    ) -> None:
        self.client = client
        self.key_for = key_for
        self.expires_s = expires_s

    def _read(self, request_ids: Sequence[str]) -> Sequence[Any]:
        keys = [self.key_for(rid) for rid in request_ids]
        [values] = retrying(lambda: pipelined(self.client, [("MGET", *keys)]))
        return list(values)

    def _write(self, metas: Sequence[tuple[str, dict[str, Any]]]) -> None:
        # No PUBLISH per result (Celery's own store does one): it would double the
        # commands of a batch, and SkillClient.wait also re-reads the store. A pipeline
        # of SETs, packed here, not a script: Redis spends 2.3-3.0 us on a 365-byte
        # result's SET sent so and 4.1-4.7 us on one a script makes (its arguments
        # are copied into Lua and out again), and the caller about the same either way
        # (3.8-4.5 against 3.4-3.6 us; 100 keys at once).
        expiry: tuple[Arg, ...] = ("EX", self.expires_s) if self.expires_s else ()
        commands = [
            ("SET", self.key_for(rid), json.dumps(meta, separators=(",", ":")), *expiry)
            for rid, meta in metas
        ]
        retrying(lambda: pipelined(self.client, commands))

    def _delete(self, request_ids: Sequence[str]) -> None:
        keys = [self.key_for(rid) for rid in request_ids]
        retrying(lambda: self.client.delete(*keys))


class RedisBatchLedger:
    """A batch as a JSON meta key and a list of ids, expiring with the results."""

    def __init__(self, client: Any, expires_s: int | None) -> None:
        self.client = client
        self.expires_s = expires_s

    def _keys(self, batch_id: str) -> tuple[str, str]:
        return f"{BATCH_KEY_PREFIX}{batch_id}", f"{BATCH_KEY_PREFIX}{batch_id}:ids"

    def set_meta(self, batch_id: str, meta: dict[str, Any]) -> None:
        """Record (or replace) what the batch is: its file, counts, times."""
        key, text = self._keys(batch_id)[0], json.dumps(meta)
        retrying(lambda: self.client.set(key, text, ex=self.expires_s))

    def meta(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's description, or None when there is no such batch."""
        key = self._keys(batch_id)[0]
        raw = retrying(lambda: self.client.get(key))
        return json.loads(raw) if raw else None

    def append(self, batch_id: str, request_ids: Sequence[str]) -> None:
        """Add request ids behind those already recorded."""
        if not request_ids:
            return
        ids_key = self._keys(batch_id)[1]

        def push() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.rpush(ids_key, *request_ids)
                if self.expires_s:
                    pipe.expire(ids_key, self.expires_s)
                pipe.execute()

        retrying(push)

    def ids(self, batch_id: str) -> Iterator[str]:
        """The batch's request ids, in input order, a page at a time."""
        ids_key = self._keys(batch_id)[1]
        start = 0
        while True:
            page = retrying(partial(self.client.lrange, ids_key, start, start + _PAGE - 1))
            if not page:
                return
            yield from (_text(value) for value in page)
            start += len(page)

    def length(self, batch_id: str) -> int:
        """How many request ids the batch's ledger holds (``LLEN``)."""
        ids_key = self._keys(batch_id)[1]
        return int(retrying(lambda: self.client.llen(ids_key)))

    def seal(self, batch_id: str, seal: str) -> str | None:
        """Make the batch's seal once (``SETNX``: a producer's user may neither replace,
        expire nor delete one; a worker's sweep gives it its time to live)."""
        key = f"{SEAL_KEY_PREFIX}{batch_id}"
        if retrying(lambda: self.client.setnx(key, seal)):
            return None
        before = self.seal_of(batch_id)
        # Our own SETNX, whose reply was lost to a broken connection, made the key.
        return None if before == seal else (before or "")

    def seal_of(self, batch_id: str) -> str | None:
        """The batch's seal, if it has one."""
        raw = retrying(lambda: self.client.get(f"{SEAL_KEY_PREFIX}{batch_id}"))
        return None if raw is None else _text(raw)

    def refuse(self, batch_id: str, payloads: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Keep the results of lines answered without being sent: a hash beside the ids."""
        if not payloads:
            return
        key = f"{BATCH_KEY_PREFIX}{batch_id}:refused"
        mapping = {rid: json.dumps(payload) for rid, payload in payloads}

        def keep() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping=mapping)
                if self.expires_s:
                    pipe.expire(key, self.expires_s)
                pipe.execute()

        retrying(keep)  # sent again after a lost reply: the same fields, set again

    def refusals(self, batch_id: str, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The kept result of each id (one ``HMGET``), None where its line was sent."""
        if not request_ids:
            return []
        key = f"{BATCH_KEY_PREFIX}{batch_id}:refused"
        raw = retrying(lambda: self.client.hmget(key, list(request_ids)))
        return [None if value is None else json.loads(value) for value in raw]


class RedisMetricStore:
    """Counters in two Redis hashes, which ``cleveragents metrics`` exports."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def add(self, counts: MetricCounts) -> None:
        """Add ``counts`` to the hashes in one pipeline."""

        def write() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for field, n in counts.invocations.items():
                    pipe.hincrby(INVOCATIONS_KEY, field, n)
                for field, n in counts.durations.items():
                    pipe.hincrby(DURATIONS_KEY, field, n)
                for field, total in counts.sums.items():
                    pipe.hincrbyfloat(DURATIONS_KEY, f"sum:{field}", total)
                pipe.execute()

        retrying(write)

    def totals(self) -> MetricCounts:
        """Every count the workers have added."""
        invocations = retrying(lambda: self.client.hgetall(INVOCATIONS_KEY))
        durations = retrying(lambda: self.client.hgetall(DURATIONS_KEY))
        counts = MetricCounts()
        for field, value in invocations.items():
            counts.invocations[_text(field)] += int(value)
        for field, value in durations.items():
            text = _text(field)
            if text.startswith("sum:"):
                counts.sums[text[4:]] = float(value)
            else:
                counts.durations[text] += int(value)
        return counts
