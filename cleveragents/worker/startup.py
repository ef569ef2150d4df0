"""Worker start-up hooks: close the process, apply patches, load the catalogue, announce readiness.

They run in a starting worker only: importing this module (Flower does) connects
them and changes nothing else.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_after_setup,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from cleveragents.approvals.webhook import check_webhook_url
from cleveragents.broker import internals, patches
from cleveragents.broker.celery_settings import (
    broker_of,
    consumer_transport,
    fallback_facts,
    needs_server,
)
from cleveragents.broker.redis.result_backend import worker_result_backend
from cleveragents.embedded.server import join_server
from cleveragents.errors import ConfigurationError
from cleveragents.logs import JsonFormatter
from cleveragents.runtime.confined import tool_user_for
from cleveragents.runtime.kinds import command as command_tool
from cleveragents.runtime.output_limit import set_default_output_limit
from cleveragents.runtime.sandbox import Sandboxing
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue
from cleveragents.stores.redis_capacity import EvictingRedis, check_eviction
from cleveragents.worker import reconnect_log, state, time_limits
from cleveragents.worker.consumer import check_steps
from cleveragents.worker.process_privacy import make_undumpable

log = logging.getLogger("cleveragents.worker")
#: What the start-up did, as (level, message): logged once Celery has set up logging.
_start_notes: list[tuple[int, str]] = []


@worker_init.connect
def _start_worker(sender: Any = None, **_: Any) -> None:
    # Before the pool forks, so children inherit all of it. Celery logs and ignores
    # an exception of a signal handler: a worker that cannot run exits instead, in one
    # line (a bad setting, a CLEVERAGENTS_TOOL_KINDS module that cannot load).
    try:
        settings = Settings.from_env()
        # First the versions: private Celery and kombu code runs only on the series it
        # was written for; outside it, the library's own, or no start (broker/internals.py).
        verdict = internals.check("worker", broker_of(settings), fallback_facts(settings))
        _start_notes.extend((logging.WARNING, line) for line in verdict.warnings)
        check_steps()
        check_webhook_url(settings.approval_webhook)  # one line now, not a silent inbox later
        _check_redis_memory(settings, sender.app.conf.result_backend)
        transport = consumer_transport(settings)
        if transport is not None:  # before the consumer connects (celery_settings)
            sender.app.conf.broker_transport = transport
        backend = worker_result_backend(sender.app.conf.result_backend)
        if backend is not None:  # before anything stores a result: one round trip a state
            sender.app.conf.result_backend = backend
        # First: the environment holds the broker's password and every other secret of
        # the worker. Non-dumpable, /proc/<pid>/environ and memory are closed to other
        # processes of this user (a command tool); pool processes inherit it.
        _start_notes.append(make_undumpable())
        _start_notes.extend(patches.apply_all())
        if needs_server(settings):  # the home's embedded server, for the worker's life
            join_server(settings.home)
        warning = command_tool.KIND.run_as(tool_user_for(settings.tool_user))
        if warning:
            _start_notes.append((logging.WARNING, warning))
        command_tool.KIND.sandbox_with(
            Sandboxing(every_tool=settings.sandbox, bwrap=settings.bwrap)
        )
        set_default_output_limit(settings.max_output_bytes)
        time_limits.install(sender.app)
        # Load (and log problems) once in the parent: children inherit the catalogue.
        _check_sandboxes(state.current().catalogue)
        state.share_webhook_warning()
    except (ConfigurationError, EvictingRedis) as exc:
        logging.getLogger("cleveragents.worker").critical("cannot start: %s", exc)
        raise SystemExit(2) from None


def _check_sandboxes(catalogue: Catalogue) -> None:
    # One warning naming the sandboxed tools this worker cannot serve (runtime/sandbox.py);
    # the check is made here once, so pool processes inherit its verdict.
    tools = [tool for name in catalogue.names for tool in catalogue.own_tools(name)]
    kind = command_tool.KIND
    warning = kind.sandboxing.unserved(tools, kind.user)
    if warning:
        _start_notes.append((logging.WARNING, warning))


def _check_redis_memory(settings: Settings, result_backend: Any) -> None:
    # Each Redis the worker uses must not evict keys (stores/redis_capacity.py).
    urls = [
        url
        for url in (settings.broker_url, str(result_backend or ""))
        if url and url.partition("://")[0].lower() in ("redis", "rediss")
    ]
    if urls:
        _start_notes.extend(check_eviction(urls, allow=settings.allow_eviction))


@celeryd_after_setup.connect
def _log_start(**_: Any) -> None:
    for level, message in _start_notes:
        log.log(level, message)


@worker_process_init.connect
def _load_in_child(**_: Any) -> None:
    state.forget_inherited()  # a replacement forked after the parent built its own pipeline
    state.current()


_sigterm_default = [False]
#: How long a pool process given SIGTERM may spend adding its pending metric counts
#: to Redis before it dies: a millisecond or two when Redis is there, but the flusher
#: thread must first be scheduled, and on a loaded two-core machine one pool process
#: of a stopped worker once lost its counts within 1 s (20 of 40 counted). A stop by
#: the hard time limit leaves it 0.1 s whatever this says (SIGKILL follows).
SIGTERM_FLUSH_S = 5.0


@task_prerun.connect
def _die_on_sigterm(**_: Any) -> None:
    # A pool process gets SIGTERM when the hard time limit ends it (SIGKILL follows
    # 0.1 s later), and from a supervisor that signals the worker's whole process group
    # (systemd's default). billiard's handler raises SystemExit inside the running tool,
    # which the python kind would report as the tool's own sys.exit, and the dying
    # process could store that over the time-out. So a pool process simply dies of
    # SIGTERM, raising nothing into the tool, once it has flushed its metric counts.
    # Set here, before its first task: billiard installs its handler after
    # worker_process_init.
    if not _sigterm_default[0]:
        signal.signal(signal.SIGTERM, _flush_and_die)
        _sigterm_default[0] = True


def _flush_and_die(signum: int, _frame: Any) -> None:
    state.close_metrics(SIGTERM_FLUSH_S)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@worker_process_shutdown.connect
def _close_mcp_sessions(**_: Any) -> None:
    # A pool process leaves by os._exit, so atexit does not run: stop the stdio MCP
    # servers its `source: mcp` tools started (only if it ever used one).
    sessions = sys.modules.get("cleveragents.runtime.kinds.mcp_sessions")
    if sessions is not None:
        sessions.close_sessions()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_spans(**_: Any) -> None:
    # A pool process leaves by os._exit: the spans its batch processor holds go now.
    otel = sys.modules.get("cleveragents.traces.otel")
    if otel is not None:
        otel.flush()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_metrics(**_: Any) -> None:
    # A pool process that leaves (warm shutdown, max tasks per child) and the main
    # process (it counts invocations the hard time limit ended) flush what they counted
    # since their last flush; otherwise up to FLUSH_S of invocations would go uncounted.
    state.close_metrics()


def _start_or_warn(what: str, start: Callable[[], object]) -> None:
    """Start one of the worker's background services; a failure is a warning, never fatal."""
    try:
        start()
    except Exception as exc:  # never keeps a worker from serving
        log.warning("could not start %s: %s", what, exc)


@worker_ready.connect
def _start_metrics(sender: Any = None, **_: Any) -> None:
    # Every catalogue tool's series exist, at zero, before its first invocation: a
    # counter that appears at 1 is an increase that increase() and rate() never see.
    # Before the ready file: whoever waits for it finds them.
    _start_or_warn("the metrics at zero", lambda: state.start_metrics(sender.app.backend))


@worker_ready.connect
def _start_key_sweep(sender: Any = None, **_: Any) -> None:
    # Request-id bindings and batch seals a producer made, and no worker has seen,
    # get a time to live (cleveragents/stores/key_sweep.py).
    _start_or_warn(
        "the sweep of producers' keys", lambda: state.start_key_sweep(sender.app.backend)
    )


@worker_ready.connect
def _start_memory_watch(sender: Any = None, **_: Any) -> None:
    # Warns before the results' Redis reaches its maxmemory (stores/redis_capacity.py).
    _start_or_warn("the watch of Redis's memory", lambda: state.start_memory_watch(sender.app))


@worker_ready.connect
def _start_approval_sweep(sender: Any = None, **_: Any) -> None:
    # Parked invocations past their expiry are ended (cleveragents/worker/approval_sweep.py).
    _start_or_warn(
        "the sweep of parked invocations", lambda: state.start_approval_sweep(sender.app)
    )


@worker_ready.connect
def _announce_ready(**_: Any) -> None:
    # The embedded runner waits for this file rather than polling a broadcast ping.
    ready_file = os.environ.get("CLEVERAGENTS_READY_FILE")
    if ready_file:
        Path(ready_file).write_text(str(os.getpid()), encoding="utf-8")


@after_setup_logger.connect
@worker_ready.connect
def _quiet_reconnects(**_: Any) -> None:
    # A broker restart the worker rides out: one warning, one line back (worker/reconnect_log.py).
    # Again when ready: Celery's logging set-up turns its deprecation warnings on after
    # after_setup_logger.
    reconnect_log.install()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger: logging.Logger, **_: Any) -> None:
    # CLEVERAGENTS_LOG_FORMAT=json (or `cleveragents worker --log-format json`): every
    # line Celery and we write is one JSON object, invocation fields included.
    if Settings.from_env().log_format == "json":
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())
