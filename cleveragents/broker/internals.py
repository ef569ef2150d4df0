"""Every private member of Celery and kombu the project uses, and the versions it fits.

``INTERNALS`` is the table: each private member this project overrides, patches,
copies or reads, where, and the upstream code or issue it works around (so the
day it can go is visible). Members are grouped into ``PARTS``, each written and
tested for one release series of its distribution, with what happens outside it:

* ``fallback``: the project's part steps aside and the library's own behaviour
  runs, said in one warning line (kombu's stock Redis transport: the visibility
  timeout is raised past the longest a live worker holds a message, and a dead
  worker's messages come back only after it, not within seconds);
* ``refuse``: no safe fallback exists (the result backend that never stores over
  a success, remote control's guard): a worker does not start, a producer is
  not built, in one line that names the fix.

Copied upstream code is recorded with a digest of the upstream source it was
copied from; tests/broker/test_internals.py fails once the installed library's
source differs, and ``scripts/check-upgrades`` runs those tests against the
newest releases. Nothing here runs at import: ``check`` reads the installed
versions (each module's ``__version__``) when a worker or a producer starts.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from cleveragents.errors import ConfigurationError

__all__ = [
    "INTERNALS",
    "PARTS",
    "Internal",
    "InternalsRefused",
    "Part",
    "Verdict",
    "check",
    "fits",
    "fix",
    "installed_version",
]

log = logging.getLogger("cleveragents.internals")

#: The ``{name}`` fields of a consequence.
_FIELDS = re.compile(r"\{(\w+)\}")

KOMBU_SRC = "https://github.com/celery/kombu/blob/v5.7.0/kombu"
CELERY_SRC = "https://github.com/celery/celery/blob/v5.7.0/celery"


class InternalsRefused(ConfigurationError):
    """Raised when a part without a safe fallback does not fit the installed library."""


@dataclass(frozen=True)
class Part:
    """A part of the project built on private members of one distribution's series."""

    name: str
    distribution: Literal["celery", "kombu"]
    #: The release series (major.minor) it was written and tested for.
    series: str
    #: Outside that series: step aside for the library's own code, or refuse.
    outside: Literal["fallback", "refuse"]
    #: What runs instead and what is lost (fallback), or what would break (refuse);
    #: ``{name}`` is a value in force, given to ``check`` (``celery_settings.fallback_facts``).
    consequence: str
    #: Who checks it: a worker, a producer (``SkillClient``), or both.
    checked_by: frozenset[str] = frozenset({"worker"})
    #: The broker it serves: every one, or only a Redis (the embedded default's too).
    broker: Literal["any", "redis"] = "any"


@dataclass(frozen=True)
class Internal:
    """One private member: ``module:Class.member`` (or ``module:member``), and its use."""

    member: str
    use: Literal["override", "copy", "patch", "read"]
    #: The project module that uses it.
    where: str
    #: A key of ``PARTS``.
    part: str
    #: The upstream code (or issue) it builds on or works around.
    upstream: str
    #: An attribute set in ``__init__`` (found in the class's source, not on the class).
    instance: bool = False
    #: ``copy`` only: sha256 (first 16 hex) of the upstream source it was copied from.
    copied_digest: str = ""


_REDIS_TRANSPORT = "cleveragents.broker.redis.transport"
_K_REDIS = "kombu.transport.redis"
_K_REDIS_SRC = f"{KOMBU_SRC}/transport/redis.py"

#: Parts no start-up check reads: each patch checks itself as it is applied.
_APPLIED: frozenset[str] = frozenset()

PARTS: dict[str, Part] = {
    part.name: part
    for part in (
        Part(
            "redis-transport",
            "kombu",
            "5.7",
            "fallback",
            "kombu's own Redis transport runs instead: it hands out again every message "
            "held past the visibility timeout, a live worker's too, so {visibility_timeout}; "
            "a dead worker's messages come back only after that timeout, not within "
            "CLEVERAGENTS_RECOVERY_S, and a message cut in flight can be lost",
            frozenset({"worker", "producer"}),
            "redis",
        ),
        Part(
            "queue-search",
            "kombu",
            "5.7",
            "fallback",
            "`cleveragents result` of an id with no result cannot tell a waiting "
            "invocation from one never sent (it says it cannot tell)",
            frozenset({"producer"}),
            "redis",
        ),
        # The patches check themselves as a worker applies them (broker/patches).
        Part(
            "redis-connparams-patch",
            "kombu",
            "5.7",
            "fallback",
            "a worker that loses Redis while a tool runs exits instead of reconnecting",
            _APPLIED,
        ),
        Part(
            "success-log-patch",
            "celery",
            "5.7",
            "refuse",
            "every successful invocation's output is written to the worker log",
            _APPLIED,
        ),
        Part(
            "hard-limit-pauses-patch",
            "celery",
            "5.7",
            "fallback",
            "a worker paused (SIGSTOP, a frozen container) past a task's hard time limit "
            "ends that task's pool process when it resumes, and its tool is reported as "
            "timed out",
            _APPLIED,
        ),
        Part(
            "result-repr-patch",
            "celery",
            "5.7",
            "fallback",
            "each successful invocation's return value is written out by Celery's "
            "slower saferepr (about 90 us of the pool's CPU each)",
            _APPLIED,
        ),
        Part(
            "result-backend",
            "celery",
            "5.7",
            "refuse",
            "a late or repeated delivery could store over a finished result",
        ),
        Part(
            "consumer",
            "celery",
            "5.7",
            "refuse",
            "remote control could run unguarded, and a bad message's producer could "
            "wait for ever",
        ),
        Part(
            "task-request",
            "celery",
            "5.7",
            "refuse",
            "Flower and `celery inspect` could show argument values",
        ),
        Part(
            "time-limits",
            "celery",
            "5.7",
            "refuse",
            "a tool stopped by the hard time limit could leave no result",
        ),
        Part(
            "client",
            "celery",
            "5.7",
            "refuse",
            "a request id sent again could be answered with an earlier run's result",
            frozenset({"producer"}),
        ),
    )
}

def _uses(part: str, where: str, upstream: str, *entries: tuple[str, str]) -> list[Internal]:
    """Entries of one part used in one module: (member, use) pairs; "+" marks an attribute
    set in ``__init__``, "copy:<digest>" a copied body."""
    found = []
    for member, use in entries:
        kind, _, digest = use.partition(":")
        found.append(
            Internal(
                member=member.removesuffix("+"),
                use=kind,  # type: ignore[arg-type]
                where=where,
                part=part,
                upstream=upstream,
                instance=member.endswith("+"),
                copied_digest=digest,
            )
        )
    return found


INTERNALS: tuple[Internal, ...] = (
    # kombu's Redis transport, recovery bounded by liveness (broker/redis/transport.py).
    *_uses(
        "redis-transport",
        _REDIS_TRANSPORT,
        _K_REDIS_SRC,
        (f"{_K_REDIS}:QoS.append", "override"),
        (f"{_K_REDIS}:QoS._remove_from_indices", "override"),
        (f"{_K_REDIS}:QoS.restore_unacked_once", "override"),
        (f"{_K_REDIS}:QoS.restore_visible", "override"),
        (f"{_K_REDIS}:QoS.restore_by_tag", "override"),
        (f"{_K_REDIS}:QoS._delivered+", "read"),
        (f"{_K_REDIS}:Channel.conn_or_acquire", "copy:25883caca6c4121e"),
        (f"{_K_REDIS}:Channel._brpop_start", "override"),
        # Its finally block calls _flush_brpop_reauth, new in kombu 5.7.
        (f"{_K_REDIS}:Channel._brpop_read", "copy:c42518699709f2df"),
        (f"{_K_REDIS}:Channel._put", "copy:1c0cf9749576614c"),
        # A closed fanout subscription is a lost connection, not a read that blocks.
        (f"{_K_REDIS}:Channel._receive_one", "override"),
        (f"{_K_REDIS}:Channel._closing", "read"),
        # A skill queue's message goes back to the queue it was taken from (round 4).
        (f"{_K_REDIS}:Channel._do_restore_message", "override"),
        ("kombu.transport.virtual.base:Channel._lookup", "override"),
        (f"{_K_REDIS}:Channel._flush_brpop_reauth", "read"),
        (f"{_K_REDIS}:Channel._q_for_pri", "read"),
        (f"{_K_REDIS}:Channel._get_message_priority", "read"),
        (f"{_K_REDIS}:Channel._connparams", "read"),
        (f"{_K_REDIS}:Channel._create_client", "read"),
        (f"{_K_REDIS}:Channel.async_pool", "read"),
        (f"{_K_REDIS}:Channel._queue_cycle+", "read"),
        (f"{_K_REDIS}:Channel._in_poll+", "read"),
        (f"{_K_REDIS}:Channel._expires+", "read"),
        (f"{_K_REDIS}:Channel.unacked_key", "read"),
        (f"{_K_REDIS}:Channel.unacked_index_key", "read"),
        ("kombu.transport.virtual.base:Transport._deliver", "read"),
    ),
    # The same on Redis Sentinel: kombu's Sentinel channel under it (broker/redis/sentinel.py).
    *_uses(
        "redis-transport",
        "cleveragents.broker.redis.sentinel",
        _K_REDIS_SRC,
        # Its pool's connections follow a failover at once (broker/redis/sentinel_follow.py).
        (f"{_K_REDIS}:SentinelChannel._sentinel_managed_pool", "override"),
        (f"{_K_REDIS}:SentinelChannel._get_pool", "read"),
        (f"{_K_REDIS}:SentinelChannel.from_transport_options", "read"),
        (f"{_K_REDIS}:SentinelChannel.connection_class", "read"),
        (f"{_K_REDIS}:Channel._connparams", "read"),
    ),
    # kombu's unacked hash, read (never taken) to find a waiting id.
    *_uses(
        "queue-search",
        "cleveragents.broker.queue_search",
        _K_REDIS_SRC,
        (f"{_K_REDIS}:Channel.unacked_key", "read"),
    ),
    # kombu turns a lost connection mid-task into an AttributeError the worker dies of.
    *_uses(
        "redis-connparams-patch",
        "cleveragents.broker.patches.kombu_connparams",
        _K_REDIS_SRC,
        (f"{_K_REDIS}:Channel._connparams", "patch"),
    ),
    # Celery's Redis result backend: one round trip a state, never over a success.
    *_uses(
        "result-backend",
        "cleveragents.broker.redis.result_backend",
        f"{CELERY_SRC}/backends/base.py",
        ("celery.backends.redis:RedisBackend._store_result", "override"),
        ("celery.backends.redis:RedisBackend._get_result_meta", "read"),
        ("celery.backends.redis:RedisBackend.ensure", "override"),
        ("celery.backends.redis:RedisBackend.on_connection_error", "override"),
        # On Sentinel, its pool's connections follow a failover at once (sentinel_follow.py).
        ("celery.backends.redis:SentinelBackend._get_pool", "override"),
    ),
    # The consumer: its steps by name (remote control guarded) and its message handling.
    *_uses(
        "consumer",
        "cleveragents.worker.consumer",
        f"{CELERY_SRC}/worker/consumer/consumer.py",
        ("celery.worker.consumer.consumer:Consumer.Blueprint.default_steps", "read"),
        ("celery.worker.consumer.consumer:Consumer.create_task_handler", "override"),
        ("celery.worker.consumer.consumer:Consumer.on_send_event_buffered", "override"),
        ("celery.worker.consumer.consumer:Consumer._flush_events", "read"),
        # Its call of conn.ensure_connection, given quicker intervals (RECONNECT_INTERVALS).
        ("celery.worker.consumer.consumer:Consumer.ensure_connected", "override"),
        ("celery.worker.consumer.mingle:Mingle.__init__", "read"),  # its without_mingle
        ("celery.worker.consumer.gossip:Gossip.__init__", "read"),  # its without_gossip
    ),
    *_uses(
        "consumer",
        "cleveragents.worker.reconnect_log",
        f"{CELERY_SRC}/worker/consumer/consumer.py",
        ("celery.worker.consumer.consumer:CONNECTION_RETRY", "read"),
        ("celery.worker.consumer.consumer:CONNECTION_ERROR", "read"),
    ),
    *_uses(
        "consumer",
        "cleveragents.worker.remote_control",
        f"{CELERY_SRC}/worker/consumer/control.py",
        ("celery.worker.consumer.control:Control", "override"),
    ),
    # The heartbeat, whose send Celery retries for ever (celery/celery#4804).
    *_uses(
        "consumer",
        "cleveragents.worker.heartbeat",
        f"{CELERY_SRC}/worker/consumer/heart.py",
        ("celery.worker.consumer.heart:Heart", "override"),
        ("celery.worker.consumer.heart:Heart.heartbeat_interval+", "read"),
        ("celery.worker.heartbeat:Heart._send", "read"),
        ("celery.events.dispatcher:EventDispatcher._outbound_buffer+", "read"),
    ),
    # The worker-side request whose argument text is redacted, built from the body.
    *_uses(
        "task-request",
        "cleveragents.tasks.task_request",
        f"{CELERY_SRC}/worker/request.py",
        ("celery.worker.request:Request._argsrepr+", "read"),
        ("celery.worker.request:Request._kwargsrepr+", "read"),
        ("celery.worker.request:Request._body+", "read"),
        ("celery.worker.request:Request._decoded+", "read"),
        ("celery.worker.request:Request.send_event", "override"),
        ("celery.worker.request:Request._request_dict+", "read"),
    ),
    # The hard time limit's answer.
    *_uses(
        "time-limits",
        "cleveragents.worker.time_limits",
        f"{CELERY_SRC}/worker/request.py",
        ("celery.worker.request:Request.on_timeout", "override"),
        ("celery.worker.request:Request.on_failure", "override"),
    ),
    # Celery's tracer: the success log line and the result's text.
    *_uses(
        "success-log-patch",
        "cleveragents.broker.patches.success_log",
        f"{CELERY_SRC}/app/trace.py",
        ("celery.app.trace:LOG_SUCCESS", "patch"),
    ),
    # The pool's hard time limit, moved on by the worker's pauses.
    *_uses(
        "hard-limit-pauses-patch",
        "cleveragents.broker.patches.hard_limit_pauses",
        f"{CELERY_SRC}/concurrency/asynpool.py",
        ("celery.concurrency.asynpool:AsynPool._on_hard_timeout", "patch"),
        ("celery.concurrency.asynpool:AsynPool._cache+", "read"),
        ("celery.concurrency.asynpool:AsynPool._tref_for_id+", "read"),
        ("billiard.pool:ApplyResult._time_accepted+", "read"),
    ),
    *_uses(
        "result-repr-patch",
        "cleveragents.broker.patches.result_repr",
        f"{CELERY_SRC}/app/trace.py",
        ("celery.app.trace:saferepr", "patch"),
    ),
    # The producer: what it closes, and late notifications it forgets.
    *_uses(
        "client",
        "cleveragents.client",
        f"{CELERY_SRC}/backends/asynchronous.py",
        ("celery.app.base:Celery._backend+", "read"),
        ("celery.backends.asynchronous:AsyncBackendMixin._pending_messages+", "read"),
    ),
)


def installed_version(distribution: str) -> str:
    """The installed version of ``celery`` or ``kombu``, as its module says."""
    return str(importlib.import_module(distribution).__version__)


def _series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def fits(part: str) -> bool:
    """True when the installed library is of the series ``part`` was written for."""
    spec = PARTS[part]
    return _series(installed_version(spec.distribution)) == spec.series


@dataclass(frozen=True)
class Verdict:
    """What a process does with the installed versions: parts it steps aside for, and why."""

    #: Parts that fall back to the library's own behaviour.
    fallbacks: frozenset[str]
    #: One warning line per fallback.
    warnings: tuple[str, ...]


def _line(part: Part) -> str:
    installed = installed_version(part.distribution)
    return (
        f"cleveragents' {part.name} was written for {part.distribution} {part.series}.x "
        f"and {installed} is installed"
    )


def check(
    role: Literal["worker", "producer"],
    broker: Literal["redis", "other"],
    facts: Mapping[str, str] | None = None,
) -> Verdict:
    """Compare the installed versions with the table, for a worker or a producer.

    Only the parts that serve ``broker`` count (a Redis broker's transport means
    nothing to a RabbitMQ deployment). ``facts`` are the values in force that a
    consequence names (``celery_settings.fallback_facts``).

    Raises:
        InternalsRefused: a part without a safe fallback does not fit.
    """
    fallbacks: set[str] = set()
    warnings: list[str] = []
    for part in PARTS.values():
        if role not in part.checked_by or part.broker not in ("any", broker):
            continue
        if fits(part.name):
            continue
        if part.outside == "refuse":
            why = f"{_line(part)}: without it {part.consequence}"
            raise InternalsRefused(f"{why}. {fix(part.name)}")
        fallbacks.add(part.name)
        warnings.append(f"{_line(part)}: {_worded(part.consequence, facts or {})}")
    return Verdict(frozenset(fallbacks), tuple(warnings))


def _worded(consequence: str, facts: Mapping[str, str]) -> str:
    """``consequence`` with the values in force; one not given is named as unknown."""
    return consequence.format_map(
        {name: facts.get(name, f"the {name.replace('_', ' ')} configured applies")
         for name in _FIELDS.findall(consequence)}
    )  # fmt: skip


def fix(part: str) -> str:
    """The line that names the fix: install the series ``part`` was written for."""
    spec = PARTS[part]
    return (
        f"fix: pip install '{spec.distribution}>={spec.series},<{_next(spec.series)}' "
        "(the versions cleveragents is tested with)"
    )


def _next(series: str) -> str:
    major, minor = series.split(".")
    return f"{major}.{int(minor) + 1}"
