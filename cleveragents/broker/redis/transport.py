"""kombu's Redis transport, with a dead worker's messages handed out again within seconds.

Selected by class path (Celery's ``broker_transport``) for ``redis://`` and
``rediss://`` brokers (``cleveragents.broker.celery_settings``): kombu's table of transport
aliases stays as kombu ships it, and the URL's host, port, database, user,
password and TLS options are read as before. What changes, on the consuming side
only (a producer publishes exactly as with kombu's transport):

* a delivery records its holder (``cleveragents.broker.redis.liveness``) in the same ``MULTI``
  as kombu's unacked record, and an ack, a reject or a restore removes it with
  kombu's record;
* a consuming process beats for its holders, and every ``reap_s`` one worker
  gives back the messages of holders that stopped beating (``QoS.reap``), the
  way kombu restores a message: to the head of its queue, marked redelivered;
* kombu's visibility-timeout sweep passes by a message whose holder is alive
  (its tool may run for hours): the timeout is only the last resort for
  messages nobody holds (a consumer on kombu's own transport);
* a consumer takes a message and records it as held in one Lua script, and a
  producer rings the queue's doorbell as it publishes (``cleveragents.broker.redis.fetch``):
  a message is always queued or held, never only in a reply on the wire.

Written for kombu 5.7's ``kombu.transport.redis``; ``tests/broker/test_recovery.py`` checks
each of the private methods it builds on.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from queue import Empty
from typing import Any, cast

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

from cleveragents.broker.redis.fetch import (
    DOOR_CAP,
    DOOR_TTL_MS,
    FETCH_LUA,
    WAIT_S,
    door_key,
    fetch_command,
    skill_routing,
)
from cleveragents.broker.redis.liveness import (
    Heartbeat,
    RecoveryKeys,
    RecoveryTiming,
    alive_key,
    new_holder_id,
    process_heartbeat,
)
from cleveragents.stores.replication import ReplicaWait

__all__ = ["Channel", "QoS", "SocketTransport", "Transport"]

log = logging.getLogger("cleveragents.recovery")


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, recording who holds each message and giving back the dead's."""

    channel: Channel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: This channel's holder id; its messages are its own until it stops beating.
        self.holder = new_holder_id(self.keys.holder_prefix)
        self._heartbeat: Heartbeat | None = None
        self._reaped_at = float("-inf")
        self._sweeping = False
        #: Delivery tags the fetch script has recorded as held (and append need not).
        self.recorded: set[str] = set()

    @property
    def keys(self) -> RecoveryKeys:
        """The recovery keys of the channel's role (read-only or write-capable workers)."""
        return self.channel.recovery_keys

    @property
    def timing(self) -> RecoveryTiming:
        """The recovery timing of the channel's ``recovery_s``."""
        return self.channel.recovery_timing

    def hold(self) -> Heartbeat:
        """This channel's holder beats from now on; the process's heartbeat."""
        if self._heartbeat is None:
            self._heartbeat = process_heartbeat(self.channel.heartbeat_client, self.timing)
        self._heartbeat.hold(self.holder)
        return self._heartbeat

    def append(self, message: Any, delivery_tag: str) -> None:
        """Record the delivered message as kombu does, with its holder and a heartbeat."""
        if self._heartbeat is None:
            self.hold()
        if delivery_tag in self.recorded:  # taken and recorded by one script
            self.recorded.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
            return
        delivery = message.delivery_info
        exchange, routing_key = delivery["exchange"], delivery["routing_key"]
        with self.pipe_or_acquire() as pipe:
            # One MULTI: nobody ever sees the message held by a holder that has no key.
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}).hset(
                self.unacked_key, delivery_tag, dumps([message._raw, exchange, routing_key])
            ).hset(self.keys.held, delivery_tag, self.holder).set(
                alive_key(self.holder), "1", px=self.timing.ttl_ms
            ).execute()
            virtual.QoS.append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        # kombu's ack, reject and restore all go through here: the holder goes with them.
        # (A private method of kombu's QoS, absent from kombu's stubs.)
        removed = super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[misc]
        return removed.hdel(self.keys.held, delivery_tag)

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        """Restore what is still held (kombu, at channel close); then stop beating for it."""
        try:
            return super().restore_unacked_once(stderr)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.release(self.holder)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        """Give back dead holders' messages, then run kombu's visibility-timeout sweep."""
        self.reap()
        self._sweeping = True
        try:
            super().restore_visible(start, num, interval)
        finally:
            self._sweeping = False

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore; in its visibility sweep, a live holder's message stays."""
        if not self._sweeping:
            super().restore_by_tag(tag, client, leftmost)
            return
        self._give_back(bytes_to_str(tag), client, leftmost=leftmost)

    def reap(self) -> int:
        """Give back every message whose holder stopped beating; how many were given back.

        Every ``reap_s`` at most, only in a process whose own beats are steady, and only
        in the one worker that takes the reaper's lock.
        """
        beat, timing = self._heartbeat, self.timing
        now = time.monotonic()
        if beat is None or now - self._reaped_at < timing.reap_s or not beat.steady():
            return 0
        self._reaped_at = now
        try:
            with self.channel.conn_or_acquire() as client:
                lock_ms = max(1, round(timing.reap_s * 1000))
                if not client.set(self.keys.reaper, self.holder, nx=True, px=lock_ms):
                    return 0
                return self._reap_dead(client)
        except redis.RedisError as exc:
            log.warning("could not give back the messages of dead workers: %s", exc)
            return 0

    def give_back_lost(self, client: Any) -> int:
        """Give back what this holder holds in Redis and was never delivered here: what
        a fetch whose reply was lost took. How many messages were given back."""
        delivered: Mapping[str, Any] = self._delivered or {}
        lost = [
            tag
            for tag, holder in (
                (bytes_to_str(tag), bytes_to_str(holder))
                for tag, holder in client.hgetall(self.keys.held).items()
            )
            if holder == self.holder and tag not in delivered
        ]
        back = sum(self._give_back(tag, client, holder=self.holder) for tag in lost)
        if back:
            log.warning("gave back %d message(s) whose fetch reply was lost", back)
        return back

    def _reap_dead(self, client: Any) -> int:
        by_holder: dict[str, list[str]] = defaultdict(list)
        for tag, holder in client.hgetall(self.keys.held).items():
            by_holder[bytes_to_str(holder)].append(bytes_to_str(tag))
        if not by_holder:
            return 0
        holders = sorted(by_holder)
        with client.pipeline(transaction=False) as pipe:
            for holder in holders:
                pipe.exists(alive_key(holder))
            alive = pipe.execute()
        given = 0
        for holder, is_alive in zip(holders, alive, strict=True):
            if is_alive:
                continue
            back = sum(self._give_back(tag, client, holder=holder) for tag in by_holder[holder])
            if back:
                log.warning(
                    "gave back %d message(s) held by %s, which stopped beating", back, holder
                )
            given += back
        return given

    def _give_back(
        self, tag: str, client: Any, *, holder: str | None = None, leftmost: bool = False
    ) -> bool:
        """Put ``tag``'s message back in its queue (as kombu's ``restore_by_tag``), marked
        redelivered; True when a message was put back.

        ``holder`` given (the reaper): only while that holder still holds it. Else
        (kombu's sweep): unless a live holder holds it, whose message is then looked
        at again a visibility timeout later; a process that does not beat steadily
        cannot tell, and leaves every held message alone.
        """
        given = False
        heartbeat = self._heartbeat

        def transaction(pipe: Any) -> None:
            nonlocal given
            given = False
            raw_holder = pipe.hget(self.keys.held, tag)
            current = None if raw_holder is None else bytes_to_str(raw_holder)
            if holder is not None:
                keep = current != holder
            else:
                keep = current is not None and (
                    heartbeat is None
                    or not heartbeat.steady()
                    or bool(pipe.exists(alive_key(current)))
                )
            payload = None if keep else pipe.hget(self.unacked_key, tag)
            pipe.multi()
            if keep:
                if holder is None:
                    pipe.zadd(self.unacked_index_key, {tag: time.time()}, xx=True)
                return
            self._remove_from_indices(tag, pipe)
            if payload:
                message, exchange, routing_key = loads(bytes_to_str(payload))
                restore = self.channel._do_restore_message  # type: ignore[attr-defined]
                restore(message, exchange, routing_key, pipe, leftmost)
                given = True

        with self.channel.conn_or_acquire(client) as conn:
            conn.transaction(transaction, self.unacked_key, self.keys.held)
        return given


class Channel(kombu_redis.Channel):
    """kombu's Redis channel whose QoS records holders; it beats once it consumes."""

    QoS = QoS
    #: CLEVERAGENTS_RECOVERY_S: a dead holder's messages are handed out again within it.
    recovery_s: float = 30.0
    #: CLEVERAGENTS_READ_ONLY: what this worker holds is kept under the read-only
    #: role's keys (``RecoveryKeys``; kombu's ``unacked_key`` options name the same).
    recovery_read_only: bool = False
    #: A producer's channel (``SkillClient``): what it sends goes through the pool of
    #: kombu's ``client``, whose connection kombu pinged as the channel opened, so a
    #: producer holds one connection to the broker instead of two.
    one_pool: bool = False
    #: CLEVERAGENTS_REPLICA_WAIT_MS: a published message is acknowledged only once a
    #: replica has it, or this long after (``stores/replication.py``; 0: at once).
    replica_wait_ms: int = 0
    from_transport_options = (
        *kombu_redis.Channel.from_transport_options,
        "recovery_s",
        "recovery_read_only",
        "one_pool",
        "replica_wait_ms",
    )

    @cached_property
    def replicas(self) -> ReplicaWait:
        """What a published message waits for (a replica's acknowledgement)."""
        return ReplicaWait(int(self.replica_wait_ms or 0))

    @cached_property
    def recovery_keys(self) -> RecoveryKeys:
        """The keys of this worker's role: what it holds, its holders' prefix, its reaper."""
        return RecoveryKeys.of(bool(self.recovery_read_only))

    @cached_property
    def recovery_timing(self) -> RecoveryTiming:
        """The heartbeat's and reaper's timing of ``recovery_s``."""
        return RecoveryTiming.of(float(self.recovery_s))

    # kombu's, absent from its stubs.
    _queue_cycle: Any
    _expires: Any
    _q_for_pri: Any
    _create_client: Any
    pool: Any
    async_pool: Any
    connection_errors: Any
    _closing: bool

    #: What the consuming connection was last sent: "fetch" (the script), "wait" (on
    #: the doorbells), "brpop" (kombu's, for queues consumed without acknowledgement).
    _sent: str | None = None
    #: The next start waits on the doorbells: the last fetch found every queue empty.
    _wait_next = False
    #: A fetch's reply was lost: what it took is held here and was never delivered.
    _unsure = False
    #: False once the server refused the script (no EVALSHA for this user): kombu's BRPOP.
    _atomic = True
    _script_loaded = False

    #: The synchronous client of ``conn_or_acquire``, and the pool it was made for.
    _plain_client: tuple[Any, Any] | None = None

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """kombu's, with one synchronous client per pool instead of one per call.

        kombu makes a new ``redis.Redis`` for every publish, acknowledgement and
        queue size, and redis-py builds its table of reply callbacks each time (a
        few hundred microseconds, as much as the round trip itself). A client holds
        no connection of its own (each command takes one from the pool), so one
        serves them all; a new pool (after the channel reconnects) gets a new one.
        With ``one_pool`` (a producer) that pool is kombu's ``client``'s.
        """
        if client:
            yield client
            return
        pool = self.async_pool if self.one_pool else self.pool
        made = self._plain_client
        if made is None or made[0] is not pool:
            made = self._plain_client = (pool, self._create_client(asynchronous=self.one_pool))
        yield made[1]

    _fetch_sha = hashlib.sha1(FETCH_LUA.encode()).hexdigest()

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """Consume ``queue``; consuming with acknowledgements, start beating first."""
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        if not no_ack:
            cast(QoS, self.qos).hold()
            self._acked_queues.add(queue)
        else:
            self._acked_queues.discard(queue)
        return super().basic_consume(queue, *args, **kwargs)

    @cached_property
    def _acked_queues(self) -> set[str]:
        return set()

    def _fetches(self) -> bool:
        """Whether this channel fetches with the script: every queue it consumes is
        acknowledged (a no-ack queue, a reply queue, takes kombu's BRPOP)."""
        return (
            self._atomic
            and not self.global_keyprefix
            and bool(self.active_queues)
            and all(queue in self._acked_queues for queue in self.active_queues)
        )

    def _brpop_start(self, timeout: Any = None) -> None:
        if not self._fetches():
            self._sent = "brpop"
            super()._brpop_start(timeout)  # type: ignore[misc]
            return
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        client = self.client
        if self._unsure:  # before anything else is taken, and on a connection of its own
            with self.conn_or_acquire() as other:
                cast(QoS, self.qos).give_back_lost(other)
            self._unsure = False
        if self._wait_next:
            command: list[Any] = ["BRPOP", *(door_key(q) for q in dict.fromkeys(queues)), WAIT_S]
            self._sent = "wait"
        else:
            if not self._script_loaded:
                client.script_load(FETCH_LUA)
                self._script_loaded = True
            qos = cast(QoS, self.qos)
            ordered = [(q, pri) for pri in self.priority_steps for q in queues]
            command = fetch_command(
                self._fetch_sha,
                queue_keys=[self._q_for_pri(q, pri) for q, pri in ordered],
                queues=queues,
                taken_from=[skill_routing(q) for q, _ in ordered],
                unacked=(self.unacked_key, self.unacked_index_key),
                holder=qos.holder,
                alive=alive_key(qos.holder),
                held=qos.keys.held,
                ttl_ms=qos.timing.ttl_ms,
                now=time.time(),
            )
            self._sent = "fetch"
        self._in_poll = client.connection
        self._brpop_sent_at = time.monotonic()
        client.connection.send_command(*command)

    def _receive_one(self, c: Any) -> Any:
        """kombu's read of the fanout subscription, once it holds something to read.

        kombu reads it blocking when its socket is readable. A socket the server closed
        (``CLIENT KILL``, a pub/sub output buffer over its limit, the Sentinel watch's
        cut) is readable too, and redis-py's retry then reconnected inline and blocked
        on the new connection until the next broadcast: the event loop stopped, nothing
        more was fetched. Looked at first, a closed connection raises here instead, and
        the consumer reconnects as for any broker connection lost.
        """
        connection = c.connection
        if connection is not None and not connection.can_read(timeout=0):
            return None  # woken for nothing: the blocking read would wait
        return super()._receive_one(c)  # type: ignore[misc]

    def _lookup(self, exchange: Any, routing_key: Any, default: Any = None) -> list[str]:
        """The queues a message sent to ``exchange`` goes to: a skill queue's own exchange
        routes to that queue alone, whatever kombu's binding table says (a read-only
        worker's user may add routes to it: a message it sends, or one a worker sends
        back, to ``skills.read`` must not also land on ``skills.write``); any other
        exchange as kombu routes it."""
        if isinstance(exchange, str) and skill_routing(exchange) and routing_key == exchange:
            return [exchange]
        return list(super()._lookup(exchange, routing_key, default))  # type: ignore[misc]

    def _do_restore_message(
        self, payload: Any, exchange: Any, routing_key: Any, pipe: Any, leftmost: bool = False
    ) -> None:
        """Put a message back, marked redelivered: a skill queue's straight into the queue
        it was taken from (the fetch records it under that queue), never through kombu's
        binding table, which a read-only worker's user may add routes to (a message taken
        from ``skills.read`` must not come back on ``skills.write``); any other as kombu
        does."""
        queue = skill_routing(routing_key) if isinstance(routing_key, str) else ""
        if not queue or exchange != queue:
            super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)  # type: ignore[misc]
            return
        try:
            payload["headers"]["redelivered"] = True
            payload["properties"]["delivery_info"]["redelivered"] = True
        except (KeyError, TypeError):
            pass
        priority = self._get_message_priority(payload, reverse=False)  # type: ignore[attr-defined]
        (pipe.lpush if leftmost else pipe.rpush)(self._q_for_pri(queue, priority), dumps(payload))

    def _brpop_read(self, **options: Any) -> Any:
        sent, self._sent = self._sent, None
        if sent not in ("fetch", "wait"):
            return super()._brpop_read(**options)  # type: ignore[misc]
        look_now = False
        try:
            reply = self._fetch_reply(sent, options)
            if sent == "wait":  # rung, or waited long enough: look at the queues
                self._wait_next = False
                look_now = True
                raise Empty()
            if not reply:
                self._wait_next = True
                raise Empty()
            dest, item = reply
            payload = loads(bytes_to_str(item))
            tag = _recorded_tag(payload)
            if tag is not None:
                cast(QoS, self.qos).recorded.add(tag)
            queue = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            _deliver_as_taken(payload, queue)
            self._queue_cycle.rotate(queue)
            self.connection._deliver(payload, queue)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()  # type: ignore[attr-defined]
            # At once, on this connection: a woken worker saves a turn of its loop. Not
            # as the channel closes (kombu reads the outstanding reply then): a fetch
            # sent then could take a message whose reply nobody reads, held until its
            # holder's beat expired.
            if look_now and not self._closing and self.qos.can_consume():
                self._brpop_start()

    def _fetch_reply(self, sent: str, options: dict[str, Any]) -> Any:
        """The reply to the fetch script or the doorbell wait (Empty: nothing to deliver)."""
        client = self.client
        try:
            return client.parse_response(client.connection, "EVALSHA", **options)
        except self.connection_errors:
            # A fetch may have taken a message whose reply is lost: look for it.
            self._unsure = self._unsure or sent == "fetch"
            client.connection.disconnect()
            raise
        except redis.exceptions.NoScriptError:  # Redis restarted: load it again
            self._script_loaded = False
            raise Empty() from None
        except redis.exceptions.ResponseError as exc:
            if sent != "fetch":
                raise
            self._atomic = False
            log.error(
                "Redis refused the fetch script (%s): taking messages with BRPOP, "
                "which loses a message whose reply is cut in flight. fix: allow "
                "EVALSHA, RPOP and DEL on the queue and doorbell keys "
                "(docs/deployment.md, Redis users)",
                exc,
            )
            raise Empty() from None

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Publish as kombu does, and ring the queue's doorbell in the same round trip."""
        door = door_key(queue)
        batch = kwargs.get("_publish_batch")
        if batch is not None:
            super()._put(queue, message, **kwargs)
            batch.add("lpush", door, 1)
            batch.add("ltrim", door, 0, DOOR_CAP - 1)
            batch.add("pexpire", door, DOOR_TTL_MS)
            for command in self.replicas.commands:  # its reply is the pipeline's to check
                batch.add("execute_command", *command)
            return
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        expires = self._expires.get(queue) if self._expires else None
        waits = self.replicas.commands
        with self.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, dumps(message))
            if expires:
                for pri in self.priority_steps:
                    pipe.pexpire(self._q_for_pri(queue, pri), expires)
            pipe.lpush(door, 1).ltrim(door, 0, DOOR_CAP - 1).pexpire(door, DOOR_TTL_MS)
            for command in waits:  # the message is on a replica before the publish returns
                pipe.execute_command(*command)
            replies = pipe.execute(raise_on_error=False)
        sent, waited = replies[: len(replies) - len(waits)], replies[len(replies) - len(waits) :]
        self.replicas.check(waited)  # a refused WAIT turns it off, and the publish stands
        failed = next((reply for reply in sent if isinstance(reply, Exception)), None)
        if failed is not None:
            raise failed

    def heartbeat_client(self) -> redis.Redis:
        """A client of its own for the heartbeat: the channel's server, short time-outs."""
        params: dict[str, Any] = self._connparams()  # type: ignore[attr-defined]
        seconds = min(max(self.recovery_timing.beat_s, 1.0), 10.0)
        # A beat that hangs must fail before the next is due, and never retry in place.
        params.update(socket_timeout=seconds, retry_on_timeout=False, max_connections=4)
        if "socket_connect_timeout" in params:
            params["socket_connect_timeout"] = seconds
        return redis.Redis(connection_pool=redis.ConnectionPool(**params))


def _recorded_tag(payload: Any) -> str | None:
    """The delivery tag the fetch script recorded ``payload`` under (None: it did not)."""
    try:
        properties = payload["properties"]
        tag, info = properties["delivery_tag"], properties["delivery_info"]
    except (KeyError, TypeError):
        return None
    return tag if isinstance(tag, str) and isinstance(info, dict) else None


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with liveness-bounded recovery (see the module docstring)."""

    Channel = Channel
    # Batch publishing is kombu's to decide (its ``supports_batch_publish``, channel and
    # transport): none when the connection retries a command, since a pipeline sent
    # again publishes each of its messages twice.


class SocketTransport(Transport):
    """The same transport on a Unix socket (the embedded default's server): the URL
    ``socket:///path`` is kept whole, and kombu's channel connects to that path."""

    can_parse_url = True


def _deliver_as_taken(payload: Any, queue: str) -> None:
    """Deliver a skill queue's message under the queue it was taken from: its own
    ``delivery_info`` is the sender's word, and a write that names a write queue while
    pushed onto a read queue must not pass for one (``tasks/queue_gate.py``)."""
    routing = skill_routing(queue)
    properties = payload.get("properties") if isinstance(payload, dict) else None
    if not routing or not isinstance(properties, dict):
        return
    info = properties.get("delivery_info")
    if not isinstance(info, dict):
        info = properties["delivery_info"] = {}
    info["exchange"] = info["routing_key"] = routing
