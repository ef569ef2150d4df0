"""Per-process worker state: the catalogue (loaded once), the policy, and the pipeline."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kombu.utils.url import maybe_sanitize_url

from cleveragents.approvals.gate import ApprovalGate
from cleveragents.approvals.model import Resolution
from cleveragents.approvals.webhook import ApprovalWebhook, Flag, shared_flag
from cleveragents.constants import (
    LIMIT_KEY_PREFIX,
    READ_ONLY_LIMIT_KEY_PREFIX,
    STATE_AWAITING_APPROVAL,
)
from cleveragents.metrics.recorder import CLOSE_WAIT_S
from cleveragents.pipeline import Pipeline
from cleveragents.runtime.kinds import load_tool_kinds
from cleveragents.runtime.outcomes import names_of
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue
from cleveragents.stores import RedisGuardStore, open_stores
from cleveragents.stores.key_sweep import KeySweep
from cleveragents.stores.quotas import LimitGate, RedisLimitGate
from cleveragents.stores.redis_capacity import MemoryWatch
from cleveragents.traces.switch import tracing_on
from cleveragents.worker.approval_sweep import ApprovalSweep
from cleveragents.worker.invocation_report import WorkerObserver

__all__ = [
    "WorkerState",
    "close_metrics",
    "current",
    "forget_inherited",
    "pipeline",
    "share_webhook_warning",
    "start_approval_sweep",
    "start_key_sweep",
    "start_metrics",
]

log = logging.getLogger("cleveragents.worker")
_lock = threading.Lock()
_state: WorkerState | None = None
_pipeline: Pipeline | None = None
_observer: WorkerObserver | None = None
#: Whether the approval webhook's warning was given: made in the worker's main process,
#: before the pool forks, so that its processes warn once between them.
_webhook_warned: Flag | None = None


@dataclass(frozen=True)
class WorkerState:
    """What every invocation in this process needs: settings and the resolved catalogue."""

    settings: Settings
    catalogue: Catalogue


def load() -> WorkerState:
    """Load the catalogue from the settings' paths; log every problem, serve the rest.

    Raises:
        ConfigurationError: a module of CLEVERAGENTS_TOOL_KINDS cannot be loaded.
    """
    settings = Settings.from_env()
    load_tool_kinds(settings.tool_kinds)  # before the catalogue: its files may use them
    catalogue = Catalogue.from_paths(*settings.catalogue_paths)
    for problem in catalogue.errors:
        log.error("catalogue problem: %s", problem)
    log.info(
        "catalogue loaded: %d skills from %s; read-only: %s",
        len(catalogue),
        ", ".join(settings.catalogue_paths),
        settings.read_only,
    )
    return WorkerState(settings=settings, catalogue=catalogue)


def current() -> WorkerState:
    """This process's state, loaded on first use."""
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = load()
    return _state


def pipeline(backend: Any) -> Pipeline:
    """This process's invocation pipeline, its stores chosen once beside ``backend``."""
    global _pipeline, _observer
    if _pipeline is None:
        state = current()
        with _lock:
            if _pipeline is None:
                stores = open_stores(state.settings, backend, worker=True)
                _observer = WorkerObserver(stores.metrics, state.catalogue)
                _pipeline = Pipeline.over(
                    state.catalogue,
                    stores,
                    read_only=state.settings.read_only,
                    default_timeout_s=state.settings.default_timeout_s,
                    max_timeout_s=state.settings.max_timeout_s,
                    observe=_observer,
                    limit_gate=_limit_gate(stores, state.settings),
                    on_wait=_observer.waited,
                    approvals=ApprovalGate(
                        stores.approvals,
                        ttl_s=state.settings.approval_ttl_s,
                        for_writes=state.settings.approval_for_writes,
                        on_park=lambda parked: _store_awaiting(backend, parked),
                        on_change=_approval_hooks(_observer, state.settings),
                    ),
                    line_span=_line_span if tracing_on() else None,
                )
    return _pipeline


def _approval_hooks(
    observer: WorkerObserver, settings: Settings
) -> Callable[[Resolution], None]:
    """What the gate tells of each change: the metrics, and the webhook when one is set."""
    if not settings.approval_webhook:
        return observer.approval
    webhook = ApprovalWebhook(
        settings.approval_webhook, settings.approvals_url, warned=_webhook_warned
    )

    def changed(resolution: Resolution) -> None:
        observer.approval(resolution)
        webhook.on_change(resolution)  # queued: the POST never holds this delivery

    return changed


def _line_span(body: Any, request_id: str) -> Any:
    """A batch line's span (``Pipeline.line_span``), in the chunk's trace."""
    from cleveragents.traces import otel  # only where this process traces

    skill, tool = names_of(body)
    return otel.line_span(skill, tool, request_id)


def awaiting_meta(resolution: Resolution) -> dict[str, Any]:
    """What ``cleveragents result`` and ``SkillClient`` read of a parked invocation."""
    record = resolution.record
    return {
        "request_id": record.request_id,
        "skill": record.skill,
        "tool": record.tool,
        "asked_at": record.asked_at,
        "expires_at": record.expires_at,
        "approve": f"cleveragents approvals approve {record.request_id}",
    }


def _store_awaiting(backend: Any, resolution: Resolution) -> None:
    """Store the invocation's state as awaiting approval (over its STARTED)."""
    request_id = resolution.record.request_id
    backend.store_result(request_id, awaiting_meta(resolution), STATE_AWAITING_APPROVAL)


def _limit_gate(stores: Any, settings: Settings) -> LimitGate:
    """Where the fleet's limits are kept: beside the results, in Redis."""
    prefix = READ_ONLY_LIMIT_KEY_PREFIX if settings.read_only else LIMIT_KEY_PREFIX
    return RedisLimitGate(stores.guard.client, settings.recovery_s, prefix)


def share_webhook_warning() -> None:
    """Make the approval webhook's warning one for the whole worker (its main process,
    before the pool forks)."""
    global _webhook_warned
    if _webhook_warned is None and current().settings.approval_webhook:
        _webhook_warned = shared_flag()


def forget_inherited() -> None:
    """Drop a pipeline inherited from the parent (a pool process builds its own)."""
    global _pipeline, _observer
    _pipeline = _observer = None


def start_metrics(backend: Any) -> None:
    """Start every catalogue tool's metric series at zero (the worker's main process, once)."""
    pipeline(backend)
    if _observer is not None:
        _observer.start()


def start_key_sweep(backend: Any) -> bool:
    """Give producers' keys a time to live from this process (the worker's main process,
    once), when the stores are Redis'; True when it started."""
    store = pipeline(backend).guard.store
    if not isinstance(store, RedisGuardStore):
        return False
    KeySweep(store.client, store.ttl).start()
    return True


def start_memory_watch(app: Any) -> bool:
    """Warn before the results' Redis fills (the worker's main process, once); True when
    it started."""
    store = pipeline(app.backend).guard.store
    if not isinstance(store, RedisGuardStore):
        return False
    settings = current().settings
    shown = maybe_sanitize_url(settings.result_backend or settings.broker_url or "")
    MemoryWatch(store.client, shown, settings.result_expires_s).start()
    return True


def start_approval_sweep(app: Any) -> None:
    """Send on parked invocations that expired, or whose decision was not sent (the
    worker's main process, once)."""
    running = pipeline(app.backend)
    gate = running.approvals
    if gate is None:
        return

    def needs(skill: str, tool: str) -> bool:
        found = running.catalogue.policies(skill, tool)
        return found is not None and gate.needs(found.tool)

    read_only = current().settings.read_only
    sweep = ApprovalSweep(
        app, gate.store, gate.ttl_s, read_only=read_only, needs=needs, audit=running.audit
    )
    sweep.start()


def close_metrics(wait_s: float = CLOSE_WAIT_S) -> None:
    """Flush this process's pending metric counts as it exits, waiting at most ``wait_s``."""
    if _observer is not None:
        _observer.close(wait_s)
