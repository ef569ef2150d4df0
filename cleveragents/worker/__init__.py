"""The Celery application and everything a skill worker does around a task.

``celery -A cleveragents.worker worker`` (or ``cleveragents worker``) starts a
worker; ``app`` is the Celery application (``celery_app``). Importing this
package builds the app, as a Celery app module does, and reads no settings:
they come from ``celeryconfig`` when the app first needs them.
"""

from __future__ import annotations

from cleveragents.worker.celery_app import app

__all__ = ["app"]
