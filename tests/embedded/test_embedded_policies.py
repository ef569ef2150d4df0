"""Retries and limits on the embedded default: the local worker keeps them, across the
processes of one home, through the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.embedded.test_embedded_concurrency import cli_env, processes_using, start_cli
from tests.support.procs import FIXTURE_SKILLS

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "work"
    folder.mkdir()
    yield folder
    for pid in processes_using(folder):
        os.kill(pid, signal.SIGKILL)


def test_a_transient_failure_is_retried_on_the_embedded_default(work: Path) -> None:
    env = cli_env(CLEVERAGENTS_HOME=str(work / "home"), CLEVERAGENTS_CATALOGUE=str(FIXTURE_SKILLS))
    log = work / "runs.jsonl"
    args = json.dumps({"log": str(log), "key": "e", "fail_times": 1})
    proc = start_cli(
        "submit", "test/retries", "test/flaky-2", "--args", args, "--wait", "--json",
        cwd=work, env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["output_data"] == {"runs": 2}
    assert len(log.read_text(encoding="utf-8").splitlines()) == 2
