"""The baseline of ``benchmarks/queue_bench.py``: a plain Celery task around the same tool.

``bench.noop`` calls ``cleveragents.examples.tools.noop`` directly: no request model, no
catalogue, no gates, no schema validation, no deadline, no ``SkillResult``. The
app is configured from the very dict the skill worker uses
(``cleveragents.broker.celery_settings.celery_settings``: JSON only, acks late, prefetch 1,
track started,
task events, result backend, transport options ...), with two differences that
only concern routing and error paths:

* ``bench.noop`` goes to a queue of its own, ``bench.plain``;
* the consumer is Celery's own: ``cleveragents.worker.consumer:SkillConsumer`` only differs
  on undecodable or disallowed messages, and importing it would import the
  ``worker`` package, i.e. create the skill app and connect its start-up hooks.

Start its worker from the repository root::

    CLEVERAGENTS_BROKER_URL=redis://... \
        python -m celery -A benchmarks.plain_tasks worker -Q bench.plain -c 2
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready
from cleveragents.examples.tools import noop as noop_tool
from kombu import Exchange, Queue

from cleveragents.broker.celery_settings import celery_settings
from cleveragents.settings import Settings

__all__ = ["PLAIN_QUEUE", "PLAIN_TASK", "app", "noop"]

#: The queue of the baseline task, apart from the skill queues.
PLAIN_QUEUE = "bench.plain"
#: The baseline task's name.
PLAIN_TASK = "bench.noop"

app = Celery("cleveragents-bench-plain")
_conf = celery_settings(Settings.from_env())
_conf.pop("worker_consumer", None)
_conf["task_queues"] = [
    *_conf["task_queues"],
    Queue(PLAIN_QUEUE, Exchange(PLAIN_QUEUE, type="direct"), routing_key=PLAIN_QUEUE),
]
_conf["task_routes"] = {PLAIN_TASK: {"queue": PLAIN_QUEUE}}
app.conf.update(_conf)


@app.task(name=PLAIN_TASK)
def noop() -> dict[str, Any]:
    """Call the trivial tool directly."""
    return noop_tool()


@worker_ready.connect
def _announce_ready(**_: Any) -> None:
    # Same readiness file as the skill worker (cleveragents/worker/startup.py), for the benchmark.
    ready_file = os.environ.get("CLEVERAGENTS_READY_FILE")
    if ready_file:
        Path(ready_file).write_text(str(os.getpid()), encoding="utf-8")
