"""What the runtime tests share: helpers, schemas and time-outs of the hanging tools."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from cleveragents.runtime import (
    invoke,
)
from cleveragents.skills import (
    Catalogue,
    SkillErrorType,
    SkillResult,
)
from tests.fixtures.catalogues import (
    py_tool,
    request,
    single,
)

#: Timeout of the tests' hanging tools, and how much later than it they must be stopped.
TIMEOUT_S = 0.3
SLACK_S = 0.5

WORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
COUNT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"count": {"type": "integer"}},
    "required": ["count"],
}


def run(req: Any, cat: Catalogue, **options: Any) -> SkillResult:
    """Invoke, and check what every result must satisfy: it travels as JSON."""
    result = invoke(req, cat, **options)
    assert isinstance(result, SkillResult)
    json.loads(result.model_dump_json())
    # ... and as UTF-8 text, as the CLI writes it (a lone surrogate cannot be)
    json.dumps(result.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")
    assert result.duration_ms > 0
    if result.success:
        assert result.error is None
    else:
        assert result.error is not None
        assert "Traceback" not in result.error.message
    return result


def failed(result: SkillResult, error_type: SkillErrorType) -> dict[str, Any]:
    """Assert the result failed with ``error_type``; return the error's details."""
    assert not result.success, result
    assert result.error is not None
    assert result.error.error_type == error_type, result.error
    assert result.error.skill_name == result.skill_name
    return result.error.details


def gone(pid: int) -> bool:
    """True when the process no longer runs (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def wait_until_gone(pid: int, within_s: float = 2.0) -> bool:
    """Wait a little for a killed process to disappear."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


def still_usable(cat: Catalogue | None = None) -> None:
    """A timed-out tool leaves nothing behind: later invocations and plain code run normally."""
    cat = cat or single(py_tool("test/ok", "ok"))
    result = run(request("test/ok"), cat)
    assert result.success, result
    assert result.output_data == {"ok": True}
    # A stray interruption (a timer or watchdog left armed) would surface in this loop.
    end = time.monotonic() + 0.2
    spins = 0
    while time.monotonic() < end:
        spins += 1
    assert spins > 0


def in_thread(req: Any, cat: Catalogue) -> tuple[SkillResult, float]:
    """Invoke from a thread that is not the main thread; return the result and elapsed time."""
    box: dict[str, Any] = {}

    def target() -> None:
        started = time.monotonic()
        box["result"] = invoke(req, cat)
        box["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=target, name="not-main", daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the tool was never stopped"
    return box["result"], box["elapsed"]
