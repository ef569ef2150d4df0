"""The Celery application: ``celery -A worker worker`` starts a skill worker.

Settings come from ``celeryconfig`` (the environment). The catalogue is loaded
and resolved once per worker process, at start-up (``worker.state``).
"""

from __future__ import annotations

import os

from celery import Celery

__all__ = ["app"]

# `celery -A worker flower` imports this module before Flower reads its FLOWER_*
# settings: by default its tasks page shows the (redacted) arguments, which name the
# skill and tool, and the result or error of each invocation.
os.environ.setdefault(
    "FLOWER_TASKS_COLUMNS", "name,uuid,state,args,result,exception,received,runtime,worker"
)

from worker import kombu_fix

kombu_fix.install()

app = Celery("cleveragents", include=["tasks.invoke", "tasks.batch"])
app.config_from_object("celeryconfig")

from worker import signals as _signals  # noqa: E402,F401  (connects start-up hooks)
