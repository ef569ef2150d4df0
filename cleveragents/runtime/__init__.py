"""The tool runtime: the one place where tools run; every invocation becomes a ``SkillResult``."""

from cleveragents.errors import TransientToolError
from cleveragents.runtime.deadline import ToolTimeout
from cleveragents.runtime.gating import check_write_gates
from cleveragents.runtime.invoke import DEFAULT_TIMEOUT_S, effective_timeout, invoke, parse_request
from cleveragents.runtime.kinds import ToolKind, load_tool_kinds, register_tool_kind
from cleveragents.runtime.output import ToolOutput
from cleveragents.runtime.request import SkillInvocationRequest, new_request_id

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "SkillInvocationRequest",
    "ToolKind",
    "ToolOutput",
    "ToolTimeout",
    "TransientToolError",
    "check_write_gates",
    "effective_timeout",
    "invoke",
    "load_tool_kinds",
    "new_request_id",
    "parse_request",
    "register_tool_kind",
]
