"""Worker start-up hooks: prepare folders, apply patches, load the catalogue, announce readiness.

They run in a starting worker only: importing this module (Flower does) connects
them and changes nothing else.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_after_setup,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)

from cleveragents.embedded.folders import create_folders
from cleveragents.errors import ConfigurationError
from cleveragents.logs import JsonFormatter
from cleveragents.settings import Settings
from worker import patches, state

log = logging.getLogger("cleveragents.worker")
#: What the start-up did, as (level, message): logged once Celery has set up logging.
_start_notes: list[tuple[int, str]] = []


@worker_init.connect
def _start_worker(**_: Any) -> None:
    # Before the pool forks, so children inherit all of it. Celery logs and ignores
    # an exception of a signal handler: a worker that cannot run exits instead, in one
    # line (a bad setting, a CLEVERAGENTS_TOOL_KINDS module that cannot load).
    try:
        settings = Settings.from_env()
        _start_notes.extend(patches.apply_all())
        create_folders(settings)  # the embedded broker's and the file result store's
        # Load (and log problems) once in the parent: children inherit the catalogue.
        state.current()
    except ConfigurationError as exc:
        logging.getLogger("cleveragents.worker").critical("cannot start: %s", exc)
        raise SystemExit(2) from None


@celeryd_after_setup.connect
def _log_start(**_: Any) -> None:
    for level, message in _start_notes:
        log.log(level, message)


@worker_process_init.connect
def _load_in_child(**_: Any) -> None:
    state.current()


@worker_process_shutdown.connect
def _close_mcp_sessions(**_: Any) -> None:
    # A pool process leaves by os._exit, so atexit does not run: stop the stdio MCP
    # servers its `source: mcp` tools started (only if it ever used one).
    sessions = sys.modules.get("cleveragents.runtime.mcp_sessions")
    if sessions is not None:
        sessions.close_sessions()


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
