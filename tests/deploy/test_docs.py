"""The code in README.md and docs/*.md runs (in the spirit of pydantic-settings' test_docs.py).

Every fenced block is collected with its file and line:

- ```python blocks run, each in a fresh interpreter, in a fresh folder, with the
  repository on ``PYTHONPATH``, ``CLEVERAGENTS_CATALOGUE`` on the example
  catalogue and ``CLEVERAGENTS_HOME`` in the folder; they must exit 0.
- A block whose first line is ``# file: PATH`` is also written to ``PATH`` in
  the folder of every block of the same page (a module or a skill file that the
  page's later blocks use). Such a python block is run as a module (not as
  ``__main__``), so a command-tool script does not wait for stdin.
- A python block that needs a running worker or broker (it uses
  ``cleveragents.client`` or ``SkillClient``) starts with the line
  ``# docs-test: skip (needs a worker)`` and is skipped; the skip reasons (file
  and line) are listed in pytest's summary (``-ra``), and the marker is allowed
  only on such blocks.
- ```yaml (and ```json) blocks that hold a skill must load with
  ``cleveragents.skills.loader.load_file`` with no problems.
- In ```bash blocks, every ``cleveragents skills`` command runs (with the example
  catalogue, the page's files, and ``examples/`` linked into the folder) and must
  exit 0; the other commands of such a block (``submit``, ``worker``...) need a
  worker and are not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cleveragents.skills import Catalogue
from cleveragents.skills.loader import load_file
from cleveragents.skills.mcp_tools import export_catalogue

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLE_SKILLS = REPO / "examples" / "skills"

SKIP_MARKER = "# docs-test: skip (needs a worker)"
FILE_MARKER = "# file: "
#: What makes a python block need a worker (and so the skip marker).
NEEDS_WORKER = re.compile(r"cleveragents\.client|SkillClient")
_OPEN = re.compile(r"^```([A-Za-z0-9_+-]+)?\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.code.split("\n", 1)[0].strip()

    @property
    def target(self) -> str | None:
        """The path a ``# file:`` block is written to."""
        if self.first_line.startswith(FILE_MARKER):
            return self.first_line[len(FILE_MARKER) :].strip()
        return None

    @property
    def skipped(self) -> bool:
        return self.first_line == SKIP_MARKER


def extract_blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, in order (fences at the start of a line)."""
    blocks: list[Block] = []
    lines = doc.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opened = _OPEN.match(lines[index])
        if opened is None:
            index += 1
            continue
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].rstrip() != "```":
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise AssertionError(f"{doc}:{start + 1}: unclosed code block")
        blocks.append(
            Block(doc, start + 1, (opened.group(1) or "").lower(), "\n".join(body) + "\n")
        )
        index += 1
    return blocks


ALL_BLOCKS = [block for doc in DOCS for block in extract_blocks(doc)]
#: Pages whose python blocks another test runs (with what they need), and which one.
RUN_ELSEWHERE = {"agents.md": "tests/deploy/test_agents_docs.py"}
PYTHON_BLOCKS = [
    b for b in ALL_BLOCKS if b.lang in ("python", "py") and b.doc.name not in RUN_ELSEWHERE
]
SKIPPED_BLOCKS = [b for b in PYTHON_BLOCKS if b.skipped]
FILE_BLOCKS = [b for b in ALL_BLOCKS if b.target is not None]


def _is_skill_yaml(block: Block) -> bool:
    return (
        block.lang in ("yaml", "yml")
        and re.search(r"^\s*(-\s+)?name:", block.code, re.M) is not None
        and re.search(r"^\s*(-\s+)?(tools|includes):", block.code, re.M) is not None
    )


def _is_skill_json(block: Block) -> bool:
    if block.lang != "json":
        return False
    try:
        data = json.loads(block.code)
    except ValueError:
        return False
    return isinstance(data, dict) and "name" in data and ("tools" in data or "includes" in data)


def shell_commands(block: Block) -> list[str]:
    """The block's commands, one per entry (lines ending in a backslash continue)."""
    commands: list[str] = []
    pending = ""
    for line in block.code.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def skills_commands(block: Block) -> list[str]:
    """The ``cleveragents skills`` commands of a bash block: they need no worker, so they run.

    A block may mix them with commands that need a worker or run forever
    (``cleveragents worker``); those are not run here.
    """
    return [c for c in shell_commands(block) if c.startswith("cleveragents skills")]


YAML_SKILL_BLOCKS = [b for b in ALL_BLOCKS if _is_skill_yaml(b) or _is_skill_json(b)]
BASH_BLOCKS = [
    b for b in ALL_BLOCKS if b.lang in ("bash", "sh", "shell", "console") and skills_commands(b)
]


def _ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


@pytest.fixture
def page_folder(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh folder holding the ``# file:`` blocks of the block's page."""
    block: Block = request.param
    folder = tmp_path / "work"
    folder.mkdir()
    for file_block in FILE_BLOCKS:
        if file_block.doc == block.doc and file_block.target is not None:
            path = folder / file_block.target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file_block.code, encoding="utf-8")
    (folder / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    return folder


def _environment(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["CLEVERAGENTS_CATALOGUE"] = str(EXAMPLE_SKILLS)
    env["CLEVERAGENTS_HOME"] = str(folder / ".cleveragents-home")
    env["COLUMNS"] = "200"
    return env


def _run(argv: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=folder,
        env=_environment(folder),
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _report(block: Block, done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{block.where} exited {done.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )


# --------------------------------------------------------------------------- python


@pytest.mark.parametrize("page_folder", PYTHON_BLOCKS, ids=_ids(PYTHON_BLOCKS), indirect=True)
def test_python_block_runs(page_folder: Path, request: pytest.FixtureRequest) -> None:
    block: Block = request.node.callspec.params["page_folder"]
    if block.skipped:
        pytest.skip(f"{block.where}: needs a worker")
    if block.target is not None:
        # A module or a script of the page: run its top level, not its __main__ part.
        argv = [
            sys.executable,
            "-c",
            "import runpy, sys; runpy.run_path(sys.argv[1], run_name='docs_test')",
            block.target,
        ]
    else:
        argv = [sys.executable, "-c", block.code]
    done = _run(argv, page_folder)
    assert done.returncode == 0, _report(block, done)


def test_the_skip_marker_is_only_on_blocks_that_need_a_worker() -> None:
    for block in PYTHON_BLOCKS:
        needs_worker = NEEDS_WORKER.search(block.code) is not None
        if needs_worker:
            assert block.skipped, f"{block.where} needs a worker: start it with {SKIP_MARKER!r}"
        else:
            assert not block.skipped, f"{block.where} runs without a worker: remove the marker"


def test_the_skipped_blocks_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    """What the docs tests do not run; each also shows as a skip in pytest's summary (-ra)."""
    listed = [b.where for b in SKIPPED_BLOCKS]
    with capsys.disabled():
        print(f"\ndocs python blocks skipped (need a worker): {', '.join(listed) or 'none'}")
    assert all(NEEDS_WORKER.search(b.code) for b in SKIPPED_BLOCKS)
    # docs/batch.md's SkillClient.run_many example is one of them.
    assert any(b.doc.name == "batch.md" for b in SKIPPED_BLOCKS)


# --------------------------------------------------------------------------- skill files


@pytest.mark.parametrize("block", YAML_SKILL_BLOCKS, ids=_ids(YAML_SKILL_BLOCKS))
def test_skill_block_loads(block: Block, tmp_path: Path) -> None:
    if block.lang == "json":
        path = tmp_path / "skill.json"
    else:
        path = tmp_path / "skill.yaml"
        assert yaml.safe_load(block.code) is not None
    path.write_text(block.code, encoding="utf-8")
    loaded, problems = load_file(path)
    assert problems == [], f"{block.where}: {problems}"
    assert loaded, f"{block.where}: no skill in the block"


# --------------------------------------------------------------------------- bash


@pytest.mark.parametrize("page_folder", BASH_BLOCKS, ids=_ids(BASH_BLOCKS), indirect=True)
def test_cleveragents_skills_block_runs(page_folder: Path, request: pytest.FixtureRequest) -> None:
    block: Block = request.node.callspec.params["page_folder"]
    for command in skills_commands(block):
        done = _run(["bash", "-euo", "pipefail", "-c", command], page_folder)
        assert done.returncode == 0, f"{command}\n" + _report(block, done)


# --------------------------------------------------------------------------- samples


def test_the_mcp_sample_is_what_the_export_prints(tmp_path: Path) -> None:
    """docs/skills.md shows one exported MCP tool: it must be the real thing."""
    page = REPO / "docs" / "skills.md"
    [sample] = [
        json.loads(b.code)
        for b in ALL_BLOCKS
        if b.doc == page and b.lang == "json" and '"inputSchema"' in b.code
    ]
    for block in FILE_BLOCKS:
        if block.doc == page and block.target is not None and block.lang in ("yaml", "yml"):
            path = tmp_path / block.target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, encoding="utf-8")
    exported = export_catalogue(Catalogue.from_paths(tmp_path / "my-skills"), ["demo/greetings"])
    assert exported.tools[0] == sample


# --------------------------------------------------------------------------- references

#: A test file a page names as the proof of what it says, with an optional ``::test_name``.
_TEST_REFERENCE = re.compile(r"\b(tests/[\w/]+\.py)(?:::(\w+))?")


def test_every_test_file_the_docs_name_exists() -> None:
    """A page that points at a moved or renamed test points at nothing: found here."""
    missing = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in _TEST_REFERENCE.finditer(line):
                path, name = REPO / match[1], match[2]
                where = f"{doc.relative_to(REPO)}:{number}: {match[0]}"
                if not path.is_file():
                    missing.append(where)
                elif name and not re.search(rf"def {name}\b", path.read_text(encoding="utf-8")):
                    missing.append(f"{where} (no such test)")
    assert missing == []


def test_the_reference_check_sees_a_reference() -> None:
    # The check above would pass on pages that name no test at all.
    named = {m[1] for doc in DOCS for m in _TEST_REFERENCE.finditer(doc.read_text("utf-8"))}
    assert "tests/deploy/test_docs.py" in named
    assert len(named) >= 20


# --------------------------------------------------------------------------- coverage


def test_the_pages_have_the_blocks_we_expect() -> None:
    """The extractor found what the tests above are about (a silent zero would pass)."""
    skills_page = REPO / "docs" / "skills.md"
    assert sum(b.doc == skills_page for b in PYTHON_BLOCKS) >= 8
    assert sum(b.doc == skills_page for b in YAML_SKILL_BLOCKS) >= 3
    assert sum(b.doc == skills_page for b in BASH_BLOCKS) >= 3
    assert any(b.doc == REPO / "README.md" for b in BASH_BLOCKS)
    targets = [b.target for b in FILE_BLOCKS]
    assert len(targets) == len(set(targets)), "two blocks write one file"
