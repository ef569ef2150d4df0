"""Per-process worker state: the catalogue (loaded once) and the read-only policy."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from cleveragents.guard import Guard, guard_for
from cleveragents.runtime.kinds import load_tool_kinds
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue

__all__ = ["WorkerState", "current", "guard"]

log = logging.getLogger("cleveragents.worker")
_lock = threading.Lock()
_state: WorkerState | None = None


@dataclass(frozen=True)
class WorkerState:
    """What every invocation in this process needs: settings and the resolved catalogue."""

    settings: Settings
    catalogue: Catalogue


_guards: dict[int, Guard] = {}


def guard(backend: Any) -> Guard:
    """The at-most-once guard beside ``backend`` (one per backend, per process)."""
    found = _guards.get(id(backend))
    if found is None:
        settings = current().settings
        found = guard_for(backend, settings.home.resolve(), settings.result_expires_s)
        _guards[id(backend)] = found
    return found


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
