"""A tool kind from outside the package (``tests/fixtures/upper_kind.py``), end to end.

``CLEVERAGENTS_TOOL_KINDS`` names the module; a real worker imports it before
it loads its catalogue, and runs the kind's tools off a real Redis queue. The
CLI loads it before it reads a catalogue, and a module that cannot load is a
one-line error with exit code 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.skills import SkillErrorType
from tests.support.procs import Worker

pytestmark = pytest.mark.timeout(180)

StartWorker = Callable[..., Worker]
REPO = Path(__file__).resolve().parents[2]
#: The plugin's skills: a folder of their own, so no other test's catalogue needs the plugin.
PLUGIN_SKILLS = REPO / "tests" / "fixtures" / "plugin_skills"
PLUGIN = "tests.fixtures.upper_kind"
#: A plugin module that does not exist.
MISSING = "tests.fixtures.no_such_kind"


def test_a_worker_runs_a_tool_of_a_kind_from_a_plugin_module(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(
        redis_url,
        concurrency=1,
        CLEVERAGENTS_TOOL_KINDS=PLUGIN,
        CLEVERAGENTS_CATALOGUE=str(PLUGIN_SKILLS),
    )

    result = client.submit("plugin/text", "plugin/shout", {"text": "quiet please"}).result(
        timeout=30
    )

    assert result.success, result.error
    assert result.output_data == {"text": "QUIET PLEASE"}
    assert result.resource_changes == [{"action": "changed", "resource": "argument/text"}]


def test_a_plugin_kind_that_answers_after_its_deadline_times_out_through_the_queue(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(
        redis_url,
        concurrency=1,
        CLEVERAGENTS_TOOL_KINDS=PLUGIN,
        CLEVERAGENTS_CATALOGUE=str(PLUGIN_SKILLS),
    )

    result = client.submit("plugin/text", "plugin/late", {"text": "x"}).result(timeout=30)

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert result.error.message == "tool 'plugin/late' timed out after 0.3s and was stopped"
    assert result.error.details["reason"] == "timeout"
    assert result.error.details["timeout_s"] == 0.3


def test_without_the_plugin_a_worker_does_not_serve_its_skills(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(redis_url, concurrency=1, CLEVERAGENTS_CATALOGUE=str(PLUGIN_SKILLS))

    result = client.submit("plugin/text", "plugin/shout", {"text": "hi"}).result(timeout=30)

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.SKILL_NOT_FOUND
    assert "unknown tool source 'upper'; known: command, mcp, python" in worker.log.read_text()


def test_a_worker_whose_plugin_module_cannot_load_refuses_to_start(
    redis_url: str, start_worker: StartWorker
) -> None:
    # Rather than start and fail every invocation: the log says why, in one line.
    with pytest.raises(AssertionError, match="worker exited early") as failed:
        start_worker(redis_url, concurrency=1, CLEVERAGENTS_TOOL_KINDS=MISSING)

    assert (
        "cannot start: CLEVERAGENTS_TOOL_KINDS: cannot load tool kind module "
        "'tests.fixtures.no_such_kind': ModuleNotFoundError"
    ) in str(failed.value)
    assert "Traceback" not in str(failed.value)


# --------------------------------------------------------------------------- the CLI


def _cli(*args: str, kinds: str | None = None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "cleveragents"
    command = [str(script)] if script.exists() else [shutil.which("cleveragents") or "cleveragents"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env.pop("PYTHONPATH", None)  # the plugin is found in the current folder, as by a worker
    if kinds is not None:
        env["CLEVERAGENTS_TOOL_KINDS"] = kinds
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_skills_check_loads_the_plugin_kinds_before_the_catalogue() -> None:
    done = _cli("skills", "check", str(PLUGIN_SKILLS), kinds=PLUGIN)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skill resolves; ok" in done.stdout


def test_skills_list_shows_a_plugin_kind_as_a_source() -> None:
    done = _cli("skills", "list", "--json", "--catalogue", str(PLUGIN_SKILLS), kinds=PLUGIN)

    assert done.returncode == 0, done.stderr
    [meta] = json.loads(done.stdout)
    assert meta["name"] == "plugin/text"
    assert meta["source_types"] == ["upper"]


def test_without_the_plugin_skills_check_names_the_unknown_source() -> None:
    done = _cli("skills", "check", str(PLUGIN_SKILLS))

    assert done.returncode == 1
    assert "unknown tool source 'upper'; known: command, mcp, python" in done.stdout


@pytest.mark.parametrize(
    "kinds", ["tests.fixtures.no_such_kind", f"{PLUGIN},tests.fixtures.raises_on_import"]
)
def test_a_plugin_module_that_cannot_load_is_a_one_line_error_with_exit_2(kinds: str) -> None:
    done = _cli("skills", "check", str(PLUGIN_SKILLS), kinds=kinds)

    assert done.returncode == 2
    assert done.stderr.startswith("error: CLEVERAGENTS_TOOL_KINDS: cannot load tool kind module")
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
