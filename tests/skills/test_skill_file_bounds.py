"""A skill file costs a bounded amount to read (issue 29, attack 3): a YAML alias bomb and
an oversized file are problems of their file, named with file and line, found in seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from cleveragents.constants import MAX_SKILL_FILE_BYTES
from cleveragents.skills import Catalogue


def _bomb(levels: int) -> str:
    """A 'billion laughs' skill file: a tool's schema (kept, compiled and written out whole)
    holds levels that each map nine keys to the level before."""
    keys = "abcdefghi"
    lines = [
        "name: evil/bomb",
        "tools:",
        "  - name: evil/t",
        "    source: python",
        "    entrypoint: m:f",
        "    input_schema:",
        "      type: object",
        "      x-levels:",
        "        l0: &l0 {" + ", ".join(f"{k}: lol" for k in keys) + "}",
    ]
    for i in range(1, levels + 1):
        refs = ", ".join(f"{k}: *l{i - 1}" for k in keys)
        lines.append(f"        l{i}: &l{i} {{{refs}}}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_a_problem_of_its_file_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(_bomb(9))
    (tmp_path / "good.yaml").write_text("name: ok/fine\n")
    started = time.monotonic()
    catalogue = Catalogue.from_paths(tmp_path)
    assert time.monotonic() - started < 10
    assert [m.name for m in catalogue.list()] == ["ok/fine"]
    problems = [p for p in catalogue.errors if (p.file or "").endswith("bomb.yaml")]
    (problem,) = problems
    assert "aliases" in problem.reason
    assert problem.line is not None
    assert 6 <= problem.line <= 20


def test_a_file_that_reuses_a_schema_by_alias_still_loads(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(
        "name: ok/reuse\n"
        "tools:\n"
        "  - name: ok/a\n    source: python\n    entrypoint: m:f\n"
        "    input_schema: &text {type: object, properties: {text: {type: string}}}\n"
        "  - name: ok/b\n    source: python\n    entrypoint: m:g\n"
        "    input_schema: *text\n"
    )
    catalogue = Catalogue.from_paths(tmp_path)
    assert catalogue.errors == []
    assert [m.name for m in catalogue.list()] == ["ok/reuse"]


def test_a_skill_file_larger_than_the_cap_is_a_problem_of_its_file(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: big/one\ndescription: '" + "x" * MAX_SKILL_FILE_BYTES + "'\n")
    catalogue = Catalogue.from_paths(tmp_path)
    (problem,) = catalogue.errors
    assert (problem.file or "").endswith("big.yaml")
    assert f"{MAX_SKILL_FILE_BYTES:,} bytes" in problem.reason


def test_skills_check_of_the_nine_level_bomb_ends_in_seconds_under_200_mb(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb(9))
    peak = tmp_path / "peak_kb"
    # The command in a process that writes its own peak memory as it exits: the kernel's
    # VmHWM of this program (ru_maxrss would keep the forking test process's, across exec).
    program = (
        "import atexit, re, runpy, sys\n"
        "def peak():\n"
        "    status = open('/proc/self/status').read()\n"
        f"    open({str(peak)!r}, 'w').write(re.search(r'VmHWM:\\s+(\\d+)', status)[1])\n"
        "atexit.register(peak)\n"
        f"sys.argv = ['cleveragents', 'skills', 'check', {str(bomb)!r}]\n"
        "runpy.run_module('cleveragents', run_name='__main__')\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30
    )
    assert time.monotonic() - started < 20
    assert done.returncode == 1, done.stderr
    assert "bomb.yaml" in done.stdout + done.stderr
    assert int(peak.read_text()) < 200 * 1024
