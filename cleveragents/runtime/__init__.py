"""The tool runtime: the one place where tools run; every invocation becomes a ``SkillResult``."""

from cleveragents.runtime.deadline import ToolTimeout
from cleveragents.runtime.gating import check_write_gates
from cleveragents.runtime.invoke import DEFAULT_TIMEOUT_S, effective_timeout, invoke, parse_request
from cleveragents.runtime.output import ToolOutput
from cleveragents.runtime.request import SkillInvocationRequest, new_request_id

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "SkillInvocationRequest",
    "ToolOutput",
    "ToolTimeout",
    "check_write_gates",
    "effective_timeout",
    "invoke",
    "new_request_id",
    "parse_request",
]
