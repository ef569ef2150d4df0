"""The hard time limit the worker sets on every task, and how its failure reads (issue 12).

Through a real worker: tests/faults/test_hostile_tools.py. Here: the arithmetic, the
settings, and what a producer makes of Celery's own record of a hard time-out.
"""

from __future__ import annotations

import pytest
from billiard.exceptions import TimeLimitExceeded

from cleveragents.constants import HARD_LIMIT_GRACE_S, TASK_INVOKE, TASK_INVOKE_CHUNK
from cleveragents.errors import ConfigurationError
from cleveragents.messages import result_from_stored
from cleveragents.pipeline import chunk
from cleveragents.pipeline.chunk import STAY_S, TAIL_S
from cleveragents.pipeline.guard import CLAIM_GRACE_S
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType, ToolSpec
from cleveragents.worker.time_limits import chunk_budget_s, hard_limit_s, invocation_budget_s
from tests.fixtures.catalogues import SKILL, single

CATALOGUE = single(
    ToolSpec(name="test/quick", source="python", entrypoint="m:f", timeout_s=2),
    ToolSpec(name="test/open", source="python", entrypoint="m:f"),
    ToolSpec(name="test/write", source="python", entrypoint="m:f", timeout_s=2, writes=True),
    ToolSpec(
        name="test/write-again",
        source="python",
        entrypoint="m:f",
        timeout_s=2,
        writes=True,
        idempotent=True,
    ),
)
SETTINGS = Settings.from_env({"CLEVERAGENTS_DEFAULT_TIMEOUT_S": "30"})


def body(tool: str, **fields: object) -> dict[str, object]:
    return {"skill": SKILL, "tool": tool, "arguments": {}, **fields}


def test_an_invocations_hard_limit_is_its_timeout_plus_the_grace() -> None:
    assert hard_limit_s(TASK_INVOKE, [body("test/quick")], CATALOGUE, SETTINGS) == (
        2 + HARD_LIMIT_GRACE_S
    )
    assert hard_limit_s(TASK_INVOKE, [body("test/open")], CATALOGUE, SETTINGS) == (
        30 + HARD_LIMIT_GRACE_S
    )


def test_the_request_can_shorten_the_timeout_but_never_lengthen_it() -> None:
    shorter = body("test/quick", timeout_s=0.5)
    longer = body("test/quick", timeout_s=1e9)
    assert invocation_budget_s(shorter, CATALOGUE, SETTINGS) == 0.5
    assert invocation_budget_s(longer, CATALOGUE, SETTINGS) == 2
    capped = Settings.from_env({"CLEVERAGENTS_MAX_TIMEOUT_S": "10"})
    assert invocation_budget_s(body("test/open", timeout_s=1e9), CATALOGUE, capped) == 10


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "x",
        [],
        {"skill": "nope/nope", "tool": "x"},
        body("test/missing"),
        body("test/quick", timeout_s="soon"),
        body("test/quick", timeout_s=True),
    ],
)
def test_what_is_not_a_known_tool_gets_the_default_or_the_tools_own(raw: object) -> None:
    budget = invocation_budget_s(raw, CATALOGUE, SETTINGS)
    assert budget in (2, 30)


def test_a_write_that_may_wait_for_an_earlier_claim_gets_the_claims_grace_too() -> None:
    assert invocation_budget_s(body("test/write"), CATALOGUE, SETTINGS) == 2 + CLAIM_GRACE_S
    assert invocation_budget_s(body("test/write-again"), CATALOGUE, SETTINGS) == 2


def test_a_chunks_budget_is_its_stay_its_tail_and_its_longest_invocation() -> None:
    assert chunk_budget_s([1, 2, 3, 4, 5], stay_s=0.5, tail_s=0.25) == 0.5 + 0.25 + 5
    assert chunk_budget_s([3] * 500, stay_s=0.5, tail_s=0.25) == 0.5 + 0.25 + 3
    assert chunk_budget_s([], stay_s=0.5, tail_s=0.25) == 0.75


def test_a_chunk_message_gets_a_limit_that_covers_its_invocations() -> None:
    bodies = [body("test/quick") for _ in range(3)] + [body("test/open")]

    limit = hard_limit_s(TASK_INVOKE_CHUNK, [bodies], CATALOGUE, SETTINGS)

    assert limit >= 30 + HARD_LIMIT_GRACE_S  # at least the longest one, wherever it falls
    # ... and the time a chunk may stay in its process and start one more, but not
    # each one's in turn: a chunk starts nothing later than TAIL_S past its slices
    assert limit == STAY_S + TAIL_S + 30 + HARD_LIMIT_GRACE_S


def test_a_chunks_limit_weighs_only_the_items_it_may_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Past MAX_CHUNK_ITEMS a chunk sends its items back unrun (pipeline/chunk.py): a
    # raw message of 200,000 items costs the worker's main process no more than that
    monkeypatch.setattr(chunk, "MAX_CHUNK_ITEMS", 3)
    bodies = [body("test/quick") for _ in range(3)] + [body("test/open")]

    limit = hard_limit_s(TASK_INVOKE_CHUNK, [bodies], CATALOGUE, SETTINGS)

    assert limit == STAY_S + TAIL_S + 2 + HARD_LIMIT_GRACE_S


def test_a_malformed_chunk_gets_the_grace_alone() -> None:
    assert hard_limit_s(TASK_INVOKE_CHUNK, "nonsense", CATALOGUE, SETTINGS) <= (
        1 + HARD_LIMIT_GRACE_S
    )


@pytest.mark.parametrize(
    "stored",
    [
        TimeLimitExceeded(7.0),
        {
            "exc_type": "TimeLimitExceeded",
            "exc_message": [7.0],
            "exc_module": "billiard.exceptions",
        },
    ],
    ids=["exception", "meta"],
)
def test_celerys_own_record_of_a_hard_time_out_reads_as_a_time_out(stored: object) -> None:
    result = result_from_stored(stored, "r-1")

    assert not result.success
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert result.error.details["reason"] == "timeout"
    assert result.error.details["hard_limit_s"] == 7.0
    assert "outside the runtime" not in result.error.message


def test_the_new_settings_are_read_and_checked() -> None:
    settings = Settings.from_env(
        {"CLEVERAGENTS_MAX_OUTPUT_BYTES": "1_000", "CLEVERAGENTS_TOOL_USER": " nobody "}
    )
    assert (settings.max_output_bytes, settings.tool_user) == (1000, "nobody")
    defaults = Settings.from_env({})
    assert (defaults.max_output_bytes, defaults.tool_user) == (10_000_000, None)
    for bad in ("0", "-5", "ten", "1.5"):
        with pytest.raises(ConfigurationError, match="CLEVERAGENTS_MAX_OUTPUT_BYTES"):
            Settings.from_env({"CLEVERAGENTS_MAX_OUTPUT_BYTES": bad})
