"""Dramatiq as its users write it, for ``benchmarks/compare.py``: a Redis broker and results.

The broker and the results backend are one Redis (``COMPARE_DRAMATIQ_URL``); every
other setting is Dramatiq's default. ``noop`` stores its result (the ``Results``
middleware) so that a producer can wait for it, as ``SkillClient.submit(...).result()``
and Celery's ``apply_async().get()`` do. Its worker, from the repository root::

    COMPARE_DRAMATIQ_URL=redis://127.0.0.1:6379/2 \
        dramatiq benchmarks.compare_dramatiq --processes 2 --threads 8
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from cleveragents.examples.tools import noop as noop_tool
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

__all__ = ["broker", "noop"]

_URL = os.environ["COMPARE_DRAMATIQ_URL"]
broker = RedisBroker(url=_URL)
broker.add_middleware(Results(backend=RedisBackend(url=_URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def noop() -> dict[str, Any]:
    """Call the trivial tool."""
    return noop_tool()
