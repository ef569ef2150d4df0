"""docs/agents.md's recipes run: each python block, in a fresh folder with the page's
``# file:`` blocks, against a real worker on a private Redis, with the agent frameworks
of the ``agents`` extra (offline: their test models or direct tool calls, no model API).

A recipe block starts with ``# docs-test: agents``; ``tests/deploy/test_docs.py`` leaves
this page's python blocks to this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.test_docs import REPO, Block, _environment, _report, extract_blocks
from tests.support.procs import EXAMPLE_SKILLS, Worker

pytestmark = pytest.mark.timeout(300)

PAGE = REPO / "docs" / "agents.md"
MARKER = "# docs-test: agents"
BLOCKS = extract_blocks(PAGE)
RECIPES = [b for b in BLOCKS if b.lang == "python" and b.first_line.startswith(MARKER)]
FILES = [b for b in BLOCKS if b.target is not None]


def test_the_page_has_a_recipe_for_each_framework() -> None:
    code = "\n".join(b.code for b in RECIPES)
    for framework in ("pydantic_ai", "agents.mcp", "function_tool", "langchain_core"):
        assert framework in code, framework
    assert "TestModel" in code
    # Every python block of the page is a recipe or a file the recipes import
    python = [b for b in BLOCKS if b.lang == "python"]
    assert all(b in RECIPES or b.target is not None for b in python)


@pytest.mark.parametrize("block", RECIPES, ids=[b.where for b in RECIPES])
def test_recipe_runs_against_a_worker(
    block: Block, redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    for file_block in FILES:
        assert file_block.target is not None
        path = folder / file_block.target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(file_block.code, encoding="utf-8")
    catalogue = os.pathsep.join([str(EXAMPLE_SKILLS), str(folder / "agent_skills")])
    start_worker(redis_url, CLEVERAGENTS_CATALOGUE=catalogue)
    env = _environment(folder)
    env.update(
        CLEVERAGENTS_BROKER_URL=redis_url,
        CLEVERAGENTS_RESULT_BACKEND=redis_url,
        CLEVERAGENTS_CATALOGUE=catalogue,
        PYTHONPATH=os.pathsep.join([str(folder), env["PYTHONPATH"]]),
    )
    done = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, _report(block, done)
