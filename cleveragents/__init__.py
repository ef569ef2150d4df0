"""CleverAgents skill worker: run AI agents' tool calls in the background on Celery.

What users import lives here; each name is loaded on first use, so that
``import cleveragents`` stays cheap and has no effects (the client pulls in Celery
only when ``SkillClient`` is first touched)::

    from cleveragents import Catalogue, SkillClient, SkillInvocationRequest, invoke
    from cleveragents import AsyncSkillClient  # the same, for asyncio
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cleveragents.aio.client import AsyncInvocationHandle, AsyncSkillClient
    from cleveragents.client import InvocationHandle, SkillClient
    from cleveragents.errors import (
        CleverAgentsError,
        ConfigurationError,
        IncludeCycleError,
        ReadOnlyViolation,
        ResolutionFailure,
        SchemaValidationError,
        SkillNotFoundError,
        SkillResolutionError,
        ToolActivationError,
        ToolExecutionError,
        WriteRefused,
    )
    from cleveragents.runtime import SkillInvocationRequest, ToolOutput, invoke
    from cleveragents.skills import (
        Catalogue,
        SkillDefinition,
        SkillError,
        SkillErrorType,
        SkillMetadata,
        SkillResult,
        ToolSpec,
    )

__version__ = "0.1.0"

#: Where each public name is defined.
_SOURCES = {
    "SkillClient": "cleveragents.client",
    "AsyncSkillClient": "cleveragents.aio.client",
    "AsyncInvocationHandle": "cleveragents.aio.client",
    "InvocationHandle": "cleveragents.client",
    "SkillInvocationRequest": "cleveragents.runtime",
    "ToolOutput": "cleveragents.runtime",
    "invoke": "cleveragents.runtime",
    "Catalogue": "cleveragents.skills",
    "SkillDefinition": "cleveragents.skills",
    "SkillError": "cleveragents.skills",
    "SkillErrorType": "cleveragents.skills",
    "SkillMetadata": "cleveragents.skills",
    "SkillResult": "cleveragents.skills",
    "ToolSpec": "cleveragents.skills",
    "CleverAgentsError": "cleveragents.errors",
    "ConfigurationError": "cleveragents.errors",
    "IncludeCycleError": "cleveragents.errors",
    "ReadOnlyViolation": "cleveragents.errors",
    "ResolutionFailure": "cleveragents.errors",
    "SchemaValidationError": "cleveragents.errors",
    "SkillNotFoundError": "cleveragents.errors",
    "SkillResolutionError": "cleveragents.errors",
    "ToolActivationError": "cleveragents.errors",
    "ToolExecutionError": "cleveragents.errors",
    "WriteRefused": "cleveragents.errors",
}

__all__ = [
    "AsyncInvocationHandle",
    "AsyncSkillClient",
    "Catalogue",
    "CleverAgentsError",
    "ConfigurationError",
    "IncludeCycleError",
    "InvocationHandle",
    "ReadOnlyViolation",
    "ResolutionFailure",
    "SchemaValidationError",
    "SkillClient",
    "SkillDefinition",
    "SkillError",
    "SkillErrorType",
    "SkillInvocationRequest",
    "SkillMetadata",
    "SkillNotFoundError",
    "SkillResolutionError",
    "SkillResult",
    "ToolActivationError",
    "ToolExecutionError",
    "ToolOutput",
    "ToolSpec",
    "WriteRefused",
    "__version__",
    "invoke",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'cleveragents' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
