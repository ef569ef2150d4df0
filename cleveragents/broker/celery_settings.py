"""The Celery settings of a ``Settings`` (SPEC section 7), each commented with why.

``celery_settings`` is pure: it creates no folder and changes no global. The worker
app applies it through ``celeryconfig``; a producer's ``SkillClient`` applies it to
its own app. The embedded default's server it names is started by
``embedded.server.join_server``, called by the client and the worker before they connect.
"""

from __future__ import annotations

import ssl
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from celery.app.backends import BACKEND_ALIASES
from kombu import Exchange, Queue
from kombu.transport import TRANSPORT_ALIASES

from cleveragents.broker.internals import fits
from cleveragents.broker.rabbitmq import heartbeat_s, skill_queue, uses_amqp
from cleveragents.broker.rabbitmq import transport_options as amqp_transport_options
from cleveragents.broker.redis.liveness import RecoveryKeys, RecoveryTiming
from cleveragents.broker.redis.result_backend import reader_result_backend
from cleveragents.broker.redis.sentinel_follow import sentinel_kwargs
from cleveragents.broker.signing import DIGEST, SIGNED_SERIALIZER
from cleveragents.broker.url_tls import amqps_tls, sentinel_tls
from cleveragents.constants import (
    HARD_LIMIT_GRACE_S,
    MAX_LIMIT_WAIT_S,
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
)
from cleveragents.embedded.urls import HomeUrls
from cleveragents.errors import ConfigurationError
from cleveragents.pipeline.guard import CLAIM_GRACE_S
from cleveragents.settings import (
    BACKEND_FORMS,
    BROKER_FORMS,
    SENTINEL_SCHEMES,
    MessageSigning,
    Settings,
    shown_url,
)
from cleveragents.skills.policies import LONGEST_RETRY_DELAY_S
from cleveragents.stores.redis_sockets import keepalive_options

__all__ = [
    "HEALTH_CHECK_S",
    "REDIS_SOCKET_TIMEOUT_S",
    "REDIS_TRANSPORT",
    "SENTINEL_TRANSPORT",
    "SOCKET_TRANSPORT",
    "STOCK_VISIBILITY_MARGIN_S",
    "broker_of",
    "celery_settings",
    "consumer_transport",
    "fallback_facts",
    "keepalive_options",
    "longest_hold_s",
    "needs_server",
    "redis_url",
    "uses_redis",
    "visibility_timeout_s",
]

#: The Redis broker's kombu transport (recovery bounded by liveness), by class path.
REDIS_TRANSPORT = "cleveragents.broker.redis.transport:Transport"
#: The same on a Unix socket: the embedded default's server.
SOCKET_TRANSPORT = "cleveragents.broker.redis.transport:SocketTransport"
#: The same on Redis Sentinel (``sentinel://`` brokers), by class path.
SENTINEL_TRANSPORT = "cleveragents.broker.redis.sentinel:SentinelTransport"
#: Broker URL schemes they serve (the embedded default is told apart by its settings).
REDIS_TRANSPORT_SCHEMES = ("redis", "rediss", *SENTINEL_SCHEMES)
#: URL schemes of kombu's Redis transport.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+socket://", "socket://")
#: kombu's and redis-py's health checks of Redis connections, in seconds
#: (``_redis_transport_options``).
HEALTH_CHECK_S = 3
#: A Redis command with no reply for this long has lost its connection (no command
#: the fleet sends blocks longer: an idle consumer's wait is ``fetch.WAIT_S``).
REDIS_SOCKET_TIMEOUT_S = 10.0
#: Under kombu's own Redis transport, how far past a live worker's longest hold of a
#: message the visibility timeout is set (and what covers a chunk's pacing, under 1 s).
STOCK_VISIBILITY_MARGIN_S = 300.0


def celery_settings(settings: Settings, *, producer: bool = False) -> dict[str, Any]:
    """The Celery settings for ``settings``, as a dict of lower-case Celery names.

    ``producer``: for a ``SkillClient``'s app, which only publishes and reads results.
    """
    embedded = settings.embedded
    transport = _embedded(settings, producer) if embedded else _server(settings, producer)
    return {**_common(settings), **transport}


def _embedded(settings: Settings, producer: bool) -> dict[str, Any]:
    # The home's private server (cleveragents/embedded/server.py), on its Unix socket:
    # the fleet's own settings, transport and stores, with the socket for a host.
    urls = HomeUrls.of(settings.home)
    own = consumer_transport(settings)
    return {
        # kombu's URL for a socket, kept whole for our transport ("socket://"), or
        # its own transport's form outside kombu's series (broker/internals.py).
        "broker_url": urls.broker if own else urls.kombu_broker,
        **({"broker_transport": own} if own else {}),
        "result_backend": settings.result_backend or urls.backend,
        **_redis(settings, producer),
        # No TCP keepalive on a Unix socket (Celery would pass it to redis-py's socket
        # connection, which refuses it).
        "redis_socket_keepalive": False,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
    }


def uses_redis(settings: Settings) -> bool:
    """True when the broker is a Redis (the embedded default's server is one)."""
    return settings.embedded or (settings.broker_url or "").startswith(REDIS_SCHEMES)


def needs_server(settings: Settings) -> bool:
    """True when the settings use the home's embedded server: no broker configured, or
    another broker than Redis (RabbitMQ) and no result backend (one machine)."""
    if settings.embedded:
        return True
    on_redis = uses_redis(settings) or _scheme(settings.broker_url) in SENTINEL_SCHEMES
    return settings.result_backend is None and not on_redis


def redis_url(settings: Settings) -> str | None:
    """The broker's Redis as redis-py names it (None: the broker is not a Redis)."""
    if settings.embedded:
        return HomeUrls.of(settings.home).client
    return settings.broker_url if uses_redis(settings) else None


def _known_schemes(settings: Settings) -> None:
    """Refuse, in one line, a URL scheme no kombu transport or Celery backend speaks
    (``http://`` was ``KeyError: 'No such transport: http'``)."""
    checks = (
        ("CLEVERAGENTS_BROKER_URL", settings.broker_url, set(TRANSPORT_ALIASES), BROKER_FORMS),
        ("CLEVERAGENTS_RESULT_BACKEND", settings.result_backend, set(BACKEND_ALIASES),
         BACKEND_FORMS),
    )
    for name, url, known, forms in checks:
        scheme = (url or "").partition("://")[0]
        if url and scheme.split("+")[0] not in known:
            what = "broker" if name.endswith("BROKER_URL") else "result backend"
            raise ConfigurationError(
                f"{name}={shown_url(url)}: no {what} speaks {scheme}://; it takes the form "
                f"{forms}"
            )


def _server(settings: Settings, producer: bool) -> dict[str, Any]:
    _known_schemes(settings)
    # An amqps:// or sentinel:// URL's TLS parameters are Celery's settings (broker/url_tls.py).
    broker_url, tls = amqps_tls(settings.broker_url or "")
    broker_url, sentinel_options = sentinel_tls(broker_url, "CLEVERAGENTS_BROKER_URL")
    tls = tls or sentinel_options
    backend, backend_tls = sentinel_tls(
        settings.result_backend or _default_backend(settings), "CLEVERAGENTS_RESULT_BACKEND"
    )
    return {
        "broker_url": broker_url,
        **({"broker_use_ssl": tls} if tls else {}),
        "result_backend": reader_result_backend(backend),
        **({"redis_backend_use_ssl": backend_tls} if backend_tls else {}),
        **_backend_options(settings, backend, backend_tls),
        **(_amqp(settings) if uses_amqp(settings) else _redis(settings, producer, tls)),
        # Flower and `celery events` show every invocation: events on, and a
        # "sent" event so a waiting invocation is visible before a worker takes it.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
    }


def _default_backend(settings: Settings) -> str:
    # Results go to the broker's Redis; with another broker (RabbitMQ) and no backend
    # configured, to the home's embedded server (one machine), as SPEC section 7 says.
    if uses_redis(settings) or _scheme(settings.broker_url) in SENTINEL_SCHEMES:
        return settings.broker_url or ""
    return HomeUrls.of(settings.home).backend


def _scheme(url: str | None) -> str:
    return (url or "").partition("://")[0].lower()


def _backend_options(settings: Settings, backend: str, tls: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    # A sentinel:// result backend (Celery's SentinelBackend) finds its primary under
    # CLEVERAGENTS_SENTINEL_MASTER; every store uses its client (stores/factory.py), so
    # they follow the primary with it.
    if _scheme(backend) in SENTINEL_SCHEMES:  # short time-outs on the Sentinels, and TLS
        options.update(master_name=settings.sentinel_master, sentinel_kwargs=sentinel_kwargs(tls))
    # A worker's result is stored once a replica has it (broker/redis/result_backend.py).
    if settings.replica_wait_ms:
        options["replica_wait_ms"] = settings.replica_wait_ms
    return {"result_backend_transport_options": options} if options else {}


def _amqp(settings: Settings) -> dict[str, Any]:
    return {
        # RabbitMQ (cleveragents/broker/rabbitmq.py): publisher confirms. The skill queues are
        # quorum queues (_queues); Celery sees that and gives each consumer its own
        # prefetch (quorum queues refuse a channel-wide one), so with prefetch 1 a
        # worker holds at most `concurrency` messages of each queue it consumes.
        "broker_transport_options": amqp_transport_options(),
        # A worker that stops answering (a lost machine, no FIN or RST) is given up by
        # RabbitMQ 2 to 3 heartbeats after its last word, and its messages handed to
        # the other workers at once: within CLEVERAGENTS_RECOVERY_S, as on Redis.
        "broker_heartbeat": heartbeat_s(settings.recovery_s),
    }


def _redis(settings: Settings, producer: bool, tls: dict[str, Any] | None = None) -> dict[str, Any]:
    options = {"broker_transport_options": _redis_transport_options(settings, producer)}
    url = settings.broker_url or ""
    scheme = url.partition("://")[0].lower()
    if scheme in SENTINEL_SCHEMES:  # kombu's Sentinel channel finds the primary by name
        # (``tls``: the URL's TLS options, for the Sentinels as for the servers)
        options["broker_transport_options"].update(
            master_name=settings.sentinel_master, sentinel_kwargs=sentinel_kwargs(tls)
        )
    if scheme not in REDIS_TRANSPORT_SCHEMES:
        return options
    # The transport that hands a dead worker's messages out again is a consumer's
    # only (consumer_transport): producers, Flower and `celery inspect` keep kombu's
    # own, whose URL scheme Flower's broker pages understand.
    return {**options, **_rediss_default(url)}


def consumer_transport(settings: Settings) -> str | None:
    """The transport a worker consumes with, by class path (None: the URL's own).

    For redis:// and rediss://, kombu's Redis transport with a dead worker's messages
    handed out again within CLEVERAGENTS_RECOVERY_S (cleveragents/broker/redis/transport.py),
    set by the worker at start (cleveragents/worker/startup.py); kombu's table of aliases stays
    as shipped.
    """
    if broker_of(settings) != "redis" or not fits("redis-transport"):
        return None  # outside its kombu series: kombu's own (broker/internals.py)
    if settings.embedded:
        return SOCKET_TRANSPORT
    if _scheme(settings.broker_url) in SENTINEL_SCHEMES:
        return SENTINEL_TRANSPORT
    return REDIS_TRANSPORT


def longest_hold_s(settings: Settings) -> float:
    """The longest a live worker holds a message before it acknowledges it.

    A message sent back with a delay (a retry, a wait for a limit) is held until its
    ETA; then its task runs at most to its hard time limit (``worker/time_limits.py``):
    the largest timeout, a write's wait for an earlier delivery's claim, the grace.
    """
    waits_s = max(LONGEST_RETRY_DELAY_S, MAX_LIMIT_WAIT_S)
    return waits_s + settings.max_timeout_s + CLAIM_GRACE_S + HARD_LIMIT_GRACE_S


def visibility_timeout_s(settings: Settings) -> float:
    """The visibility timeout in force on a Redis broker, in seconds.

    Our transport never hands out a live worker's message again: the timeout only
    bounds messages nobody holds, and ``CLEVERAGENTS_VISIBILITY_TIMEOUT_S`` is used as
    given. kombu's own (the fallback outside kombu 5.7, ``broker/internals.py``, and a
    ``sentinel://`` broker's) hands out again every message held that long, a live
    worker's too: there it is at least ``longest_hold_s`` plus ``STOCK_VISIBILITY_MARGIN_S``.
    """
    if consumer_transport(settings) is not None:
        return settings.visibility_timeout_s
    return max(settings.visibility_timeout_s, longest_hold_s(settings) + STOCK_VISIBILITY_MARGIN_S)


def fallback_facts(settings: Settings) -> dict[str, str]:
    """The values in force under the fallbacks, as their warnings name them
    (``internals.check``)."""
    in_force, given = visibility_timeout_s(settings), settings.visibility_timeout_s
    if in_force > given:
        why = (
            f", raised from CLEVERAGENTS_VISIBILITY_TIMEOUT_S={given:g} to the longest a live "
            "worker may hold a message (the longest retry delay, then "
            f"CLEVERAGENTS_MAX_TIMEOUT_S={settings.max_timeout_s:g} with its graces) plus "
            f"{STOCK_VISIBILITY_MARGIN_S:g} s"
        )
    else:
        why = " as CLEVERAGENTS_VISIBILITY_TIMEOUT_S sets it, longer than a live worker holds one"
    return {"visibility_timeout": f"the visibility timeout in force is {in_force:.0f} s{why}"}


def broker_of(settings: Settings) -> Literal["redis", "other"]:
    """Which broker the settings name: a Redis (the embedded default's too), or another."""
    if settings.embedded:
        return "redis"
    scheme = (settings.broker_url or "").partition("://")[0].lower()
    return "redis" if scheme in REDIS_TRANSPORT_SCHEMES else "other"


def _rediss_default(url: str) -> dict[str, Any]:
    # kombu gives a rediss:// URL without ssl_* parameters its default TLS options only
    # when the transport is *named* rediss; named by class path, it would connect
    # without TLS. The same default, then (kombu's: certificates are not checked; put
    # ssl_cert_reqs=required in the URL, as Celery's Redis result backend demands).
    if not url.lower().startswith("rediss://"):
        return {}
    if any(name.startswith("ssl_") for name, _ in parse_qsl(urlsplit(url).query)):
        return {}
    return {"broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_NONE}}


def _redis_connection_options() -> dict[str, Any]:
    return {
        # Find dead connections to Redis before a command hangs on them: redis-py pings
        # a connection idle this long before using it, and kombu drops a consumer's
        # wait whose reply is overdue by this long, checked this often (a half-open
        # connection: within 1 + 2 x 3 s; kombu's default 25 s made it 51 s, 10 s 21 s).
        "health_check_interval": HEALTH_CHECK_S,
        "socket_keepalive": True,
        # A lost Redis host's half-open connections dropped within HALF_OPEN_S, not hours
        # (cleveragents/stores/redis_sockets.py).
        "socket_keepalive_options": keepalive_options(),
        "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": 5,
    }


def _redis_transport_options(settings: Settings, producer: bool = False) -> dict[str, Any]:
    # kombu's visibility sweep ran every 1 to 10 s; the reaper of dead holders runs
    # from the same timer, every reap_s, and the sweep keeps its own pace.
    visibility_s = visibility_timeout_s(settings)
    sweep_s = max(1, min(10, int(visibility_s / 5)))
    reap_s = RecoveryTiming.of(settings.recovery_s).reap_s
    tick_s = min(sweep_s, reap_s)
    return {
        # A worker's messages are handed to another worker within this many seconds
        # of its heartbeat stopping (cleveragents/broker/redis/transport.py, docs/guarantees.md).
        "recovery_s": settings.recovery_s,
        # A published message is on a replica before the publish returns
        # (CLEVERAGENTS_REPLICA_WAIT_MS; cleveragents/stores/replication.py).
        "replica_wait_ms": settings.replica_wait_ms,
        # A read-only worker keeps what it holds under its role's own keys, which its
        # Redis user is limited to (cleveragents/broker/redis/liveness.py, RecoveryKeys).
        "recovery_read_only": settings.read_only,
        **RecoveryKeys.of(settings.read_only).kombu_options(),
        # The last resort, for a message no live worker holds: handed to another
        # worker once unacknowledged for this long. A live worker's message is never
        # swept, however long its tool runs; under kombu's own transport (the fallback)
        # it would be, so the timeout there outlasts the longest hold.
        "visibility_timeout": visibility_s,
        **_redis_connection_options(),
        # A worker's commands are sent again once when Redis does not answer in time.
        # A producer's are not: kombu batches a publish into one pipeline only on a
        # connection that never sends one again (a pipeline sent twice publishes every
        # message in it twice), and a publish that fails is Celery's to retry
        # (task_publish_retry) or, out of a failed batch, SkillClient._send_task's.
        "retry_on_timeout": not producer,
        # A producer sends on the connection kombu opened the channel with: one, not two.
        "one_pool": producer,
        # Fetch from the queues in the order the worker consumes them (reads,
        # writes, then batches) instead of round robin: when a process frees
        # up, a waiting interactive invocation goes before the next batch slice.
        "queue_order_strategy": "priority",
        # kombu's timer calls the reaper and the sweep every interval, and the sweep
        # scans every throttle-th call: interval x throttle seconds (10 x 10 by default).
        "unacked_restore_interval": tick_s,
        "unacked_restore_throttle": max(1, round(sweep_s / tick_s)),
        # No message priorities are used: one Redis list per queue instead of
        # kombu's four, so a fetch waits on 4 keys, not 16.
        "priority_steps": [0],
    }


def _common(settings: Settings) -> dict[str, Any]:
    return {
        **_serialization(settings.signing),
        **_delivery(settings),
        **_resilience(),
        # Routing: reads, writes and batches on their own queues (constants.py). A
        # read-only worker consumes no write queue at all.
        "task_default_queue": QUEUE_READ,
        "task_queues": _queues(settings.read_only, quorum=uses_amqp(settings)),
        "task_create_missing_queues": True,
        # Do not store task arguments (they can hold secrets) beside results.
        "result_extended": False,
        # A tool's print() must not end up in the worker log as a warning.
        "worker_redirect_stdouts": False,
        # Undecodable and non-JSON messages get a validation_error result, and their
        # bodies are never logged (cleveragents/worker/consumer.py).
        "worker_consumer": "cleveragents.worker.consumer:SkillConsumer",
        # UTC timestamps everywhere.
        "enable_utc": True,
        "timezone": "UTC",
    }


def _serialization(signing: MessageSigning | None) -> dict[str, Any]:
    plain = {
        # JSON only, never pickle: a producer must not be able to make a worker
        # unpickle (and so run) anything. Results and events are JSON too.
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
    }
    if signing is None:
        return plain
    return {
        **plain,
        # Signed (docs/security.md): Celery's auth serializer signs the JSON body of
        # every task and remote-control message with this process's key, and only
        # messages that a certificate of the store verifies are decoded. Results and
        # events stay plain JSON (above): the result backend is not signed.
        "task_serializer": SIGNED_SERIALIZER,
        "accept_content": [SIGNED_SERIALIZER],
        "security_key": str(signing.key),
        "security_certificate": str(signing.certificate),
        "security_cert_store": signing.cert_store,
        "security_digest": DIGEST,
    }


def _delivery(settings: Settings) -> dict[str, Any]:
    return {
        # A STARTED state tells a producer its invocation is running, not queued.
        "task_track_started": True,
        # Ack after the tool ran, and give the message back if the worker process
        # dies mid-tool, so that no accepted invocation is lost (docs/guarantees.md
        # says how a write-capable tool is kept from running twice).
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # Tools take milliseconds to minutes: a worker process reserves one message
        # at a time, so a long tool never holds short ones hostage in its buffer.
        # Small tools get their throughput from the batch path, many per message.
        "worker_prefetch_multiplier": 1,
        # Results live long enough for a batch to be resumed, then expire.
        "result_expires": settings.result_expires_s,
    }


def _resilience() -> dict[str, Any]:
    return {
        # Keep working through broker and backend hiccups instead of failing tasks:
        # a producer retries a publish for about a minute (a Redis restart), not 0.6 s.
        "task_publish_retry": True,
        "task_publish_retry_policy": {
            "max_retries": 40,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "result_backend_always_retry": True,
        "result_backend_max_retries": 20,
        "redis_backend_health_check_interval": 10,
        "redis_socket_keepalive": True,
        # A result backend's command on a connection whose peer vanished fails after
        # this, not Celery's 120 s (docs/guarantees.md, half-open connections).
        "redis_socket_timeout": REDIS_SOCKET_TIMEOUT_S,
        "redis_socket_connect_timeout": 5,
        "redis_retry_on_timeout": True,
    }


def _queues(read_only: bool, *, quorum: bool = False) -> list[Queue]:
    everything = [QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE]
    if quorum:
        # RabbitMQ: quorum queues with a delivery limit and a dead-letter queue. All four
        # in every process, read-only or not: RabbitMQ refuses a second declaration of a
        # queue with other arguments (Celery would declare a missing one as classic).
        # A read-only worker leaves the write queues at start (cleveragents/worker/consumer.py).
        return [skill_queue(name) for name in everything]
    names = [QUEUE_READ, QUEUE_BATCH] if read_only else everything
    # One direct exchange per queue, named after it: a message goes exactly where sent.
    return [Queue(name, Exchange(name, type="direct"), routing_key=name) for name in names]
