"""The library's exceptions.

Every error the library raises on purpose carries the ``SkillErrorType`` it
stands for, so that ``map_tool_error`` never has to guess from message text::

    CleverAgentsError                      root of everything raised here
    ├── SkillResolutionError (ValueError)  a skill could not be resolved
    │   ├── SkillNotFoundError             skill_not_found
    │   ├── IncludeCycleError              cycle_detected
    │   ├── ResolutionFailure              resolution_failure
    │   └── ReadOnlyViolation              validation_error
    ├── SchemaValidationError (ValueError) validation_error
    ├── ToolActivationError                tool_activation_failure
    ├── ToolExecutionError                 tool_execution_failure
    │   ├── ToolTimedOut                   ... that outlived its timeout (reason "timeout")
    │   └── ToolOutputTooLarge             ... with too much output (reason "output_too_large")
    ├── WriteRefused (PermissionError)     permission_denied
    ├── ConfigurationError                 bad settings or usage (never crosses the wire)
    └── RemoteControlUnavailable           a producer could not ask the workers (never crosses)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "CleverAgentsError",
    "ConfigurationError",
    "EmbeddedServerUnavailable",
    "IncludeCycleError",
    "ReadOnlyViolation",
    "RemoteControlUnavailable",
    "ResolutionFailure",
    "SchemaValidationError",
    "SkillErrorType",
    "SkillNotFoundError",
    "SkillResolutionError",
    "ToolActivationError",
    "ToolExecutionError",
    "ToolOutputTooLarge",
    "ToolTimedOut",
    "TransientToolError",
    "WriteRefused",
]


class SkillErrorType(StrEnum):
    """Every category a ``SkillError`` can carry."""

    SKILL_NOT_FOUND = "skill_not_found"
    RESOLUTION_FAILURE = "resolution_failure"
    CYCLE_DETECTED = "cycle_detected"
    TOOL_ACTIVATION_FAILURE = "tool_activation_failure"
    TOOL_EXECUTION_FAILURE = "tool_execution_failure"
    VALIDATION_ERROR = "validation_error"
    PERMISSION_DENIED = "permission_denied"


class CleverAgentsError(Exception):
    """Raised for every error the library raises on purpose.

    A subclass names its category in its header, ``class X(Base,
    error_type=SkillErrorType.Y)``; without one it keeps its parent's.
    """

    error_type: SkillErrorType = SkillErrorType.TOOL_EXECUTION_FAILURE

    def __init_subclass__(cls, *, error_type: SkillErrorType | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if error_type is not None:
            cls.error_type = error_type

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = dict(details or {})


class SkillResolutionError(
    CleverAgentsError, ValueError, error_type=SkillErrorType.RESOLUTION_FAILURE
):
    """Raised when a skill cannot be resolved into a ``SkillDefinition``."""


class SkillNotFoundError(SkillResolutionError, error_type=SkillErrorType.SKILL_NOT_FOUND):
    """Raised when a requested skill is not in the catalogue."""


class IncludeCycleError(SkillResolutionError, error_type=SkillErrorType.CYCLE_DETECTED):
    """Raised when a skill's includes lead back to a skill on the current path."""


class ResolutionFailure(SkillResolutionError, error_type=SkillErrorType.RESOLUTION_FAILURE):
    """Raised for a missing include, a tool-name clash, or a tool outside the skill."""


class ReadOnlyViolation(SkillResolutionError, error_type=SkillErrorType.VALIDATION_ERROR):
    """Raised when a skill asserting ``read_only: true`` reaches a write-capable tool."""


class SchemaValidationError(
    CleverAgentsError, ValueError, error_type=SkillErrorType.VALIDATION_ERROR
):
    """Raised when arguments, output or a request fail validation."""


class ToolActivationError(CleverAgentsError, error_type=SkillErrorType.TOOL_ACTIVATION_FAILURE):
    """Raised when a tool cannot be made ready to run (import or lookup failed)."""


class ToolExecutionError(CleverAgentsError, error_type=SkillErrorType.TOOL_EXECUTION_FAILURE):
    """Raised when a tool fails while it runs (crash, exit code, time-out, bad output)."""


class TransientToolError(ToolExecutionError):
    """Raised by a python tool: this attempt failed for a reason that may pass (a 503,
    a dropped connection, a server restarting). A tool whose ``retry`` policy allows
    another attempt is tried again; else it is a ``tool_execution_failure`` like any
    other, with ``details["transient"]`` (a command tool says the same by exiting 75,
    ``EX_TEMPFAIL``)."""

    def __init__(self, message: str = "", *, details: dict[str, Any] | None = None) -> None:
        super().__init__(
            message or "a transient failure", details={**(details or {}), "transient": True}
        )


class ToolTimedOut(ToolExecutionError):
    """Raised when a tool outlived its timeout: it was stopped, or its result came too late.

    Every tool kind reports a time-out with this error, so that every kind's
    time-out reads the same: ``details["reason"] == "timeout"`` and
    ``details["timeout_s"]``, plus what the kind adds (a command's ``stderr_tail``).
    """

    def __init__(
        self, tool: str, timeout_s: float, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(
            f"tool {tool!r} timed out after {timeout_s:g}s and was stopped",
            details={**(details or {}), "reason": "timeout", "timeout_s": timeout_s},
        )


class ToolOutputTooLarge(ToolExecutionError):
    """Raised when a tool's output is larger than the limit: none of it is kept.

    ``details["reason"] == "output_too_large"`` and ``details["limit_bytes"]``, for
    every tool kind (CLEVERAGENTS_MAX_OUTPUT_BYTES).
    """

    def __init__(self, tool: str, what: str, limit_bytes: int) -> None:
        super().__init__(
            f"tool {tool!r} produced {what} larger than the limit of {limit_bytes} bytes",
            details={"reason": "output_too_large", "limit_bytes": limit_bytes},
        )


class WriteRefused(CleverAgentsError, PermissionError, error_type=SkillErrorType.PERMISSION_DENIED):
    """Raised when a gate refuses a write-capable tool before it starts."""


class ConfigurationError(CleverAgentsError):
    """Raised when settings or command-line usage are invalid."""


class EmbeddedServerUnavailable(ConfigurationError):
    """Raised when the embedded default's server cannot run: no usable binary, one that
    does not start, or a server this home did not start on its socket. The CLI exits 1."""

    exit_code = 1


class RemoteControlUnavailable(CleverAgentsError):
    """Raised when a remote-control broadcast fails or the broker refuses it (a Redis user
    without remote control, such as the documented ``producer``): nobody could be asked."""
