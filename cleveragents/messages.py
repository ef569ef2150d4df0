"""How requests and results travel through Celery: payloads, redaction, failures.

A successful invocation is stored as the task's return value: the
``SkillResult`` fields plus ``request_id``. A failed one is raised as
``SkillInvocationFailed`` so that Celery, Flower and ``celery events`` show it
as failed; the exception carries the whole ``SkillResult`` as its second
argument, and ``result_from_stored`` rebuilds it from either form.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from celery.exceptions import Retry

from cleveragents.constants import REDACTED
from cleveragents.errors import SkillErrorType
from cleveragents.runtime.outcomes import failed_result
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.runtime.text import blank_arguments
from cleveragents.skills import SkillResult

__all__ = [
    "REPR_MAX_CHARS",
    "WIRE_MODULE",
    "ChunkContext",
    "SkillInvocationFailed",
    "chunk_repr",
    "failure_summary",
    "item_repr",
    "redacted_repr",
    "request_payload",
    "result_from_stored",
    "result_payload",
    "retry_note",
    "retry_pending",
    "stored_payload",
]


#: The module Celery records as the failure's ``exc_module``.
WIRE_MODULE = __name__
#: The exception Celery stores for a task its hard time limit ended (billiard's class).
_TIME_LIMIT = "TimeLimitExceeded"
#: Longest text given to Flower for a task's arguments (Celery's own ``argsrepr`` limit).
REPR_MAX_CHARS = 1024
#: Longest skill or tool name shown; a longer one (not in any catalogue) is cut.
_NAME_MAX_CHARS = 200
#: Longest argument name shown.
_KEY_MAX_CHARS = 64
#: Skill/tool pairs a chunk's row names; the others are counted.
_TOOLS_SHOWN = 3
#: A batch id shown in Flower: what ``batch submit --batch-id`` and our producers make.
_BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


class SkillInvocationFailed(Exception):
    """Raised by the task for a failed invocation: Celery marks it FAILURE.

    ``args`` is ``(summary, payload)``: a one-line ``"error_type: message"`` and the
    full ``SkillResult`` payload.
    """

    def __init__(self, summary: str, payload: dict[str, Any] | None = None) -> None:
        super().__init__(summary, payload or {})
        self.summary = summary
        self.payload = payload or {}

    def __str__(self) -> str:
        return self.summary

    def __repr__(self) -> str:
        return f"SkillInvocationFailed({self.summary!r})"


def request_payload(request: SkillInvocationRequest) -> dict[str, Any]:
    """The JSON body of one invocation (SPEC section 5)."""
    return request.model_dump(mode="json")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _name(value: Any) -> str:
    """A skill or tool name as shown: a string, cut short; anything else is not shown."""
    return _cut(value, _NAME_MAX_CHARS) if isinstance(value, str) else REDACTED


def _flag(key: str, value: Any) -> str | None:
    """A request field besides skill, tool and arguments, as shown (None: not worth showing)."""
    if key == "request_id" or (key, value) in (("allow_writes", False), ("timeout_s", None)):
        return None  # the row's uuid is the request id; defaults say nothing
    plain = isinstance(value, bool | int | float) and key in ("allow_writes", "timeout_s")
    return f"{_cut(str(key), _KEY_MAX_CHARS)}={value if plain else REDACTED}"


def redacted_repr(request: SkillInvocationRequest | dict[str, Any]) -> str:
    """What Flower and logs show of a request: ``skill tool(key=[redacted], ...) flags``.

    Skill and tool come first, since Flower's args column shows only its start; then
    the arguments' names, never their values; then the flags that are not defaults.
    """
    data = (
        request.model_dump(mode="json") if isinstance(request, SkillInvocationRequest) else request
    )
    if not isinstance(data, dict):
        return REDACTED
    arguments = data.get("arguments")
    if isinstance(arguments, dict):
        shown = ", ".join(f"{_cut(str(k), _KEY_MAX_CHARS)}={REDACTED}" for k in arguments)
    else:
        shown = "" if arguments is None else REDACTED
    flags = [
        flag
        for key, value in data.items()
        if key not in ("skill", "tool", "arguments") and (flag := _flag(key, value))
    ]
    text = f"{_name(data.get('skill'))} {_name(data.get('tool'))}({shown})"
    return _cut(" ".join([text, *flags]), REPR_MAX_CHARS)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _expand(ranges: Any, count: int) -> tuple[int, ...] | None:
    """``[[first, last], ...]`` as the item numbers, if they are exactly ``count``."""
    if not isinstance(ranges, list) or len(ranges) > count:
        return None
    pairs = [r for r in ranges if isinstance(r, list) and len(r) == 2 and all(map(_is_count, r))]
    if len(pairs) != len(ranges) or any(last < first for first, last in pairs):
        return None
    if sum(last - first + 1 for first, last in pairs) != count:
        return None
    return tuple(n for first, last in pairs for n in range(first, last + 1))


@dataclass(frozen=True)
class ChunkContext:
    """Where a chunk's requests sit in their batch: the batch id and each one's item number.

    It travels in the chunk message's ``BATCH_HEADER`` (item numbers as ranges), is
    shown in Flower beside the chunk and each of its failed invocations, and is never
    needed to run anything: a chunk without it runs the same.
    """

    batch_id: str
    #: The 1-based item number in the batch of each request of the chunk, in chunk order.
    items: tuple[int, ...]
    #: How many items the batch has, where the producer knows it.
    total: int | None = None

    def header(self) -> dict[str, Any]:
        """The message header: ``{"id", "items": [[first, last], ...], "total"}``."""
        ranges: list[list[int]] = []
        for item in self.items:
            if ranges and ranges[-1][1] + 1 == item:
                ranges[-1][1] = item
            else:
                ranges.append([item, item])
        return {"id": self.batch_id, "items": ranges, "total": self.total}

    @classmethod
    def from_header(cls, value: Any, count: int) -> ChunkContext | None:
        """The context of a chunk of ``count`` requests, or None if the header is not ours."""
        if not isinstance(value, dict):
            return None
        batch_id, total = value.get("id"), value.get("total")
        items = _expand(value.get("items"), count)
        if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id) or items is None:
            return None
        # Not known, or not a count the items fit in: not shown.
        if not isinstance(total, int) or not _is_count(total) or total < max(items, default=0):
            total = None
        return cls(batch_id, items, total)

    def rest(self, start: int, count: int | None = None) -> ChunkContext:
        """The context of the chunk's requests from ``start`` on (``count`` of them, or all)."""
        end = None if count is None else start + count
        return ChunkContext(self.batch_id, self.items[start:end], self.total)

    def _of(self) -> str:
        return "" if self.total is None else f" of {self.total}"

    def _range(self) -> str:
        first, last = min(self.items), max(self.items)
        return f"{first}{self._of()}" if first == last else f"{first}-{last}{self._of()}"

    def describe(self) -> str:
        """``batch ID · items 101-200 of 1000``: what Flower shows of a chunk's place."""
        if not self.items:
            return f"batch {self.batch_id}"
        many = "items" if min(self.items) != max(self.items) else "item"
        return f"batch {self.batch_id} · {many} {self._range()}"

    def summary(self) -> dict[str, str]:
        """``{"batch": ID, "items": "101-200 of 1000"}``: the start of a chunk's result."""
        return {"batch": self.batch_id, "items": self._range() if self.items else ""}

    def item(self, index: int) -> str:
        """``batch ID · item 117 of 1000``: the place of the chunk's request at ``index``."""
        return f"batch {self.batch_id} · item {self.items[index]}{self._of()}"


def chunk_repr(bodies: list[Any], context: ChunkContext | None = None) -> str:
    """What Flower shows of a batch chunk: its skills and tools (how many each), its place.

    ``local/text-tools local/word-count x97, test/basic test/crash x3 · batch ID ·
    items 101-200 of 1000``; argument values never.
    """
    counts = Counter(
        f"{_name(b.get('skill'))} {_name(b.get('tool'))}" if isinstance(b, dict) else REDACTED
        for b in bodies
    )
    tools = [f"{name} x{n}" for name, n in counts.most_common(_TOOLS_SHOWN)]
    if len(counts) > _TOOLS_SHOWN:
        tools.append(f"+{len(counts) - _TOOLS_SHOWN} more")
    parts = [", ".join(tools) or "no invocations"]
    if context is not None:
        parts.append(context.describe())
    return _cut(" · ".join(parts), REPR_MAX_CHARS)


def item_repr(body: Any, context: ChunkContext | None, index: int) -> str:
    """What Flower shows of one invocation of a chunk: its request, then its place."""
    shown = redacted_repr(body)
    return shown if context is None else _cut(f"{shown} · {context.item(index)}", REPR_MAX_CHARS)


def result_payload(result: SkillResult, request_id: str) -> dict[str, Any]:
    """A ``SkillResult`` as stored: its fields plus ``request_id``."""
    payload = result.model_dump(mode="json")
    payload["request_id"] = request_id
    return payload


def failure_summary(result: SkillResult, arguments: Any = None) -> str:
    """``error_type: message`` of a failed result, on one line.

    With ``arguments``, every argument string of four characters or more in the message
    is blanked out (a tool's own error message may quote what it was given): this is
    what Flower shows, while the stored result keeps the message as it was.
    """
    error = result.error
    if error is None:
        return "failed"
    summary = f"{error.error_type}: {error.message}".replace("\n", " ")
    return blank_arguments(summary, arguments, REDACTED)


def _unreadable(request_id: str, why: str) -> dict[str, Any]:
    result = failed_result(
        "", "", SkillErrorType.TOOL_EXECUTION_FAILURE, why, {"request_id": request_id}
    )
    return result_payload(result, request_id)


def _hard_time_limit(request_id: str, args: Any) -> dict[str, Any]:
    """Celery's own record of a task its hard time limit ended (a worker without our handler)."""
    limit = args[0] if isinstance(args, list | tuple) and args else None
    details: dict[str, Any] = {"reason": "timeout", "exception_type": "TimeLimitExceeded"}
    if isinstance(limit, int | float) and not isinstance(limit, bool):
        details["hard_limit_s"] = limit
    details["request_id"] = request_id
    result = failed_result(
        "",
        "",
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        "the tool did not stop at its timeout: its worker process was ended by the hard "
        "time limit",
        details,
    )
    return result_payload(result, request_id)


def stored_payload(value: Any, request_id: str = "") -> dict[str, Any]:
    """The ``SkillResult`` payload in what Celery stored: a return value or a failure.

    The one decoder of stored failure envelopes: ``SkillInvocationFailed`` (as
    raised, as rebuilt by Celery under another class, or as its stored
    ``exc_type``/``exc_message`` dict), Celery's ``TimeLimitExceeded`` (a hard time
    limit), or a plain payload. Anything else is a ``tool_execution_failure`` saying
    what was found. A payload is returned as stored, not validated (batch reads
    decode thousands at a time).
    """
    if isinstance(value, SkillInvocationFailed):
        return value.payload
    if isinstance(value, BaseException):
        args: tuple[Any, ...] = tuple(getattr(value, "args", ()))
        if len(args) == 2 and isinstance(args[1], dict):
            return args[1]  # SkillInvocationFailed rebuilt by Celery under another class
        if type(value).__name__ == _TIME_LIMIT:
            return _hard_time_limit(request_id, args)
        return _unreadable(request_id, f"the task failed outside the runtime: {value!r}")
    if isinstance(value, dict) and "exc_type" in value:
        message = value.get("exc_message")
        if isinstance(message, list | tuple) and len(message) == 2 and isinstance(message[1], dict):
            return message[1]
        if value.get("exc_type") == _TIME_LIMIT:
            return _hard_time_limit(request_id, message)
        return _unreadable(request_id, f"the task failed outside the runtime: {value}")
    if not isinstance(value, dict):
        return _unreadable(
            request_id, f"stored result is not a SkillResult: {type(value).__name__}"
        )
    return value


def result_from_stored(value: Any, request_id: str = "") -> SkillResult:
    """Rebuild a ``SkillResult`` from what Celery stored (a payload, or the failure)."""
    return SkillResult.model_validate(stored_payload(value, request_id))


def retry_pending(
    attempt: int, error_type: str | None, delay_s: float, now: float | None = None
) -> Retry:
    """What a failed attempt that is tried again stores as its RETRY state: which
    attempt failed, and when the next is due (``Retry.when``, UTC ISO 8601)."""
    due = time.gmtime((time.time() if now is None else now) + delay_s)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", due)
    said = f" ({error_type})" if error_type else ""
    message = f"attempt {attempt} failed{said}; attempt {attempt + 1} is due at {when}"
    pending = Retry(message)
    # Celery's Retry keeps itself as its first argument, which a JSON result backend
    # stores as its repr: with its own words as arguments it reads back whole, its due
    # time (as text) as its ``when``.
    pending.args = (message, None, when)
    return pending


def retry_note(stored: Any) -> tuple[str, str | None] | None:
    """The message and due time of a stored RETRY state (``retry_pending``'s), if it has them."""
    if not isinstance(stored, Retry) or not isinstance(stored.message, str):
        return None
    if not stored.message.startswith("attempt "):  # an older worker's: Celery's repr
        return None
    when = getattr(stored, "when", None)  # text, read back from the stored arguments
    return stored.message, when if isinstance(when, str) else None
