"""The Celery application: ``celery -A worker worker`` starts a skill worker.

Settings come from ``celeryconfig`` (the environment), read when the app first
needs them. Folders, patches of third-party internals and the catalogue are set up
when a worker starts (``worker.signals``), never at import and never in Flower's
or another command's process. The one exception is Flower's default columns
(``worker.flower_columns``), which Flower can only take from the environment.
"""

from __future__ import annotations

from celery import Celery

from worker import flower_columns

__all__ = ["app"]

flower_columns.set_default()

app = Celery("cleveragents", include=["tasks.invoke", "tasks.batch"])
app.config_from_object("celeryconfig")

from worker import signals as _signals  # noqa: E402,F401  (connects start-up hooks)
