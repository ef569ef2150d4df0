"""``cleveragents skills ...`` through the real console script (SPEC section 8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import pytest

from cleveragents.settings import bundled_examples_path
from cleveragents.skills import SkillDefinition, SkillMetadata

_REPO = Path(__file__).resolve().parents[2]


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "cleveragents"
    if script.exists():
        return [str(script)]
    found = shutil.which("cleveragents")
    return [found] if found else [sys.executable, "-m", "cleveragents"]


def _run(
    *args: str, catalogue: str | Path | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["COLUMNS"] = "200"
    if catalogue is not None:
        env["CLEVERAGENTS_CATALOGUE"] = str(catalogue)
    return subprocess.run(
        [*_console_script(), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or _REPO,
        timeout=60,
        check=False,
    )


def _write(folder: Path, relative: str, text: str) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dedent(text).lstrip(), encoding="utf-8")
    return path


@pytest.fixture
def broken_catalogue(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder with one good skill, three bad files and two skills that do not resolve."""
    folder = tmp_path / "catalogue"
    _write(
        folder,
        "good.yaml",
        """
        name: local/good
        tools:
          - {name: local/t, source: python, entrypoint: cleveragents.examples.tools:echo}
        """,
    )
    bad = [
        _write(folder, "bad-yaml.yaml", "name: local/x\ntools: [unclosed\n"),
        _write(folder, "bad-json.json", "{not json"),
        _write(folder, "nested/bad-tool.yml", "name: local/y\ntools: [{name: nope}]\n"),
    ]
    _write(
        folder,
        "cycle.yaml",
        "skills:\n- {name: local/a, includes: [local/b]}\n- {name: local/b, includes: [local/a]}\n",
    )
    return folder, bad


# --------------------------------------------------------------------------- list


def test_skills_list_prints_a_table_of_the_catalogue() -> None:
    done = _run("skills", "list", catalogue=bundled_examples_path())
    assert done.returncode == 0, done.stderr
    for name in ("local/common", "local/notes", "local/research", "local/text-tools"):
        assert name in done.stdout
    assert done.stderr == ""


def test_skills_list_json_prints_one_array_of_skill_metadata() -> None:
    done = _run("skills", "list", "--json", catalogue=bundled_examples_path())
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, list)
    metadata = [SkillMetadata.model_validate(item) for item in data]
    assert [m.name for m in metadata] == sorted(m.name for m in metadata)
    by_name = {m.name: m for m in metadata}
    assert by_name["local/notes"].writes is True
    assert by_name["local/research"].read_only is True


def test_skills_list_with_catalogue_errors_lists_the_good_skills_and_warns(
    broken_catalogue: tuple[Path, list[Path]],
) -> None:
    folder, _ = broken_catalogue
    done = _run("skills", "list", "--json", catalogue=folder)
    assert done.returncode == 0
    assert [m["name"] for m in json.loads(done.stdout)] == ["local/good"]
    assert "warning" in done.stderr
    assert "Traceback" not in done.stderr

    table = _run("skills", "list", catalogue=folder)
    assert table.returncode == 0
    assert "local/good" in table.stdout
    assert "warning" in table.stderr


def test_skills_list_takes_the_catalogue_option(tmp_path: Path) -> None:
    _write(tmp_path, "one.yaml", "name: local/only-here\n")
    done = _run("skills", "list", "--json", "--catalogue", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [m["name"] for m in json.loads(done.stdout)] == ["local/only-here"]


# --------------------------------------------------------------------------- show


def test_skills_show_json_prints_one_skill_definition() -> None:
    done = _run("skills", "show", "local/notes", "--json", catalogue=bundled_examples_path())
    assert done.returncode == 0, done.stderr
    definition = SkillDefinition.model_validate(json.loads(done.stdout))
    assert definition.skill.name == "local/notes"
    tools = [e.tool.name for e in definition.resolved_tools]
    assert tools.count("local/echo") == 1  # the diamond at local/common
    assert definition.metadata.writes is True


def test_skills_show_prints_the_resolved_tools() -> None:
    done = _run("skills", "show", "local/notes", catalogue=bundled_examples_path())
    assert done.returncode == 0, done.stderr
    assert "local/write-note" in done.stdout
    assert "local/echo" in done.stdout


def test_skills_show_of_an_unknown_skill_is_one_error_line_and_exit_2() -> None:
    done = _run("skills", "show", "ops/bicycle", catalogue=bundled_examples_path())
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert "ops/bicycle" in lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


# --------------------------------------------------------------------------- check


def test_skills_check_of_the_examples_exits_0() -> None:
    done = _run("skills", "check", "examples")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout


def test_skills_check_lists_every_problem_and_exits_1(
    broken_catalogue: tuple[Path, list[Path]],
) -> None:
    folder, bad_files = broken_catalogue
    done = _run("skills", "check", str(folder))
    assert done.returncode == 1
    output = done.stdout + done.stderr
    for path in bad_files:
        assert str(path) in output
    assert "local/a -> local/b -> local/a" in output
    assert "Traceback" not in output


def test_skills_check_json_reports_problems_with_their_error_types(
    broken_catalogue: tuple[Path, list[Path]],
) -> None:
    folder, bad_files = broken_catalogue
    done = _run("skills", "check", "--json", str(folder))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["skills"] == ["local/good"]
    wheres = {p["where"]: p["error_type"] for p in report["problems"]}
    assert {str(p) for p in bad_files} <= set(wheres)
    assert wheres["local/a"] == "cycle_detected"


def test_skills_check_of_a_path_that_does_not_exist_exits_2() -> None:
    done = _run("skills", "check", "/no/such/path")
    assert done.returncode == 2
    assert done.stderr.startswith("error:")
    assert "/no/such/path" in done.stderr
    assert "Traceback" not in done.stderr


def test_skills_check_reports_schemas_that_are_not_json_schema(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "schemas.yaml",
        """
        name: local/bad-schemas
        output_schema: {type: object, properties: {n: {type: 3}}}
        tools:
          - name: local/t
            source: python
            entrypoint: cleveragents.examples.tools:echo
            input_schema: {type: nonsense}
        """,
    )
    done = _run("skills", "check", "--json", str(tmp_path))
    assert done.returncode == 1
    problems = json.loads(done.stdout)["problems"]
    reasons = sorted(p["reason"].split(": not a valid JSON Schema: ")[0] for p in problems)
    assert reasons == ["input_schema of tool local/t", "output_schema"]
    assert {p["error_type"] for p in problems} == {"validation_error"}
    # Each at its schema's line, in plain words: the skill file does not load
    text = (tmp_path / "schemas.yaml").read_text().splitlines()
    for p in problems:
        key = "input_schema" if p["reason"].startswith("input") else "output_schema"
        assert key in text[p["line"] - 1], (p, text)
        assert "is not a JSON Schema type" in p["reason"]
    assert json.loads(done.stdout)["skills"] == []
