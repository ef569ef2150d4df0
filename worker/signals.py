"""Worker start-up hooks: load the catalogue before serving, announce readiness."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from celery.app import trace
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_init,
    worker_ready,
)

from cleveragents.errors import ConfigurationError
from cleveragents.logs import JsonFormatter
from cleveragents.settings import Settings
from worker import state

# Celery logs a task's return value when it succeeds; ours holds the tool's output,
# which stays out of logs (docs/guarantees.md). The id, name and runtime remain.
trace.LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"


@worker_init.connect
def _load_in_parent(**_: Any) -> None:
    # Load (and log problems) once in the parent, before the pool forks: children
    # inherit the resolved catalogue.
    try:
        state.current()
    except ConfigurationError as exc:
        # A bad setting (a CLEVERAGENTS_TOOL_KINDS module that cannot load) stops the
        # worker at start, in one line; Celery would log it and serve failing tasks.
        logging.getLogger("cleveragents.worker").critical("cannot start: %s", exc)
        raise SystemExit(2) from None


@worker_process_init.connect
def _load_in_child(**_: Any) -> None:
    state.current()


@worker_ready.connect
def _announce_ready(**_: Any) -> None:
    # The embedded runner waits for this file rather than polling a broadcast ping.
    ready_file = os.environ.get("CLEVERAGENTS_READY_FILE")
    if ready_file:
        Path(ready_file).write_text(str(os.getpid()), encoding="utf-8")


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger: logging.Logger, **_: Any) -> None:
    # CLEVERAGENTS_LOG_FORMAT=json (or `cleveragents worker --log-format json`): every
    # line Celery and we write is one JSON object, invocation fields included.
    if Settings.from_env().log_format == "json":
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())
