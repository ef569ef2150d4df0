"""Embedded default: any valid request id names files inside the home, never beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("request_id", [".", "..", "a/b", "../escape"])
def test_an_id_that_is_not_a_file_name_still_gets_its_result(
    tmp_path: Path, request_id: str
) -> None:
    # Given an empty folder with no broker configured
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    submit = [sys.executable, "-m", "cleveragents", "submit", "local/text-tools",
              "local/word-count", "--args", '{"text": "a b"}', "--request-id", request_id,
              "--wait", "--json"]

    # When an invocation is submitted under that id
    done = subprocess.run(submit, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)

    # Then it returns its own result, and nothing was written outside the home
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output_data"] == {"words": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cleveragents"]
    assert not (tmp_path.parent / "escape").exists()
