"""The Celery application: ``celery -A worker worker`` starts a skill worker.

Settings come from ``celeryconfig`` (the environment). The catalogue is loaded
and resolved once per worker process, at start-up (``worker.state``).
"""

from __future__ import annotations

from celery import Celery

__all__ = ["app"]

app = Celery("cleveragents", include=["tasks.invoke", "tasks.batch"])
app.config_from_object("celeryconfig")

from worker import signals as _signals  # noqa: E402,F401  (connects start-up hooks)
