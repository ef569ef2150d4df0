"""The invocation request: the wire format of SPEC section 5."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["REQUEST_ID_PATTERN", "SkillInvocationRequest", "new_request_id"]

#: What a request id may hold: it is the Celery task id and part of Redis keys.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:@/+=-]{1,200}$"


def new_request_id() -> str:
    """A fresh request id (a UUID4)."""
    return str(uuid.uuid4())


class SkillInvocationRequest(BaseModel):
    """One invocation: which skill's tool to run, with which arguments, and whether it may write."""

    # Strict: the wire is JSON, whose types are exact; "yes" or 1 must not mean allow_writes.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    request_id: str = Field(default_factory=new_request_id, pattern=REQUEST_ID_PATTERN)
    skill: str = Field(min_length=1, max_length=400)
    tool: str = Field(min_length=1, max_length=400)
    arguments: dict[str, Any] = Field(default_factory=dict)
    allow_writes: bool = False
    timeout_s: float | None = Field(default=None, gt=0)
