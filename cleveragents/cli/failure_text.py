"""What a person should read under a failed invocation: its cause, and the fix it names.

The CLI (and any other front end) shows ``failure_lines(result)``: the error type
and message, then what details hold that a message does not (a command tool's last
lines of stderr, as stored: short and redacted), then the fix for the refusals and
limits a user can do something about.
"""

from __future__ import annotations

from typing import Any

from cleveragents.runtime.gating import GATE_REQUEST, GATE_SKILL_READ_ONLY, GATE_WORKER_READ_ONLY
from cleveragents.runtime.outcomes import UNKNOWN_WRITE_ADVICE, WRITE_UNKNOWN
from cleveragents.skills import SkillError, SkillResult

__all__ = ["STDERR_LINES_SHOWN", "failure_lines", "fix_for"]

#: How many of a command tool's last stderr lines are shown under its failure.
STDERR_LINES_SHOWN = 5

_GATE_FIXES = {
    GATE_REQUEST: "the tool writes: add --allow-writes (allow_writes: true in a request)",
    GATE_WORKER_READ_ONLY: "the worker runs read-only (CLEVERAGENTS_READ_ONLY=1): "
    "send writes to a worker that may write",
    GATE_SKILL_READ_ONLY: "the skill is read-only (read_only: true): "
    "call the tool through a skill that may write",
}
_REASON_FIXES = {
    "timeout": "the tool ran past its timeout: raise timeout_s on the tool or the request "
    "(at most CLEVERAGENTS_MAX_TIMEOUT_S on the worker)",
    "output_too_large": "the tool's output is over CLEVERAGENTS_MAX_OUTPUT_BYTES: return "
    "less, or raise the limit on the worker",
    "poison_message": "the invocation ended its worker process at every delivery: run the "
    "tool by hand to see why",
    "request_id_reused": "give this request a request id of its own (or none: a new one is "
    "made); `cleveragents result ID` shows what the id already answers",
}
_TYPE_FIXES = {
    "skill_not_found": "`cleveragents skills list` shows the catalogue "
    "(the worker's is CLEVERAGENTS_CATALOGUE)",
    "tool_activation_failure": "`cleveragents skills check` validates the catalogue; the "
    "worker's log says why the tool could not be loaded",
}


def _catalogue_fix(details: dict[str, Any]) -> str | None:
    """A skill not found because the worker's catalogue is missing or broken."""
    missing = details.get("missing_catalogue_paths")
    if isinstance(missing, list) and missing:
        paths = ", ".join(str(p) for p in missing)
        return (
            f"the worker's catalogue path {paths} does not exist: point CLEVERAGENTS_CATALOGUE "
            "at your skill files or folders (`cleveragents skills check` validates them)"
        )
    if details.get("catalogue_load_problems"):
        return (
            "some of the worker's skill files do not load: `cleveragents skills check` "
            "(with the worker's CLEVERAGENTS_CATALOGUE) lists each problem with its file and line"
        )
    return None


def fix_for(error: SkillError) -> str | None:
    """The one-line fix for ``error``, where there is one a user can apply."""
    details: dict[str, Any] = error.details or {}
    guess = details.get("did_you_mean")
    if error.error_type == "skill_not_found":
        fix = _catalogue_fix(details)
        if fix:
            return fix
        if isinstance(guess, str):
            return f"use {guess!r} as the skill (`cleveragents skills list` shows the catalogue)"
    if error.error_type == "resolution_failure" and error.skill_name:
        if isinstance(guess, str):
            return (
                f"use {guess!r} as the tool "
                f"(`cleveragents skills show {error.skill_name}` lists its tools)"
            )
        return (
            f"`cleveragents skills show {error.skill_name}` lists its tools; "
            "`cleveragents skills check` finds broken includes"
        )
    tool_user = details.get("tool_user")
    if isinstance(tool_user, str):
        return (
            f"the tool ran as {tool_user!r} (a root worker runs command tools as that user): "
            f"give {tool_user!r} access to the files and programs it needs (a folder it may "
            "read and write, an interpreter outside root's home), or set "
            "CLEVERAGENTS_TOOL_USER on the worker to a user who has it"
        )
    gate = details.get("gate")
    if isinstance(gate, str) and gate in _GATE_FIXES:
        return _GATE_FIXES[gate]
    reason = details.get("reason")
    if isinstance(reason, str) and reason in _REASON_FIXES:
        return _REASON_FIXES[reason]
    return _TYPE_FIXES.get(str(error.error_type))


def failure_lines(result: SkillResult, request_id: str) -> list[str]:
    """What to print for a failed invocation: cause first (with how many attempts ran,
    where it was retried), then stderr, then the fix."""
    error = result.error
    if error is None:
        return [f"{request_id} failed"]
    attempts = (error.details or {}).get("attempts")
    tried = f" after {attempts} attempts" if isinstance(attempts, int) and attempts > 1 else ""
    lines = [f"{request_id} failed{tried} ({error.error_type}): {error.message}"]
    tail = (error.details or {}).get("stderr_tail")
    if isinstance(tail, str) and tail.strip():
        shown = tail.strip().splitlines()[-STDERR_LINES_SHOWN:]
        lines.append("stderr (last lines):")
        lines += [f"  {line}" for line in shown]
    if (error.details or {}).get("write_outcome") == WRITE_UNKNOWN:
        lines.append(f"fix: {UNKNOWN_WRITE_ADVICE}")  # first: the mistake that costs most
    fix = fix_for(error)
    if fix:
        lines.append(f"fix: {fix}")
    return lines
