"""The invocation pipeline: a delivered message in, a stored ``SkillResult`` out.

``execute`` runs one delivery of one invocation under the guard (attempts, write
claims) through the runtime and reports it to an observer; ``execute_chunk``
runs a batch chunk for one time slice, skipping what is stored, and hands the
rest to a ``requeue`` callable. Neither knows Celery: the tasks decode a message,
call one of them and encode the result.
"""

from cleveragents.pipeline.chunk import (
    ChunkReport,
    ItemFailure,
    ReportFailures,
    Requeue,
    Sender,
    execute_chunk,
)
from cleveragents.pipeline.invocation import Observer, Pipeline, execute

__all__ = [
    "ChunkReport",
    "ItemFailure",
    "Observer",
    "Pipeline",
    "ReportFailures",
    "Requeue",
    "Sender",
    "execute",
    "execute_chunk",
]
