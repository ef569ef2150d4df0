"""Every Celery setting of the skill worker, read from the environment (SPEC section 7).

The app loads this module with ``config_from_object("celeryconfig")``; producers
(``cleveragents.client``) build the same settings with ``settings_for``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cleveragents.constants import QUEUE_BATCH, QUEUE_BATCH_WRITE, QUEUE_READ, QUEUE_WRITE
from cleveragents.settings import Settings

#: Seconds a result stays in the backend (CLEVERAGENTS_RESULT_EXPIRES_S): a week, so a
#: batch can be resumed days later, yet Redis does not grow without bound.
DEFAULT_RESULT_EXPIRES_S = 7 * 24 * 3600
#: URL scheme of the embedded on-disk broker.
EMBEDDED_SCHEME = "cleveragentsfs"


def _embedded_urls(home: Path) -> tuple[str, str, dict[str, Any]]:
    base = home.resolve()
    queue = base / "broker" / "queue"
    control = base / "broker" / "control"
    results = base / "results"
    for folder in (queue, control, results):
        folder.mkdir(parents=True, exist_ok=True)
    options = {
        # One folder in and out: producer and worker are on one machine.
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "control_folder": str(control),
        # 50 ms instead of kombu's 1 s default: round trips of ~50 ms, not ~1 s.
        "polling_interval": 0.05,
    }
    # kombu's filesystem transport with atomic writes (cleveragents/embedded/transport.py).
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES.setdefault(EMBEDDED_SCHEME, "cleveragents.embedded.transport:Transport")
    return f"{EMBEDDED_SCHEME}://", f"file://{results}", options


def settings_for(settings: Settings) -> dict[str, Any]:
    """The Celery settings for ``settings``, as a dict of lower-case Celery names."""
    conf: dict[str, Any] = {}
    if settings.embedded:
        broker, store, transport_options = _embedded_urls(settings.home)
        conf.update(
            broker_url=broker,
            result_backend=settings.result_backend or store,
            broker_transport_options=transport_options,
            # The filesystem transport keeps an event file per event until a monitor
            # reads it, and no Flower watches the embedded default: no events there.
            worker_send_task_events=False,
            task_send_sent_event=False,
            # Broadcast (remote control, mingle, gossip) writes into the control folder
            # of every worker for ever; the embedded default has one local worker.
            worker_enable_remote_control=False,
        )
    else:
        redis_broker = settings.broker_url or ""
        is_redis = redis_broker.startswith(("redis://", "rediss://", "unix://"))
        # Results go to the broker's Redis; with another broker (RabbitMQ) and no backend
        # configured, to the embedded on-disk store (one machine), as SPEC section 7 says.
        backend: str | None = settings.result_backend or (
            redis_broker if is_redis else _embedded_urls(settings.home)[1]
        )
        conf.update(
            broker_url=redis_broker,
            result_backend=backend,
            broker_transport_options={
                # A message not acked within this many seconds is handed to another
                # worker. It bounds recovery after a worker dies (Celery's default is an
                # hour); it must exceed the longest tool run (see docs/guarantees.md).
                "visibility_timeout": settings.visibility_timeout_s,
                # Find dead connections to Redis before a command hangs on them.
                "health_check_interval": 10,
                "socket_keepalive": True,
                "socket_timeout": 30,
                "socket_connect_timeout": 10,
                "retry_on_timeout": True,
                # Fetch from the queues in the order the worker consumes them (reads,
                # writes, then batches) instead of round robin: when a process frees
                # up, a waiting interactive invocation goes before the next batch slice.
                "queue_order_strategy": "priority",
                # kombu sweeps unacknowledged messages back into their queues every
                # interval x throttle seconds (10 x 10 by default): sweep often enough
                # that recovery after a dead worker is bounded by the visibility timeout.
                "unacked_restore_interval": max(1, min(10, int(settings.visibility_timeout_s / 5))),
                "unacked_restore_throttle": 1,
                # No message priorities are used: one Redis list per queue instead of
                # kombu's four, so a fetch waits on 4 keys, not 16.
                "priority_steps": [0],
            },
            # Flower and `celery events` show every invocation: events on, and a
            # "sent" event so a waiting invocation is visible before a worker takes it.
            worker_send_task_events=True,
            task_send_sent_event=True,
        )
    conf.update(
        # JSON only, never pickle: a producer must not be able to make a worker
        # unpickle (and so run) anything. Results and events are JSON too.
        accept_content=["json"],
        result_accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        # A STARTED state tells a producer its invocation is running, not queued.
        task_track_started=True,
        # Ack after the tool ran, and give the message back if the worker process
        # dies mid-tool, so that no accepted invocation is lost (docs/guarantees.md
        # says how a write-capable tool is kept from running twice).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Tools take milliseconds to minutes: a worker process reserves one message
        # at a time, so a long tool never holds short ones hostage in its buffer.
        # Small tools get their throughput from the batch path, many per message.
        worker_prefetch_multiplier=1,
        # Results live long enough for a batch to be resumed, then expire.
        result_expires=settings.result_expires_s,
        # Keep working through broker and backend hiccups instead of failing tasks:
        # a producer retries a publish for about a minute (a Redis restart), not 0.6 s.
        task_publish_retry=True,
        task_publish_retry_policy={
            "max_retries": 40,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        result_backend_always_retry=True,
        result_backend_max_retries=20,
        redis_backend_health_check_interval=10,
        redis_socket_keepalive=True,
        redis_retry_on_timeout=True,
        # Routing: reads, writes and batches on their own queues (constants.py). A
        # read-only worker consumes no write queue at all.
        task_default_queue=QUEUE_READ,
        task_queues=_queues(settings.read_only),
        task_create_missing_queues=True,
        # Do not store task arguments (they can hold secrets) beside results.
        result_extended=False,
        # A tool's print() must not end up in the worker log as a warning.
        worker_redirect_stdouts=False,
        # Undecodable and non-JSON messages get a validation_error result, and their
        # bodies are never logged (worker/consumer.py).
        worker_consumer="worker.consumer:SkillConsumer",
        # UTC timestamps everywhere.
        enable_utc=True,
        timezone="UTC",
    )
    return conf


def _queues(read_only: bool) -> list[Any]:
    from kombu import Exchange, Queue

    names = (
        [QUEUE_READ, QUEUE_BATCH]
        if read_only
        else [QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE]
    )
    # One direct exchange per queue, named after it: a message goes exactly where sent.
    return [Queue(name, Exchange(name, type="direct"), routing_key=name) for name in names]


globals().update(settings_for(Settings.from_env()))
