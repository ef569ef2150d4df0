"""Plain Celery as its users write it, for ``benchmarks/compare.py``: every setting a default.

Only the broker and the result backend are given (``COMPARE_CELERY_URL``, a Redis):
JSON, prefetch multiplier 4, early acknowledgement, no task events. ``noop`` calls
the trivial tool of the other systems, ``cleveragents.examples.tools.noop``; its argument is
there for ``noop.chunks(zip(range(n)), 100)``, which needs one per call.
``noop_stored`` is a chunk written by hand that also keeps what a batch promises
and chunks do not: each call's result stored under an id of its own, as Celery
stores a task's (its key, its meta, its expiry), all of a chunk in one script
(``SET ... EX`` per key: a redis-py pipeline spends about 20 us of the caller's CPU
on each command, a script's keys a few).

Its worker, from the repository root::

    COMPARE_CELERY_URL=redis://127.0.0.1:6379/1 \
        celery -A benchmarks.compare_celery worker --concurrency 2
"""

from __future__ import annotations

import functools
import os
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from cleveragents.examples.tools import noop as noop_tool

__all__ = ["app", "noop", "noop_stored"]

_URL = os.environ["COMPARE_CELERY_URL"]
app = Celery("compare", broker=_URL, backend=_URL)


@app.task
def noop(n: int = 0) -> dict[str, Any]:
    """Call the trivial tool."""
    return noop_tool()


@app.task
def noop_stored(ids: list[str]) -> int:
    """Call the trivial tool once per id, each result stored under its id; how many."""
    backend = app.backend
    keys, values = [], []
    for task_id in ids:
        meta = {
            "status": "SUCCESS",
            "result": noop_tool(),
            "traceback": None,
            "children": [],
            "date_done": datetime.now(UTC).isoformat(),
            "task_id": task_id,
        }
        keys.append(backend.get_key_for_task(task_id))
        values.append(backend.encode(meta))
    _store_all()(keys=keys, args=[backend.expires, *values])
    return len(ids)


_STORE_ALL_LUA = """
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 1], 'EX', ARGV[1])
end
"""


@functools.cache
def _store_all() -> Any:
    return app.backend.client.register_script(_STORE_ALL_LUA)
