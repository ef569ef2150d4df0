"""What a worker admits: checks on a raw message before Celery decodes or runs it.

Whoever can reach the broker can send any message. A message is refused (and
answered with a ``validation_error`` under its id) unless it is small (body and
headers), uncompressed, JSON (with message signing on: signed JSON, and nothing
else), names one of our two tasks, and has the protocol-2 envelope Celery
expects; a signed ``skills.invoke`` must carry its task id in its signed body.
What an admitted message may ask of the worker is then cut down to what a skill
invocation needs: the producer's time limits, ETA, expiry, retry count and linked
tasks are dropped, since the worker's own limits decide (docs/guarantees.md); an
ETA is kept only on a retry or a wait for a limit that the tool's policy allows. The
worker's own hard time limit is set instead (``cleveragents/worker/time_limits.py``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.exceptions import SecurityError
from kombu import compression
from kombu.exceptions import DecodeError

from cleveragents.broker.signing import (
    SIGNED_BODY_CONTENT_TYPE,
    SIGNED_CONTENT_TYPE,
    signed_body_content_type,
)
from cleveragents.constants import MAX_MESSAGE_BYTES, TASK_INVOKE, TASK_INVOKE_CHUNK
from cleveragents.runtime.text import lone_surrogate
from cleveragents.skills import Catalogue
from cleveragents.tasks.resend import WAITS_HEADER, eta_allowed_s
from cleveragents.worker import state
from cleveragents.worker.time_limits import hard_limit_s

__all__ = [
    "ACCEPTED_CONTENT_TYPE",
    "ACCEPTED_TASKS",
    "admission_problem",
    "envelope_problem",
    "refuse_compressed_bodies",
    "sanitise",
    "signed_id_problem",
]

#: The only content type a worker decodes (SIGNED_CONTENT_TYPE instead with signing on).
ACCEPTED_CONTENT_TYPE = "application/json"
#: The only tasks a worker runs; Celery's built-ins (``celery.*``) are refused too.
ACCEPTED_TASKS = frozenset({TASK_INVOKE, TASK_INVOKE_CHUNK})
#: Headers a producer may not set: the worker's own limits and scheduling decide.
_DROPPED_HEADERS = ("timelimit", "soft_time_limit", "time_limit", "expires", "eta",
                    "countdown", "shadow", "stamps", "stamped_headers")
#: Clock difference between the worker that sent a retry and the one that takes it.
_ETA_SLACK_S = 5.0
#: The options part of an admitted body: no linked tasks, chains or chords.
NO_LINKS = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class CompressedMessageRefused(ValueError):
    """Raised by kombu instead of decompressing a message body (a decompression bomb)."""


def _refuse_decompression(body: bytes) -> bytes:
    raise CompressedMessageRefused("compressed messages are not accepted")


def refuse_compressed_bodies() -> None:
    """Make kombu refuse every compressed body in this process, before expanding it.

    kombu decompresses a body while it builds the message, before any consumer
    sees it: a 300 KB zlib body becomes 300 MB there. With every decoder replaced
    (kombu's public ``compression.register``), the message arrives with a decode
    error and is answered without being expanded. The worker never compresses.
    """
    for content_type in compression.encoders():
        encoder = compression.get_encoder(content_type)
        compression.register(encoder, _refuse_decompression, content_type)


def _raw_size(message: Any) -> int:
    body = getattr(message, "body", None)
    size = len(body) if isinstance(body, bytes | str) else 0
    headers = getattr(message, "headers", None)
    if headers:
        size += len(json.dumps(headers, default=str, separators=(",", ":")))
    return size


def admission_problem(
    message: Any, content_type: str = ACCEPTED_CONTENT_TYPE
) -> str | None:
    """Why the raw message is refused before decoding, or None when it may be decoded.

    ``content_type`` is the one this worker decodes: JSON, or with message signing
    on, ``SIGNED_CONTENT_TYPE`` wrapping JSON, and then nothing else.
    """
    size = _raw_size(message)
    if size > MAX_MESSAGE_BYTES:
        return f"the message is {size} bytes, more than the limit of {MAX_MESSAGE_BYTES}"
    headers = getattr(message, "headers", None) or {}
    if headers.get("compression"):
        return "compressed messages are not accepted"
    actual = getattr(message, "content_type", None)
    if actual != content_type:
        only = "signed messages only" if content_type == SIGNED_CONTENT_TYPE else "JSON only"
        return f"content type {actual!r} is not accepted ({only})"
    task = headers.get("task")
    if task not in ACCEPTED_TASKS:
        shown = task if isinstance(task, str) and len(task) <= 100 else "?"
        return f"task {shown!r} is not accepted (only {', '.join(sorted(ACCEPTED_TASKS))})"
    if content_type == SIGNED_CONTENT_TYPE:
        # What the signature covers is decoded by the type named inside it, whatever
        # that is: a signer's pickle must not reach pickle.loads either.
        inner = signed_body_content_type(getattr(message, "body", None))
        if inner != SIGNED_BODY_CONTENT_TYPE:
            return "the signed body is not JSON" if inner else "the body is not a signed message"
    return None


def envelope_problem(message: Any) -> str | None:
    """Why the message is not a Celery protocol-2 task message, or None when it is one.

    Celery unpacks the body as ``(args, kwargs, embed)`` without checking it, and a
    body of another shape (a JSON string of three characters, say) fails later, in
    the pool's callbacks, leaving no result.
    """
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict) or not isinstance(headers.get("task"), str):
        return "the headers name no task"
    if not isinstance(headers.get("id"), str):
        return "the headers carry no task id"
    if lone_surrogate(headers["id"]):  # no Redis key, log or result can hold it
        return "the task id holds half of a surrogate pair, which is not Unicode text"
    try:
        body = message.payload  # decoded once; kombu caches it for Celery
    except DecodeError as exc:
        if exc.args and isinstance(exc.args[0], SecurityError):
            return "its signature does not verify (unknown signer, other key or changed body)"
        raise
    if not (isinstance(body, list) and len(body) == 3):
        return "the body is not [args, kwargs, options]"
    args, kwargs, embed = body
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        return "the body's args or kwargs have the wrong type"
    if embed is not None and not isinstance(embed, dict):
        return "the body's options are not an object"
    return None


def signed_id_problem(message: Any) -> str | None:
    """Why a signed message's task id is not the one its signed body names, or None.

    Celery signs the body, not the headers: without this, a captured ``skills.invoke``
    sent again under a new task id would run again. Its result is stored under the
    request id, so a signed request's id must be the task id. (A chunk's requests
    each carry their own id in the signed body.)
    """
    if message.headers.get("task") != TASK_INVOKE:
        return None
    args, kwargs, _ = message.payload
    body = args[0] if len(args) == 1 and isinstance(args[0], dict) else kwargs
    signed_id = body.get("request_id") if isinstance(body, dict) else None
    if signed_id != message.headers.get("id"):
        return "the task id is not the request id of the signed body"
    return None


def _kept_eta(headers: dict[str, Any], body: Any, catalogue: Catalogue) -> str | None:
    """A delivery time the worker keeps: that of a retry of a tool with a ``retry``
    policy, or of a wait for a limit of a limited tool, no later than the policy allows
    (``cleveragents/tasks/resend.py``); None for any other message."""
    raw = headers.get("eta")
    if not isinstance(raw, str) or headers.get("task") != TASK_INVOKE:
        return None
    args = body[0] if isinstance(body, list | tuple) and body else None
    request = args[0] if isinstance(args, list | tuple) and len(args) == 1 else None
    found = (
        catalogue.policies(request.get("skill"), request.get("tool"))
        if isinstance(request, dict)
        else None
    )
    if found is None:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        return None
    longest = eta_allowed_s(found.tool, found.skill_limits is not None, headers)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if longest <= 0 or when > datetime.now(UTC) + timedelta(seconds=longest + _ETA_SLACK_S):
        return None
    return raw


def sanitise(message: Any) -> None:
    """Drop what a producer may not decide (time limits, ETA, expiry, retries, links).

    Then set the worker's own hard time limit: the invocation's timeout (a chunk's
    slice and invocations) plus a grace (``cleveragents/worker/time_limits.py``).
    """
    headers = message.headers
    body = message.payload  # the cached list Celery reads again: changed in place
    current = state.current()
    eta = _kept_eta(headers, body, current.catalogue)
    for name in _DROPPED_HEADERS:
        headers.pop(name, None)
    if eta is not None:
        headers["eta"] = eta
    else:  # nothing to wait for: counted from the start, as a first attempt
        headers["retries"] = 0
        headers.pop(WAITS_HEADER, None)
    body[2] = dict(NO_LINKS)
    hard = hard_limit_s(headers.get("task"), body[0], current.catalogue, current.settings)
    # Celery's Request reads time_limits from this header: [hard, soft]. No soft limit:
    # the runtime's own deadline is the soft one, for every tool kind.
    headers["timelimit"] = [hard, None]
