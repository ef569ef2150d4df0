"""Which failures are retried, after how long, and what the final result says.

A failure is transient when the tool says so (a python tool raising
``cleveragents.runtime.TransientToolError``, a command tool exiting 75,
``EX_TEMPFAIL``: ``details["transient"]``), when an MCP server could not be reached
or died mid-call (also ``details["transient"]``), or when a read timed out. Every
other failure (validation, refusals, ``isError`` answers, a crash) is final at once.

A transient failure is retried while its tool's ``retry`` policy allows more
attempts, and a write only when its tool is ``idempotent``: a write that is not
keeps its at-most-once promise whatever its ``retry`` says. The retry is a new
message under the same request id, sent back to the broker with its delay
(``tasks/invoke.py``): no pool process and no prefetch slot waits for it.
"""

from __future__ import annotations

from cleveragents.errors import SkillErrorType
from cleveragents.skills import SkillResult
from cleveragents.skills.model import ToolSpec

__all__ = [
    "ATTEMPTS",
    "REASON_RETRIED",
    "TRANSIENT",
    "may_retry",
    "retried",
    "retry_delay_s",
    "with_attempts",
]

#: ``details`` key of a failure the tool (or its transport) says may pass.
TRANSIENT = "transient"
#: ``details`` key of a failed result: how many attempts ran.
ATTEMPTS = "attempts"
#: ``details["reason"]`` of an attempt that failed and is tried again (its log line and
#: metrics; never a stored result).
REASON_RETRIED = "retried"


#: The error types a transient failure may have: the tool failed while it ran, or its
#: MCP server could not be reached over the network.
_MAY_PASS = frozenset(
    {SkillErrorType.TOOL_EXECUTION_FAILURE, SkillErrorType.TOOL_ACTIVATION_FAILURE}
)


def may_retry(tool: ToolSpec) -> bool:
    """Whether any failure of ``tool`` may ever be retried (a write only when idempotent)."""
    policy = tool.retry
    return (
        policy is not None
        and policy.attempts > 1
        and (not tool.write_capable or tool.idempotent)
    )


def _transient(tool: ToolSpec, result: SkillResult) -> bool:
    error = result.error
    if result.success or error is None:
        return False
    if error.details.get(TRANSIENT) is True:  # a tool's own, or its server not reached
        return error.error_type in _MAY_PASS
    if error.error_type != SkillErrorType.TOOL_EXECUTION_FAILURE:
        return False
    return error.details.get("reason") == "timeout" and not tool.write_capable


def retry_delay_s(tool: ToolSpec, result: SkillResult, attempt: int) -> float | None:
    """The wait before attempt ``attempt + 1`` of ``tool`` after ``result``; None: final."""
    policy = tool.retry
    if policy is None or not may_retry(tool) or attempt >= policy.attempts:
        return None
    if not _transient(tool, result):
        return None
    return policy.delay_s(attempt)


def with_attempts(result: SkillResult, attempt: int) -> SkillResult:
    """``result``, a failure saying how many attempts ran (a success as it is, and a
    failure that says already: a poison message counts its deliveries there)."""
    if result.success or result.error is None:
        return result
    if ATTEMPTS in result.error.details:  # a poison message's: the deliveries it had
        return result
    error = result.error.model_copy(update={"details": {**result.error.details, ATTEMPTS: attempt}})
    return result.model_copy(update={"error": error})


def retried(result: SkillResult, attempt: int) -> SkillResult:
    """What an attempt that is tried again is reported as: its failure, ``reason``
    ``retried`` and the attempt's number (a log line and metrics; never stored)."""
    if result.error is None:
        return result
    details = {**result.error.details, "reason": REASON_RETRIED, ATTEMPTS: attempt}
    return result.model_copy(update={"error": result.error.model_copy(update={"details": details})})
