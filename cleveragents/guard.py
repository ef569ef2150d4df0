"""At-most-once for writes, and an end to poison messages.

Celery with ``acks_late`` redelivers a message whose worker died, and Redis
redelivers one whose tool outlives the visibility timeout. Both are right for
reads and wrong for a write that may already have happened. The guard keeps two
small records per request id beside the results:

* an **attempt counter**, incremented at every delivery: past
  ``MAX_ATTEMPTS`` the invocation is finished with a failure instead of run,
  so a message that kills its worker every time ends;
* a **write claim**, taken atomically just before a write-capable,
  non-idempotent tool starts: a second delivery that finds it does not run the
  tool. It waits for the first run's result while that run may still be going
  (its owner is alive and within its deadline), and otherwise reports that the
  write may or may not have happened.

With Redis the records are keys (``SET NX``, ``INCR``); on the embedded default
they are files created with ``O_EXCL`` under ``CLEVERAGENTS_HOME/guard``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleveragents.constants import CLAIM_KEY_PREFIX

__all__ = ["MAX_ATTEMPTS", "Claim", "Guard", "guard_for"]

#: Deliveries of one invocation before it is finished as a poison message.
MAX_ATTEMPTS = 3
#: Seconds a claim outlives its deadline, so a late result is still waited for.
CLAIM_GRACE_S = 30.0
_HOST = socket.gethostname()


@dataclass(frozen=True)
class Claim:
    """Who started a write, and until when it may still be running."""

    host: str
    pid: int
    until: float

    def owner_alive(self) -> bool:
        """False when the owner is known to be dead (same host, no such process)."""
        if self.host != _HOST:
            return True  # another machine: trust its deadline
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def may_still_run(self) -> bool:
        """True while the first run may still finish and store its result."""
        return time.time() < self.until and self.owner_alive()


def _claim_text(deadline_s: float) -> str:
    return json.dumps({"host": _HOST, "pid": os.getpid(), "until": time.time() + deadline_s})


def _parse_claim(raw: Any) -> Claim:
    try:
        data = json.loads(raw)
        return Claim(str(data["host"]), int(data["pid"]), float(data["until"]))
    except (ValueError, KeyError, TypeError):
        return Claim("", 0, 0.0)


class Guard:
    """Attempt counters and write claims (see the module docstring)."""

    def __init__(self, redis: Any = None, folder: Path | None = None, ttl_s: float = 7 * 86400):
        self.redis = redis
        self.folder = folder
        self.ttl = max(int(ttl_s), 60)

    def _key(self, kind: str, request_id: str) -> str:
        return f"{CLAIM_KEY_PREFIX}{kind}:{request_id}"

    def _path(self, kind: str, request_id: str) -> Path:
        assert self.folder is not None
        folder = self.folder / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / request_id.replace("/", "%2F")

    def attempt(self, request_id: str) -> int:
        """Count one more delivery of ``request_id``; return how many there have been."""
        if self.redis is not None:
            key = self._key("attempts", request_id)
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.incr(key)
                pipe.expire(key, self.ttl)
                count, _ = pipe.execute()
            return int(count)
        if self.folder is None:
            return 1
        path = self._path("attempts", request_id)
        with path.open("a+", encoding="utf-8") as handle:
            handle.write("x")
            handle.seek(0)
            return len(handle.read())

    def claim(self, request_id: str, deadline_s: float) -> Claim | None:
        """Take the write claim; None when taken, else the claim someone else holds."""
        text = _claim_text(deadline_s + CLAIM_GRACE_S)
        if self.redis is not None:
            key = self._key("write", request_id)
            if self.redis.set(key, text, nx=True, ex=self.ttl):
                return None
            return _parse_claim(self.redis.get(key))
        if self.folder is None:
            return None
        path = self._path("write", request_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return _parse_claim(path.read_text(encoding="utf-8"))
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return None


def guard_for(backend: Any, home: Path, ttl_s: float) -> Guard:
    """The guard that lives beside ``backend``: Redis keys, or files under ``home``."""
    client = getattr(backend, "client", None)
    if hasattr(client, "pipeline"):
        return Guard(redis=client, ttl_s=ttl_s)
    return Guard(folder=home / "guard", ttl_s=ttl_s)
