"""Plain Celery as its users write it, for ``benchmarks/compare.py``: every setting a default.

Only the broker and the result backend are given (``COMPARE_CELERY_URL``, a Redis):
JSON, prefetch multiplier 4, early acknowledgement, no task events. ``noop`` calls
the trivial tool of the other systems, ``examples.tools.noop``; its argument is
there for ``noop.chunks(zip(range(n)), 100)``, which needs one per call.

Its worker, from the repository root::

    COMPARE_CELERY_URL=redis://127.0.0.1:6379/1 \
        celery -A benchmarks.compare_celery worker --concurrency 2
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from examples.tools import noop as noop_tool

__all__ = ["app", "noop"]

_URL = os.environ["COMPARE_CELERY_URL"]
app = Celery("compare", broker=_URL, backend=_URL)


@app.task
def noop(n: int = 0) -> dict[str, Any]:
    """Call the trivial tool."""
    return noop_tool()
