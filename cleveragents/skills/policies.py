"""A tool's policies, declared in its skill file: how it is retried, and how it is limited.

``retry: {attempts: N, backoff_s: S, max_backoff_s: M}``: up to N attempts in all; the
k-th retry waits about S·2^(k-1) seconds, at most M, with jitter. Only a transient
failure is retried, and a write only when its tool is ``idempotent``
(``cleveragents.pipeline.retries``).

``limits: {concurrency: N, rate: "N/s" | "N/m" | "N/h"}``: across every worker that
shares the broker, at most N runs at once, and at most N starts in any sliding window
of that length (``cleveragents.pipeline.quotas``). A skill may declare ``limits`` too,
shared by all its tools.

``sandbox: true`` or ``sandbox: {network: ..., allow_write: [...], deny_read: [...]}``: a
command tool or stdio MCP server runs in a Linux sandbox (``cleveragents.runtime.sandbox``,
docs/runtime.md "Sandboxed tools"). ``network`` is ``none`` (the default), ``all``, or a
list of destinations the sandbox's proxy lets through: ``host`` (any port), ``host:port``,
``*.domain`` (any name below the domain, any port) or ``*.domain:port``.
"""

from __future__ import annotations

import os
import random
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["LONGEST_RETRY_DELAY_S", "MOST_BACKOFF_S", "Limits", "RetryPolicy", "Sandbox"]

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


#: One allowed destination: ``host``, ``*.domain``, an IPv4 address or ``[IPv6]``, then ``:port``.
_DESTINATION_RE = re.compile(
    r"^(?P<host>(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(:(?P<port>[0-9]{1,5}))?$"
)


def _destination(rule: str) -> tuple[str, int | None]:
    """A network rule as (host in lower case, without brackets; port or None)."""
    found = _DESTINATION_RE.match(rule)
    if found is None:
        raise ValueError(
            f"network entry {rule!r} is not a host, host:port, *.domain or *.domain:port"
        )
    port = int(found.group("port")) if found.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"network entry {rule!r}: the port must be 1 to 65535")
    return found.group("host").strip("[]").lower(), port


class Sandbox(BaseModel):
    """Where a sandboxed tool may connect, what it may write, and what it may not read."""

    model_config = _FROZEN

    #: ``none``: no network at all; ``all``: the worker's network; a list: those
    #: destinations only, through the sandbox's proxy.
    network: Literal["none", "all"] | tuple[str, ...] = "none"
    #: Paths (absolute) bound writable into the sandbox; a missing one is skipped.
    allow_write: tuple[str, ...] = ()
    #: Paths (absolute) replaced by empty ones: a folder by an empty read-only one, a
    #: file by one that cannot be read.
    deny_read: tuple[str, ...] = ()

    @field_validator("network")
    @classmethod
    def _rules(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        if isinstance(value, str):
            return value
        for rule in value:
            _destination(rule)
        return value or "none"  # an empty list allows nothing: it is "none"

    @field_validator("allow_write", "deny_read")
    @classmethod
    def _absolute(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not os.path.isabs(path) or os.path.normpath(path) == "/":
                raise ValueError(f"{path!r} must be an absolute path below /")
        return tuple(os.path.normpath(path) for path in value)

    @property
    def proxied(self) -> bool:
        """Whether the tool reaches the network through the proxy (a list of destinations)."""
        return isinstance(self.network, tuple)

    def allows(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is one of the allowed destinations (names, not addresses)."""
        if self.network == "all":
            return True
        if self.network == "none":
            return False
        host = host.strip("[]").rstrip(".").lower()
        for rule in self.network:
            name, only = _destination(rule)
            if only is not None and only != port:
                continue
            if name.startswith("*."):
                if host.endswith(name[1:]) and len(host) > len(name) - 1:
                    return True
            elif host == name:
                return True
        return False
