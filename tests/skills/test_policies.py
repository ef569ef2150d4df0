"""``retry`` and ``limits`` in skill files: how they read, what is refused, what is warned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from cleveragents.pipeline import Pipeline
from cleveragents.skills import Catalogue
from cleveragents.skills.policies import Limits, RetryPolicy
from cleveragents.stores import Stores
from cleveragents.stores.quotas import Permit, RedisLimitGate

TOOL = """\
name: test/p
{skill_extra}tools:
  - name: test/t
    source: python
    entrypoint: json:dumps
{tool_extra}"""


def _file(tmp_path: Path, tool_extra: str = "", skill_extra: str = "") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(TOOL.format(tool_extra=tool_extra, skill_extra=skill_extra), encoding="utf-8")
    return path


def test_the_kth_retry_waits_about_backoff_times_two_to_the_k_minus_one_at_most_max() -> None:
    policy = RetryPolicy(attempts=5, backoff_s=1, max_backoff_s=3)
    for retry, nominal in ((1, 1.0), (2, 2.0), (3, 3.0), (4, 3.0)):
        delays = [policy.delay_s(retry) for _ in range(50)]
        assert all(0.9 * nominal <= d <= 1.1 * nominal for d in delays), (retry, delays)
        assert len(set(delays)) > 1  # jittered


def test_a_rate_reads_as_starts_per_window() -> None:
    assert Limits(rate="10/s").per_window == (10, 1.0)
    assert Limits(rate="5/m").per_window == (5, 60.0)
    assert Limits(rate=" 2 / h ").per_window == (2, 3600.0)
    assert not Limits()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("    limits: {rate: 10 per second}\n", 'is not "N/s", "N/m" or "N/h"'),
        ("    limits: {rate: 0/s}\n", "allows no start at all"),
        ("    limits: {concurrency: 0}\n", "greater than or equal to 1"),
        ("    retry: {attempts: 0}\n", "greater than or equal to 1"),
        ("    retry: {attempts: 3, backof_s: 1}\n", "backof_s"),
    ],
)
def test_a_bad_policy_is_a_problem_of_its_file(tmp_path: Path, extra: str, said: str) -> None:
    catalogue = Catalogue.from_paths(_file(tmp_path, extra))
    assert len(catalogue) == 0
    assert any(said in str(problem) for problem in catalogue.errors), catalogue.errors


def test_skill_limits_are_read_for_its_tools(tmp_path: Path) -> None:
    catalogue = Catalogue.from_paths(_file(tmp_path, skill_extra="limits: {concurrency: 2}\n"))
    assert catalogue.skill_limits("test/p") == Limits(concurrency=2)


def test_skills_check_warns_of_a_retry_that_never_applies(tmp_path: Path) -> None:
    path = _file(tmp_path, "    writes: true\n    retry: {attempts: 5}\n")
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "skills", "check", str(path), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [warning] = json.loads(done.stdout)["warnings"]
    assert "test/t" in warning
    assert "never applies" in warning
    # at the tool's own line, not the skill's (issue 48, item 6)
    lines = path.read_text(encoding="utf-8").splitlines()
    tool_line = next(n for n, text in enumerate(lines, 1) if "name: test/t" in text)
    assert f"{path}:{tool_line}:" in warning
    assert "idempotent: true" in warning
    # An idempotent write's retry applies: no warning
    path = _file(tmp_path, "    writes: true\n    idempotent: true\n    retry: {attempts: 5}\n")
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "skills", "check", str(path), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert json.loads(done.stdout)["warnings"] == []


def test_a_tool_reached_through_another_skill_shares_its_limits(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        "skills:\n"
        "  - name: test/own\n"
        "    limits: {concurrency: 5}\n"
        "    tools:\n"
        "      - {name: test/t, source: python, entrypoint: 'json:dumps',"
        " limits: {concurrency: 1}}\n"
        "  - name: test/other\n"
        "    includes: [test/own]\n",
        encoding="utf-8",
    )
    catalogue = Catalogue.from_paths(path)
    pipeline = Pipeline.over(
        catalogue, Stores.in_memory(), limit_gate=RedisLimitGate(redis.Redis(), 30.0)
    )  # (a gate never asked: no connection is made)
    via_other = pipeline.policy_tool({"skill": "test/other", "tool": "test/t"})
    via_own = pipeline.policy_tool({"skill": "test/own", "tool": "test/t"})
    assert via_other is not None
    assert via_own is not None
    # Kept under the skill that defines the tool, with that skill's limits too
    assert (via_other.skill, via_other.skill_limits) == ("test/own", Limits(concurrency=5))
    held = pipeline.take_limits(via_other)
    assert isinstance(held, list)
    assert all(isinstance(p, Permit) for p in held)
    assert isinstance(pipeline.take_limits(via_own), float)
    for permit in held:
        permit.release()
