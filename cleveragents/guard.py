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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleveragents.constants import CLAIM_KEY_PREFIX
from cleveragents.error_types import SkillErrorType
from cleveragents.errors import ToolExecutionError
from cleveragents.outcomes import failed_result, names_of
from cleveragents.retry import retrying
from cleveragents.runtime.invoke import BeforeWrite
from cleveragents.skills import SkillResult
from cleveragents.wire import result_payload

__all__ = [
    "MAX_ATTEMPTS",
    "Claim",
    "Guard",
    "WriteAlreadyClaimed",
    "guard_for",
    "interrupted_result",
    "poison_result",
    "run_at_most_once",
]

#: Deliveries of one invocation before it is finished as a poison message.
MAX_ATTEMPTS = 3
#: Seconds a claim outlives its deadline, so a late result is still waited for.
CLAIM_GRACE_S = 30.0
_HOST = socket.gethostname()


@dataclass(frozen=True)
class Claim:
    """Who started a write, until when it may still be running, and its result once done."""

    host: str
    pid: int
    until: float
    done: dict[str, Any] | None = None

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
        done = data.get("done")
        return Claim(
            str(data["host"]),
            int(data["pid"]),
            float(data["until"]),
            done if isinstance(done, dict) else None,
        )
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
            client = self.redis

            def count() -> int:
                with client.pipeline(transaction=False) as pipe:
                    pipe.incr(key)
                    pipe.expire(key, self.ttl)
                    total, _ = pipe.execute()
                return int(total)

            return retrying(count)
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
            client = self.redis
            if retrying(lambda: client.set(key, text, nx=True, ex=self.ttl)):
                return None
            return _parse_claim(retrying(lambda: client.get(key)))
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

    def read_claim(self, request_id: str) -> Claim | None:
        """The write claim of ``request_id``, if any."""
        if self.redis is not None:
            client, key = self.redis, self._key("write", request_id)
            raw = retrying(lambda: client.get(key))
        elif self.folder is not None:
            path = self._path("write", request_id)
            raw = path.read_text(encoding="utf-8") if path.exists() else None
        else:
            raw = None
        return _parse_claim(raw) if raw else None

    def finish(self, request_id: str, payload: dict[str, Any]) -> None:
        """Record the outcome of a claimed write: a later delivery returns it, never reruns."""
        text = json.dumps({"host": _HOST, "pid": os.getpid(), "until": 0.0, "done": payload})
        if self.redis is not None:
            client, key = self.redis, self._key("write", request_id)
            retrying(lambda: client.set(key, text, ex=self.ttl))
        elif self.folder is not None:
            self._path("write", request_id).write_text(text, encoding="utf-8")

    def dead_letter(self, request_id: str, record: dict[str, Any]) -> None:
        """Keep a poison invocation for inspection (newest first, the last 10,000)."""
        if self.redis is None:
            return
        key = f"{CLAIM_KEY_PREFIX}dead-letter"
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.lpush(key, json.dumps({"request_id": request_id, **record}))
            pipe.ltrim(key, 0, 9_999)
            pipe.execute()


def guard_for(backend: Any, home: Path, ttl_s: float) -> Guard:
    """The guard that lives beside ``backend``: Redis keys, or files under ``home``."""
    client = getattr(backend, "client", None)
    if hasattr(client, "pipeline"):
        return Guard(redis=client, ttl_s=ttl_s)
    return Guard(folder=home / "guard", ttl_s=ttl_s)


class WriteAlreadyClaimed(ToolExecutionError):
    """Raised instead of starting a write whose request id another run has claimed."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(
            "this write was already started by an earlier delivery of the same request",
            details={"reason": "write_already_started"},
        )
        self.claim = claim


def poison_result(body: Any, attempts: int) -> SkillResult:
    """The failure that ends an invocation delivered too many times."""
    skill, tool = names_of(body)
    return failed_result(
        skill,
        tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        f"gave up after {attempts - 1} deliveries: the invocation ended its worker "
        "process every time (a poison message)",
        {"reason": "poison_message", "attempts": attempts - 1},
    )


def interrupted_result(body: Any) -> SkillResult:
    """The failure of a write whose first run was interrupted before it reported back."""
    skill, tool = names_of(body)
    return failed_result(
        skill,
        tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        "an earlier delivery of this request started the write and was interrupted "
        "before it reported back: it may or may not have happened, so it was not "
        "run again",
        {"reason": "write_interrupted"},
    )


Run = Callable[[Any, BeforeWrite], SkillResult]


def run_at_most_once(
    guard: Guard,
    request_id: str,
    body: Any,
    run: Run,
    *,
    redelivered: bool,
    chunk_item: bool = False,
    poll_s: float = 0.2,
) -> SkillResult:
    """Run one delivery of an invocation under the guard.

    Counts the delivery, so that a poison message ends after ``MAX_ATTEMPTS``
    deliveries. With Redis only redeliveries are counted (kombu marks them), so a
    first delivery costs no round trip; the file guard of the embedded default
    counts every interactive delivery (batch items only once their chunk came back).
    Claims a write-capable, non-idempotent tool right before it starts; a delivery
    that finds the claim taken returns the first run's result, waiting for it while
    that run may still be going, and otherwise reports the write as interrupted.
    """
    if redelivered or (guard.redis is None and not chunk_item):
        claim = guard.read_claim(request_id) if redelivered else None
        if claim is not None and claim.done is None and claim.may_still_run():
            # Handed out again while its first run is alive (a tool that outlives the
            # visibility timeout): not a sign of poison. The claim below waits for it.
            return _after_claim(guard, request_id, body, claim, poll_s)
        deliveries = guard.attempt(request_id) + (1 if guard.redis is not None else 0)
        if deliveries > MAX_ATTEMPTS:
            result = poison_result(body, deliveries)
            if deliveries == MAX_ATTEMPTS + 1:  # kept once, by the delivery that crossed the line
                guard.dead_letter(
                    request_id,
                    {
                        "skill": result.skill_name,
                        "tool": result.tool_name,
                        "attempts": deliveries - 1,
                    },
                )
            return result
    owned: list[bool] = []
    held: list[Claim] = []

    def claim_write(request: Any, tool: Any, timeout_s: float) -> None:
        existing = guard.claim(request_id, timeout_s)
        if existing is None:
            owned.append(True)
            return
        held.append(existing)
        raise WriteAlreadyClaimed(existing)

    result = run(body, claim_write)
    if owned:
        guard.finish(request_id, result_payload(result, request_id))
        return result
    if not held:
        return result
    return _after_claim(guard, request_id, body, held[0], poll_s)


def _after_claim(
    guard: Guard, request_id: str, body: Any, claim: Claim | None, poll_s: float
) -> SkillResult:
    """The result of a write claimed by another run: wait for it while that run may go on."""
    while claim is not None and claim.done is None and claim.may_still_run():
        time.sleep(poll_s)
        claim = guard.read_claim(request_id)
    if claim is not None and claim.done is not None:
        return SkillResult.model_validate(claim.done)
    return interrupted_result(body)
