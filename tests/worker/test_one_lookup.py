"""Each delivery looks its (skill, tool) up in the catalogue once in each process (issue 28).

The worker's main process looks the tool up when it admits the message, for the
hard time limit (``cleveragents/worker/time_limits.py``); the pool process when
the runtime runs it (``cleveragents/runtime/invoke.py``). Nothing else in either
process looks it up again: the guard is handed the tool and its timeout, and the
observer's metrics know the catalogue's names without asking it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.constants import TASK_INVOKE, TASK_INVOKE_CHUNK
from cleveragents.pipeline import Pipeline, execute, execute_chunk
from cleveragents.pipeline.guard import Guard
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue
from cleveragents.stores import Stores
from cleveragents.worker.invocation_report import WorkerObserver
from cleveragents.worker.time_limits import hard_limit_s
from tests.support.procs import FIXTURE_SKILLS

SKILL = "test/faults"
WRITE, IDEMPOTENT, READ = "test/write-once", "test/write-idempotent", "test/read"


def counted(catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The lookups made in ``catalogue`` from outside it, from now on (``find_tool`` and
    ``resolve``; the ``resolve`` inside a ``find_tool`` is part of that one lookup)."""
    lookups: list[tuple[str, ...]] = []
    inside = [False]

    def counting(method: Callable[..., Any]) -> Callable[..., Any]:
        def lookup(*names: str) -> Any:
            if inside[0]:
                return method(*names)
            lookups.append(names)
            inside[0] = True
            try:
                return method(*names)
            finally:
                inside[0] = False

        return lookup

    monkeypatch.setattr(catalogue, "find_tool", counting(catalogue.find_tool))
    monkeypatch.setattr(catalogue, "resolve", counting(catalogue.resolve))
    return lookups


@pytest.fixture
def catalogue() -> Catalogue:
    return Catalogue.from_paths(FIXTURE_SKILLS / "faults.yaml")


@pytest.fixture
def stores() -> Stores:
    return Stores.in_memory()


@pytest.fixture
def pipeline(catalogue: Catalogue, stores: Stores) -> Iterator[Pipeline]:
    """A pool process's pipeline, observed as a worker's is (log line and metrics)."""
    observer = WorkerObserver(stores.metrics, catalogue)
    yield Pipeline(catalogue, Guard(stores.guard, poll_s=0.01), stores.results, observe=observer)
    observer.close()


def body(tool: str, key: str, log: Path, **fields: Any) -> dict[str, Any]:
    return {
        "request_id": key,
        "skill": SKILL,
        "tool": tool,
        "arguments": {"path": str(log), "key": key},
        "allow_writes": tool != READ,
        **fields,
    }


@pytest.mark.parametrize("tool", [READ, IDEMPOTENT, WRITE])
@pytest.mark.parametrize("redelivered", [False, True])
def test_a_delivery_looks_its_tool_up_once_in_the_pool_process(
    catalogue: Catalogue,
    pipeline: Pipeline,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
    redelivered: bool,
) -> None:
    lookups = counted(catalogue, monkeypatch)
    for n in range(3):  # the first delivery of a tool, and the ones after it
        key = f"k-{n}"
        result = execute(
            pipeline,
            body(tool, key, tmp_path / "log", timeout_s=5),
            request_id=key,
            redelivered=redelivered,
        )
        assert result.success, result.error
        assert lookups == [(SKILL, tool)], f"delivery {n} looked up {lookups}"
        lookups.clear()


def test_an_unknown_tool_is_looked_up_once_too(
    catalogue: Catalogue, pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = counted(catalogue, monkeypatch)
    result = execute(
        pipeline, body("test/nope", "k", tmp_path / "log"), request_id="k", redelivered=False
    )
    assert result.error is not None
    assert result.error.error_type == "resolution_failure"
    assert lookups == [(SKILL, "test/nope")]


def test_each_invocation_of_a_chunk_looks_its_tool_up_once(
    catalogue: Catalogue, pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [body(READ if n % 2 else WRITE, f"c-{n}", tmp_path / "log") for n in range(8)]
    lookups = counted(catalogue, monkeypatch)
    requeued: list[list[Any]] = []
    report = execute_chunk(
        pipeline,
        bodies,
        chunk_id="chunk",
        redelivered=False,
        requeue=lambda rest, start, rest_id: requeued.append(rest),
    )
    ran = bodies[: report.ran]
    assert report.ran >= 1
    assert lookups == [(SKILL, b["tool"]) for b in ran]


def test_admitting_a_message_looks_each_tool_up_once_in_the_main_process(
    catalogue: Catalogue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env({})
    lookups = counted(catalogue, monkeypatch)
    hard_limit_s(TASK_INVOKE, [body(WRITE, "k", tmp_path / "log")], catalogue, settings)
    assert lookups == [(SKILL, WRITE)]
    lookups.clear()
    # A chunk names a few tools many times: each is looked up once.
    bodies = [body(READ if n % 2 else WRITE, f"c-{n}", tmp_path / "log") for n in range(10)]
    hard_limit_s(TASK_INVOKE_CHUNK, [bodies], catalogue, settings)
    assert sorted(lookups) == [(SKILL, READ), (SKILL, WRITE)]
