"""``invoke``: one request in, one ``SkillResult`` out, whatever happens in between."""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cleveragents.approvals.model import AwaitingApproval
from cleveragents.constants import MAX_NESTING_DEPTH, MAX_REQUEST_BYTES
from cleveragents.errors import (
    SchemaValidationError,
    SkillErrorType,
    ToolExecutionError,
    ToolOutputTooLarge,
)
from cleveragents.runtime.deadline import ToolTimeout
from cleveragents.runtime.gating import check_write_gates
from cleveragents.runtime.kinds import run_tool
from cleveragents.runtime.outcomes import (
    WRITE_NOT_STARTED,
    WRITE_UNKNOWN,
    failed_result,
    failed_with,
    names_of,
    with_write_outcome,
)
from cleveragents.runtime.output import ToolOutput
from cleveragents.runtime.output_limit import MAX_OUTPUT_BYTES, default_output_limit, output_limit
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.runtime.text import holds_lone_surrogate, lone_surrogate
from cleveragents.runtime.validation import validate
from cleveragents.skills import (
    Catalogue,
    ResolvedToolEntry,
    SkillDefinition,
    SkillError,
    SkillResult,
    ToolSpec,
    map_tool_error,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_OUTPUT_BYTES",
    "BeforeWrite",
    "RunHooks",
    "claims_write",
    "effective_timeout",
    "invoke",
    "nested_deeper",
    "parse_request",
    "read_json",
    "timeout_of",
]

#: A tool's timeout when neither the tool nor the request sets one (CLEVERAGENTS_DEFAULT_TIMEOUT_S).
DEFAULT_TIMEOUT_S = 300.0
#: No invocation's timeout goes past this, whatever the request says (CLEVERAGENTS_MAX_TIMEOUT_S).
MAX_TIMEOUT_S = 3600.0
#: A hook called right before a write-capable, non-idempotent tool starts.
BeforeWrite = Callable[[SkillInvocationRequest, ToolSpec, float], None]
#: Told of a request and its tool: at a point of the run (``RunHooks``).
RunHook = Callable[[SkillInvocationRequest, ToolSpec], None]
_ACTIONS = frozenset({"created", "changed", "deleted"})


@dataclass(frozen=True)
class RunHooks:
    """What a worker does around a run, beyond the write claim (``before_write``).

    ``on_found`` is called once the tool is found, before its gates (the catalogue is
    asked once per run: the caller learns the tool here). ``before_start`` is called
    once the gates and validation passed, before the claim: what it raises becomes
    the result and the tool does not start, but for ``AwaitingApproval``, which
    ``invoke`` raises (the invocation is parked, it has no result). ``on_start`` is
    called right before the tool starts.
    """

    on_found: RunHook | None = None
    before_start: RunHook | None = None
    on_start: RunHook | None = None


_NO_HOOKS = RunHooks()


@dataclass
class _Progress:
    """How far a run got: its tool, once found, and whether a write may have begun."""

    tool: ToolSpec | None = None
    #: The write's claim was asked for (another run may hold it) or the tool started.
    began: bool = False

    def write_outcome(self, allow_writes: bool) -> str | None:
        """What a failure says of the write (None: the run was no write)."""
        if self.tool is None:  # never found: nothing ran
            return WRITE_NOT_STARTED if allow_writes else None
        if not self.tool.write_capable:
            return None
        return WRITE_UNKNOWN if self.began else WRITE_NOT_STARTED


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _invalid_request(raw: Any, reason: str, details: dict[str, Any], started: float) -> SkillResult:
    skill, tool = names_of(raw)
    return failed_result(
        skill,
        tool,
        SkillErrorType.VALIDATION_ERROR,
        reason,
        details,
        duration_ms=_elapsed_ms(started),
    )


def _describe(exc: ValidationError) -> tuple[str, list[dict[str, str]]]:
    problems = [
        {"path": ".".join(str(p) for p in e["loc"]) or "request", "message": _plain(e)}
        for e in exc.errors(include_url=False)
    ]
    return "invalid request: " + "; ".join(
        f"{p['path']}: {p['message']}" for p in problems
    ), problems


def _plain(error: Any) -> str:
    """pydantic's message, or for a field the request does not have (``alow_writes``)
    what it is and the field meant, as a skill file's unknown key is said."""
    loc: tuple[Any, ...] = tuple(error.get("loc") or ())
    if error.get("type") != "extra_forbidden" or len(loc) != 1:
        return str(error["msg"])
    fields = list(SkillInvocationRequest.model_fields)
    close = difflib.get_close_matches(str(loc[0]), fields, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    return f"unknown field; a request has {', '.join(fields)}"


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` holds objects or arrays more than ``limit`` deep (itself: 1).

    Walked without recursion, so that no depth breaks it; scalars cost a type check.
    Objects are dicts (what JSON can encode), arrays lists or tuples.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend(
            (child, depth + 1) for child in children if isinstance(child, dict | list | tuple)
        )
    return False


def read_json(text: str) -> Any:
    """``json.loads`` of text a producer wrote; nested too deep for the parser's stack is
    a ``json.JSONDecodeError`` like any other text that is not JSON (not a RecursionError).
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError(
            f"nested more than {MAX_NESTING_DEPTH} objects or arrays deep", text, 0
        ) from None


_NOT_UNICODE = (
    "invalid request: {where} holds half of a surrogate pair (a JSON escape such as "
    "\\ud800 without its other half), which is not Unicode text"
)


def _refuse_lone_surrogates(raw: Mapping[str, Any]) -> None:
    """Refuse a request whose fields (names, id, keys) hold text UTF-8 cannot hold.

    The arguments are checked once validated, with their size.
    """
    for key, value in raw.items():
        if isinstance(key, str) and lone_surrogate(key):
            raise SchemaValidationError(_NOT_UNICODE.format(where="a field's name"))
        if isinstance(value, str) and lone_surrogate(value):
            where = key if key in ("skill", "tool", "request_id") else "a field"
            raise SchemaValidationError(_NOT_UNICODE.format(where=where))


def parse_request(
    raw: SkillInvocationRequest | Mapping[str, Any] | Any, *, max_bytes: int = MAX_REQUEST_BYTES
) -> SkillInvocationRequest:
    """Validate a request (a model or a dict of the wire shape).

    Raises:
        SchemaValidationError: not a valid request, or its arguments are larger than ``max_bytes``.
    """
    if isinstance(raw, SkillInvocationRequest):
        request = raw
    else:
        if not isinstance(raw, Mapping):
            raise SchemaValidationError(
                f"invalid request: expected a JSON object, got {type(raw).__name__}",
                details={"exception_type": "ValidationError"},
            )
        _refuse_lone_surrogates(raw)
        try:
            request = SkillInvocationRequest.model_validate(dict(raw))
        except ValidationError as exc:
            message, problems = _describe(exc)
            raise SchemaValidationError(message, details={"errors": problems}) from None
    if nested_deeper(request.arguments, MAX_NESTING_DEPTH):
        raise SchemaValidationError(
            f"arguments are nested more than {MAX_NESTING_DEPTH} objects or arrays deep",
            details={"limit": MAX_NESTING_DEPTH},
        )
    try:
        text = json.dumps(request.arguments, separators=(",", ":"), default=str)
    except (ValueError, RecursionError) as exc:  # a circular or absurdly deep structure
        raise SchemaValidationError(
            f"invalid request: arguments cannot be encoded as JSON: {exc}"
        ) from None
    # ASCII: a lone surrogate shows as its escape (a string may also spell one out)
    if "\\ud" in text and holds_lone_surrogate(request.arguments):
        raise SchemaValidationError(_NOT_UNICODE.format(where="arguments"))
    size = len(text)
    if size > max_bytes:
        raise SchemaValidationError(
            f"arguments are {size} bytes of JSON, more than the limit of {max_bytes}",
            details={"size": size, "limit": max_bytes},
        )
    return request


def timeout_of(
    tool_s: float | None, request_s: float | None, default: float, maximum: float = MAX_TIMEOUT_S
) -> float:
    """The smaller of the tool's and the request's timeouts, where given, else ``default``.

    Never more than ``maximum``: a producer does not set the worker's clock. The one
    place this rule lives: the runtime's deadline and the worker's hard time limit
    (``cleveragents/worker/time_limits.py``) both come from it.
    """
    given = [t for t in (tool_s, request_s) if t is not None]
    return min(min(given) if given else default, maximum)


def effective_timeout(
    entry: ResolvedToolEntry,
    request: SkillInvocationRequest,
    default: float,
    maximum: float = MAX_TIMEOUT_S,
) -> float:
    """``timeout_of`` a resolved tool and a parsed request."""
    return timeout_of(entry.tool.timeout_s, request.timeout_s, default, maximum)


def claims_write(tool: ToolSpec) -> bool:
    """Whether a run of ``tool`` is claimed before it starts (``before_write``): a write
    that is not idempotent. The worker's hard time limit counts the wait for a claim."""
    return tool.write_capable and not tool.idempotent


def _check_changes(changes: Any) -> list[dict[str, Any]]:
    if not isinstance(changes, list | tuple) or not all(
        isinstance(c, dict) and c.get("action") in _ACTIONS and isinstance(c.get("resource"), str)
        for c in changes
    ):
        raise SchemaValidationError(
            "resource changes must be dicts with action (created, changed or deleted) "
            "and resource (a string)"
        )
    return list(changes)


def _run(
    entry: ResolvedToolEntry, arguments: dict[str, Any], timeout_s: float, max_output_bytes: int
) -> tuple[Any, list[dict[str, Any]]]:
    with output_limit(max_output_bytes):  # what the kinds read (runtime/output_limit.py)
        value = run_tool(entry.tool, arguments, timeout_s)
    if isinstance(value, ToolOutput):
        return value.data, _check_changes(value.resource_changes)
    return value, []


def _as_json(value: Any, tool: str, what: str, budget: int, limit: int) -> tuple[Any, int]:
    """``value`` as the JSON wire will carry it (tuples become lists, keys strings), and its size.

    Raises:
        ToolExecutionError: not JSON-serialisable, or nested past ``MAX_NESTING_DEPTH``.
        ToolOutputTooLarge: more than ``budget`` bytes of JSON.
    """
    if nested_deeper(value, MAX_NESTING_DEPTH):
        raise ToolExecutionError(
            f"tool {tool!r} returned {what} nested more than {MAX_NESTING_DEPTH} objects or "
            "arrays deep",
            details={"limit": MAX_NESTING_DEPTH},
        )
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolExecutionError(
            f"tool {tool!r} returned {what} that is not JSON-serialisable: {exc}",
            details={"output_type": type(value).__name__},
        ) from None
    if "\\ud" in text and holds_lone_surrogate(value):  # ASCII: escaped, if any
        raise ToolExecutionError(
            f"tool {tool!r} returned {what} holding half of a surrogate pair, which is not "
            "Unicode text (no file, log or store can hold it)"
        )
    if len(text) > budget:  # ASCII (ensure_ascii): characters are bytes
        raise ToolOutputTooLarge(tool, what, limit)
    return json.loads(text), len(text)


def _error(exc: BaseException, skill: str, tool: str) -> SkillError:
    error = map_tool_error(exc, skill_name=skill, tool_name=tool)
    # A tool's own exception arrives wrapped in ToolExecutionError: keep its class name.
    raised = getattr(exc, "details", {}).get("exception_type")
    if isinstance(exc, ToolExecutionError) and isinstance(raised, str):
        error = error.model_copy(update={"details": {**error.details, "exception_type": raised}})
    return error


def _execute(
    definition: SkillDefinition,
    entry: ResolvedToolEntry,
    request: SkillInvocationRequest,
    *,
    read_only: bool,
    default_timeout_s: float,
    max_timeout_s: float,
    max_output_bytes: int,
    before_write: BeforeWrite | None,
    hooks: RunHooks,
    progress: _Progress,
) -> tuple[Any, list[dict[str, Any]]]:
    tool = progress.tool = entry.tool
    if hooks.on_found is not None:
        hooks.on_found(request, tool)
    check_write_gates(definition, tool, allow_writes=request.allow_writes, read_only=read_only)
    validate(tool.input_schema, request.arguments, root="arguments", source="tool input_schema")
    validate(
        definition.input_schema, request.arguments, root="arguments", source="skill input_schema"
    )
    timeout_s = effective_timeout(entry, request, default_timeout_s, max_timeout_s)
    if hooks.before_start is not None:
        hooks.before_start(request, tool)
    # From here a failure may come after a write began: this run's, or the run that holds
    # its claim (a claim refused says what became of that run).
    progress.began = True
    if before_write is not None and claims_write(tool):
        before_write(request, tool, timeout_s)
    if hooks.on_start is not None:
        hooks.on_start(request, tool)
    data, changes = _run(entry, request.arguments, timeout_s, max_output_bytes)
    # Output and resource changes together stay within the limit: nothing larger is stored.
    data, size = _as_json(data, tool.name, "output", max_output_bytes, max_output_bytes)
    if changes:
        changes, _ = _as_json(
            changes,
            tool.name,
            "output and resource changes",
            max_output_bytes - size,
            max_output_bytes,
        )
    validate(tool.output_schema, data, root="output", source="tool output_schema")
    validate(definition.output_schema, data, root="output", source="skill output_schema")
    return data, changes


def invoke(
    request: SkillInvocationRequest | Mapping[str, Any],
    catalogue: Catalogue,
    *,
    read_only: bool = False,
    default_timeout_s: float = DEFAULT_TIMEOUT_S,
    max_timeout_s: float = MAX_TIMEOUT_S,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    max_output_bytes: int | None = None,
    before_write: BeforeWrite | None = None,
    hooks: RunHooks = _NO_HOOKS,
    found: tuple[SkillDefinition, ResolvedToolEntry] | Exception | None = None,
) -> SkillResult:
    """Run one invocation and return its ``SkillResult``; never raises (but KeyboardInterrupt,
    and ``AwaitingApproval`` from ``hooks``: the invocation was parked).

    ``found``: the catalogue's lookup of the request's skill and tool, where the caller
    made it already (used only when it names them both: it is not made again), or the
    error that lookup raised.

    Order: resolve the skill, find the tool, apply the write gates, validate the arguments,
    run the tool (stopped at its timeout, never more than ``max_timeout_s``; output over
    ``max_output_bytes``, None: the process default, is refused), validate the output.
    ``before_write(request, tool, timeout_s)`` is called right before a
    write-capable tool that is not idempotent starts; what it raises becomes the
    result, and the tool does not start (the worker's at-most-once claim).
    """
    started = time.perf_counter()
    parsed = _parsed(request, max_request_bytes, started)
    if isinstance(parsed, SkillResult):
        return parsed  # not a valid request
    skill, tool = parsed.skill, parsed.tool
    progress = _Progress()
    try:
        definition, entry = _looked_up(catalogue, skill, tool, found)
        data, changes = _execute(
            definition, entry, parsed, read_only=read_only,
            default_timeout_s=default_timeout_s, max_timeout_s=max_timeout_s,
            max_output_bytes=max_output_bytes or default_output_limit(),
            before_write=before_write, hooks=hooks, progress=progress,
        )  # fmt: skip
    except AwaitingApproval:
        raise
    except (Exception, SystemExit, ToolTimeout) as exc:  # every outcome becomes a SkillResult
        return _failure(exc, parsed, progress, started)
    return SkillResult(
        skill_name=skill, tool_name=tool, success=True, output_data=data,
        duration_ms=_elapsed_ms(started), resource_changes=changes,
    )  # fmt: skip


def _looked_up(
    catalogue: Catalogue,
    skill: str,
    tool: str,
    found: tuple[SkillDefinition, ResolvedToolEntry] | Exception | None,
) -> tuple[SkillDefinition, ResolvedToolEntry]:
    """The skill and tool a request names: the caller's lookup where it names them both
    (or the error it raised), else the catalogue's."""
    if isinstance(found, Exception):
        raise found
    if found is not None and found[0].skill.name == skill and found[1].tool.name == tool:
        return found
    return catalogue.find_tool(skill, tool)


def _parsed(
    request: SkillInvocationRequest | Mapping[str, Any], max_bytes: int, started: float
) -> SkillInvocationRequest | SkillResult:
    """The request validated, or the ``validation_error`` result that says why it is not."""
    try:
        return parse_request(request, max_bytes=max_bytes)
    except SchemaValidationError as exc:
        return _invalid_request(
            request, str(exc), {**exc.details, "exception_type": type(exc).__name__}, started
        )


def _failure(
    exc: BaseException, parsed: SkillInvocationRequest, progress: _Progress, started: float
) -> SkillResult:
    """The failed result of ``exc``, saying whether a write it cut off may have happened."""
    skill, tool = parsed.skill, parsed.tool
    failed = failed_with(_error(exc, skill, tool), skill, tool, duration_ms=_elapsed_ms(started))
    outcome = progress.write_outcome(parsed.allow_writes)
    return failed if outcome is None else with_write_outcome(failed, outcome)
