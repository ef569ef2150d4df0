"""The Celery entry point of a checkout: ``celery -A worker worker`` starts a skill worker.

The application lives in the package (``cleveragents.worker``); an installed
wheel starts it with ``cleveragents worker`` or ``celery -A cleveragents.worker worker``.
"""

from __future__ import annotations

from cleveragents.worker import app

__all__ = ["app"]
