"""The worker app's Celery settings, read from the environment (SPEC section 7).

The app loads this module with ``config_from_object("cleveragents.worker.celeryconfig")``,
and Celery
reads each setting as an attribute of it. The settings are
``cleveragents.broker.celery_settings.celery_settings`` (every one commented there) of
``Settings.from_env()``, computed on the first read, when a worker (or Flower,
or another ``celery -A worker`` command) loads its configuration: importing this
module reads nothing, creates nothing and cannot fail.
"""

from __future__ import annotations

import functools
from typing import Any

from cleveragents.broker.celery_settings import celery_settings
from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings

__all__ = ["from_env"]


@functools.cache
def from_env() -> dict[str, Any]:
    """The Celery settings of this process's environment (read once)."""
    try:
        return celery_settings(Settings.from_env())
    except ConfigurationError as exc:
        # Celery reads its configuration in the middle of its command line, which
        # would print a traceback: a bad setting is one line and a failed start.
        raise SystemExit(f"error: {exc}") from None


def __getattr__(name: str) -> Any:
    # Called only for names this module does not define: Celery's settings. Dunder
    # look-ups (importlib's __path__, inspect's __wrapped__, ...) read nothing.
    settings = {} if name.startswith("__") else from_env()
    if name in settings:
        return settings[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # Celery lists a configuration module's names with dir().
    return sorted({*globals(), *from_env()})
