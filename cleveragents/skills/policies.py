"""A tool's policies, declared in its skill file: how it is retried, and how it is limited.

``retry: {attempts: N, backoff_s: S, max_backoff_s: M}``: up to N attempts in all; the
k-th retry waits about S·2^(k-1) seconds, at most M, with jitter. Only a transient
failure is retried, and a write only when its tool is ``idempotent``
(``cleveragents.pipeline.retries``).

``limits: {concurrency: N, rate: "N/s" | "N/m" | "N/h"}``: across every worker that
shares the broker, at most N runs at once, and at most N starts in any sliding window
of that length (``cleveragents.pipeline.quotas``). A skill may declare ``limits`` too,
shared by all its tools.
"""

from __future__ import annotations

import random
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["LONGEST_RETRY_DELAY_S", "MOST_BACKOFF_S", "Limits", "RetryPolicy"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
_WINDOW_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: A retry's delay is its nominal one times a factor drawn in this range.
JITTER = (0.9, 1.1)
#: The largest ``max_backoff_s`` a skill file may give.
MOST_BACKOFF_S = 3600.0
#: The longest any retry of any tool may wait (a worker holds its message meanwhile).
LONGEST_RETRY_DELAY_S = MOST_BACKOFF_S * JITTER[1]


class RetryPolicy(BaseModel):
    """How many attempts a tool gets, and how long each retry waits."""

    model_config = _FROZEN

    attempts: int = Field(default=1, ge=1, le=100)
    backoff_s: float = Field(default=1.0, ge=0, le=MOST_BACKOFF_S)
    max_backoff_s: float = Field(default=60.0, gt=0, le=MOST_BACKOFF_S)

    def delay_s(self, retry: int) -> float:
        """The wait before the ``retry``-th retry (1: the second attempt), jittered."""
        nominal = min(self.max_backoff_s, self.backoff_s * 2.0 ** (retry - 1))
        return float(nominal * random.uniform(*JITTER))

    @property
    def longest_delay_s(self) -> float:
        """The longest wait any retry of this policy may have."""
        return self.max_backoff_s * JITTER[1]


class Limits(BaseModel):
    """At most ``concurrency`` runs at once and ``rate`` starts per window, fleet-wide."""

    model_config = _FROZEN

    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    rate: str | None = None

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None and not _RATE_RE.match(value):
            raise ValueError(f'rate {value!r} is not "N/s", "N/m" or "N/h"')
        if value is not None and int(_RATE_RE.match(value).group(1)) < 1:  # type: ignore[union-attr]
            raise ValueError(f"rate {value!r} allows no start at all")
        return value

    @property
    def per_window(self) -> tuple[int, float] | None:
        """The rate as (starts, window in seconds), or None."""
        if self.rate is None:
            return None
        found = _RATE_RE.match(self.rate)
        assert found is not None  # checked by the validator
        return int(found.group(1)), _WINDOW_S[found.group(2)]

    def __bool__(self) -> bool:
        return self.concurrency is not None or self.rate is not None
