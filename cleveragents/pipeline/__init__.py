"""The invocation pipeline: a delivery in, one decided outcome out.

``Pipeline.deliver`` decides what becomes of one delivery (limits, the id's
binding, the guard's attempts and write claims, approval, the run, the retry),
whatever carried it; ``execute`` runs one where nothing can send it back;
``execute_chunk`` runs a batch chunk for one time slice, each line through
``deliver``, skipping what is stored, and hands the rest to a ``requeue``
callable. None knows Celery: the tasks decode a message, call one of them and
translate the outcome.
"""

from cleveragents.pipeline.chunk import (
    ChunkReport,
    ItemFailure,
    ReportFailures,
    Requeue,
    Sender,
    execute_chunk,
)
from cleveragents.pipeline.delivery import Delivery, Outcome
from cleveragents.pipeline.invocation import Observer, Pipeline, execute

__all__ = [
    "ChunkReport",
    "Delivery",
    "ItemFailure",
    "Observer",
    "Outcome",
    "Pipeline",
    "ReportFailures",
    "Requeue",
    "Sender",
    "execute",
    "execute_chunk",
]
