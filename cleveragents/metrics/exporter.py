"""What ``cleveragents metrics`` serves: the workers' counts and the queues, for Prometheus.

``MetricsCollector`` is a ``prometheus_client`` collector: at each scrape it reads the
counts every worker added to the metric store (``cleveragents.metrics.recorder``), the
length of every queue and the age of its oldest waiting message (``QueueGauges``: Redis
lists, or RabbitMQ queues, whose ages cannot be read: ``cleveragents.broker.rabbitmq``),
the oldest approval waiting, and the Redis' memory, and yields them as metric families.
``prometheus_client`` writes the text exposition format (``render``) and serves it over
HTTP (``serve``: its WSGI app and threading server).

The format served is always the classic text format (0.0.4), as before the collector:
an OpenMetrics scrape would show Prometheus the counters' family names without
``_total`` in its metadata. The families carry no ``_created`` series (a custom
collector's families have none), and the registry holds this collector only (no
``process_*`` or ``python_*`` series).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from redis import RedisError

from cleveragents.constants import (
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
    SENT_AT_HEADER,
)
from cleveragents.metrics.recorder import (
    APPROVALS_LABEL,
    BUCKETS,
    DECISIONS_LABEL,
    WAITED_MS_LABEL,
    WAITS_LABEL,
)
from cleveragents.stores import MetricCounts, RedisMetricStore
from cleveragents.stores.approvals_redis import RedisApprovalStore
from cleveragents.stores.redis_capacity import read_memory

__all__ = [
    "QUEUES",
    "MetricsCollector",
    "QueueGauges",
    "RedisQueues",
    "metrics_app",
    "registry",
    "render",
    "serve",
]

#: The queues whose length and oldest age are exported.
QUEUES = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE)
#: The text format served whatever a scraper accepts (see the module's docstring).
_CLASSIC_TEXT = "text/plain; version=0.0.4"
#: The paths that serve the metrics; any other is a 404.
_PATHS = ("/metrics", "/")
#: A scrape that cannot read Redis (or RabbitMQ's queues: a ``ConnectionError`` that
#: names it) is a 503 with the reason, never a partial page that looks whole.
_AWAY = (RedisError, ConnectionError)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class QueueGauges(Protocol):
    """What the broker tells of its queues: one implementation per broker kind."""

    def lengths(self) -> dict[str, int]:
        """Messages waiting in each queue."""
        ...

    def oldest_ages(self, now: float) -> dict[str, float]:
        """Seconds the oldest waiting message of each queue has waited, where it is known."""
        ...


class RedisQueues:
    """The skill queues of kombu's Redis transport: one Redis list each."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    def lengths(self) -> dict[str, int]:
        """``LLEN`` of each queue."""
        return {q: int(self.redis.llen(q)) for q in QUEUES}

    def oldest_ages(self, now: float) -> dict[str, float]:
        """The age of each queue's tail message, from the header its producer set."""
        return {q: _oldest_age(self.redis, q, now) for q in QUEUES}


def _oldest_age(redis: Any, queue: str, now: float) -> float:
    raw = redis.lindex(queue, -1)  # LPUSH in, BRPOP out: the oldest is at the tail
    if raw is None:
        return 0.0
    try:
        sent = float(json.loads(raw)["headers"][SENT_AT_HEADER])
    except (ValueError, KeyError, TypeError):
        return 0.0
    return max(0.0, now - sent)


class MetricsCollector:
    """Every metric of the exporter, read afresh at each scrape.

    ``redis`` holds the invocation counters; ``queues`` reads the broker's queues (by
    default the Redis lists of ``redis``). A queue whose oldest age is not known has
    no age sample: none at all is better than a 0 that looks like an empty queue.
    """

    def __init__(self, redis: Any, queues: QueueGauges | None = None) -> None:
        self.redis = redis
        self.queues = RedisQueues(redis) if queues is None else queues

    def collect(self) -> Iterator[Metric]:
        """The metric families, in the order the exporter has always served them."""
        now = time.time()
        lengths = GaugeMetricFamily(
            "cleveragents_queue_length",
            "Messages waiting in a queue (a batch chunk counts once).",
            labels=["queue"],
        )
        for queue, n in self.queues.lengths().items():
            lengths.add_metric([queue], n)
        yield lengths
        ages = GaugeMetricFamily(
            "cleveragents_queue_oldest_age_seconds",
            "Age of the oldest waiting message.",
            labels=["queue"],
        )
        for queue, age in self.queues.oldest_ages(now).items():
            ages.add_metric([queue], round(age, 3))
        yield ages
        counts = RedisMetricStore(self.redis).totals()
        yield _invocations(counts)
        yield _histogram(counts)
        yield from _waits(counts)
        yield from _approvals(counts, self.redis, now)
        yield from _redis_memory(self.redis)


def registry(redis: Any, queues: QueueGauges | None = None) -> CollectorRegistry:
    """A registry of the exporter's collector alone (no process or platform series)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(MetricsCollector(redis, queues))
    return found


def render(redis: Any, queues: QueueGauges | None = None) -> str:
    """Every metric, in the Prometheus text exposition format (``MetricsCollector``)."""
    return generate_latest(registry(redis, queues)).decode()


def metrics_app(redis: Any, queues: QueueGauges | None = None) -> WsgiApp:
    """``prometheus_client``'s WSGI app of the exporter's registry, on ``/metrics`` and ``/``.

    A scrape that cannot read Redis or RabbitMQ answers 503 with the reason.
    """
    served = make_wsgi_app(registry(redis, queues))

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in _PATHS:
            return _answer(start_response, "404 Not Found", b"Not found: try /metrics\n")
        try:
            return served({**environ, "HTTP_ACCEPT": _CLASSIC_TEXT}, start_response)  # type: ignore[no-any-return]
        except _AWAY as exc:
            reason = f"Redis: {exc}" if isinstance(exc, RedisError) else str(exc)
            return _answer(start_response, "503 Service Unavailable", f"{reason}\n".encode())

    return app


def _answer(start_response: Callable[..., Any], status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [body]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return  # scrapes every few seconds are not worth a log line


def serve(app: WsgiApp, host: str, port: int) -> WSGIServer:
    """A threading HTTP server of ``app`` on ``host:port`` (``serve_forever`` runs it)."""
    return make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)


def _fields(raw: str, arity: int) -> list[str] | None:
    # A field written by another release (fewer labels, other buckets) is skipped.
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != arity:
        return None
    return [str(v) for v in value]


def _redis_memory(redis: Any) -> Iterator[Metric]:
    """The results' Redis: memory used, its maxmemory, whether its policy evicts
    (none when its user may not run INFO)."""
    try:
        memory = read_memory(redis)
    except RedisError:
        return
    yield GaugeMetricFamily(
        "cleveragents_redis_used_memory_bytes",
        "Memory the Redis of results and metrics uses (INFO memory used_memory).",
        value=memory.used_bytes,
    )
    yield GaugeMetricFamily(
        "cleveragents_redis_maxmemory_bytes",
        "Its maxmemory (0: no limit).",
        value=memory.max_bytes,
    )
    evicting = GaugeMetricFamily(
        "cleveragents_redis_evicting",
        "1 when its maxmemory-policy evicts keys (workers refuse it unless "
        "CLEVERAGENTS_ALLOW_EVICTION is set).",
        labels=["policy"],
    )
    evicting.add_metric([memory.policy], int(memory.evicts))
    yield evicting


def _approvals(counts: MetricCounts, redis: Any, now: float) -> Iterator[Metric]:
    """Approvals by outcome, and how long the oldest parked invocation has waited."""
    found: Counter[tuple[str, str, str]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 4)
        if names is not None and names[0] == APPROVALS_LABEL:
            found[(names[1], names[2], names[3])] += int(count)
    yield GaugeMetricFamily(
        "cleveragents_approvals_oldest_waiting_seconds",
        "How long the invocation waiting longest for a person's approval has waited "
        "(0: none waits).",
        value=round(_oldest_parked_s(redis, now), 3),
    )
    if not found:
        return
    approvals = CounterMetricFamily(
        "cleveragents_approvals_total",
        "Invocations parked for approval, and how each ended: approved, rejected, expired.",
        labels=["skill", "tool", "outcome"],
    )
    for labels, count in sorted(found.items()):
        approvals.add_metric(list(labels), count)
    yield approvals
    yield from _decisions(counts)


def _decisions(counts: MetricCounts) -> Iterator[Metric]:
    """People's decisions by the channel they came by (cli, python, mcp, web)."""
    found: Counter[tuple[str, str]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 3)
        if names is not None and names[0] == DECISIONS_LABEL:
            found[(names[1], names[2])] += int(count)
    if not found:
        return
    decisions = CounterMetricFamily(
        "cleveragents_approval_decisions_total",
        "People's decisions about parked invocations, by the channel they came by (cli, "
        "python, mcp, web) and outcome (approved, rejected).",
        labels=["channel", "outcome"],
    )
    for labels, count in sorted(found.items()):
        decisions.add_metric(list(labels), count)
    yield decisions


def _oldest_parked_s(redis: Any, now: float) -> float:
    oldest = RedisApprovalStore(redis, 0).oldest_asked_at()  # both fleets' indexes
    return max(0.0, now - oldest) if oldest is not None else 0.0


def _waits(counts: MetricCounts) -> Iterator[Metric]:
    waits: Counter[tuple[str, str]] = Counter()
    waited_ms: Counter[tuple[str, str]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 3)
        if names is not None and names[0] in (WAITS_LABEL, WAITED_MS_LABEL):
            (waits if names[0] == WAITS_LABEL else waited_ms)[(names[1], names[2])] += int(count)
    if not waits:
        return
    family = CounterMetricFamily(
        "cleveragents_limit_waits_total",
        "Invocations sent back to wait for a tool's limits.",
        labels=["skill", "tool"],
    )
    for labels, count in sorted(waits.items()):
        family.add_metric(list(labels), count)
    yield family
    family = CounterMetricFamily(
        "cleveragents_limit_wait_seconds_total",
        "Time invocations were sent back to wait for a tool's limits.",
        labels=["skill", "tool"],
    )
    for labels, ms in sorted(waited_ms.items()):
        family.add_metric(list(labels), ms / 1000)
    yield family


def _invocations(counts: MetricCounts) -> Metric:
    series: Counter[tuple[str, ...]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 5)
        if names is None:
            old = _fields(field, 4)  # counted before the reason label: reason ""
            names = None if old is None else [*old, ""]
        if names is not None:
            series[tuple(names)] += int(count)
    family = CounterMetricFamily(
        "cleveragents_invocations_total",
        "Finished invocations.",
        labels=["skill", "tool", "outcome", "error_type", "reason"],
    )
    for labels, count in sorted(series.items()):
        family.add_metric(list(labels), count)
    return family


def _histogram(counts: MetricCounts) -> Metric:
    buckets: dict[tuple[str, ...], Counter[str]] = {}
    sums: dict[tuple[str, ...], float] = {}
    for field, total in counts.sums.items():
        names = _fields(field, 3)
        if names is not None:
            sums[tuple(names)] = total
            buckets.setdefault(tuple(names), Counter())
    for field, value in counts.durations.items():
        names = _fields(field, 4)
        if names is not None:
            buckets.setdefault(tuple(names[:3]), Counter())[names[3]] += int(value)
    family = HistogramMetricFamily(
        "cleveragents_invocation_duration_seconds",
        "Time an invocation took in the runtime.",
        labels=["skill", "tool", "outcome"],
    )
    for labels, per_bucket in sorted(buckets.items()):
        running = 0
        cumulative: list[tuple[str, float]] = []
        for bound in [*(str(b) for b in BUCKETS), "+Inf"]:
            running += per_bucket.get(bound, 0)
            cumulative.append((bound, running))
        family.add_metric(list(labels), cumulative, round(sums.get(labels, 0.0), 6))
    return family
