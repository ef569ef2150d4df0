"""A missing or broken catalogue says which file, which line, what is wrong (issue 16).

Each test does what a user does: the real console script, run from a folder of
its own (not the repository), on a catalogue path that does not exist, a skill
file with a YAML syntax error, and a skill file with a misspelt key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import pytest

from cleveragents.cli.failure_text import fix_for
from cleveragents.runtime import invoke
from cleveragents.skills import Catalogue
from tests.support.procs import REPO

pytestmark = pytest.mark.timeout(180)

#: A YAML syntax error on line 3: ``a: b`` cannot be the value of ``tools:``.
SYNTAX_ERROR = """\
name: local/bad
description: a file that does not parse
tools: a: b
"""

#: ``write: true`` (line 6) instead of ``writes: true``.
MISSPELT = """\
name: local/typo
description: a tool with a misspelt key
tools:
  - name: local/t
    source: python
    write: true
    entrypoint: cleveragents.examples.tools:echo
"""

GOOD = """\
name: local/good
tools:
  - {name: local/echo, source: python, entrypoint: cleveragents.examples.tools:echo}
"""


def _cli(*args: str, cwd: Path, catalogue: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    env["COLUMNS"] = "80"  # narrow: a problem must still be one line
    if catalogue is not None:
        env["CLEVERAGENTS_CATALOGUE"] = catalogue
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """The folder the user runs the command from."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


@pytest.fixture
def broken(elsewhere: Path) -> Path:
    """``skills/`` beside the user: one good file, one syntax error, one misspelt key."""
    skills = elsewhere / "skills"
    skills.mkdir()
    (skills / "bad.yaml").write_text(SYNTAX_ERROR, encoding="utf-8")
    (skills / "good.yaml").write_text(GOOD, encoding="utf-8")
    (skills / "typo.yaml").write_text(MISSPELT, encoding="utf-8")
    return skills


def _lines_naming(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


# ------------------------------------------------------------ a path that does not exist


@pytest.mark.parametrize(
    "command",
    [
        ["skills", "list"],
        ["skills", "list", "--json"],
        ["skills", "show", "local/good"],
        ["skills", "export", "--format", "mcp"],
    ],
)
def test_a_catalogue_option_that_does_not_exist_is_one_error_line_and_exit_2(
    elsewhere: Path, command: list[str]
) -> None:
    done = _cli(*command, "--catalogue", "no-such-skills", cwd=elsewhere)

    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no empty table, no empty JSON
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert "no-such-skills" in line
    assert str(elsewhere / "no-such-skills") in line  # where it was looked for
    assert "--catalogue" in line
    assert "CLEVERAGENTS_CATALOGUE" in line


@pytest.mark.parametrize(
    "command",
    [
        ["skills", "list"],
        ["skills", "show", "local/good"],
        ["skills", "check"],
        ["skills", "export", "--format", "mcp"],
    ],
)
def test_a_catalogue_variable_that_does_not_exist_is_one_error_line_and_exit_2(
    elsewhere: Path, command: list[str]
) -> None:
    done = _cli(*command, cwd=elsewhere, catalogue="/no/such/catalogue")

    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert "/no/such/catalogue" in line
    assert "CLEVERAGENTS_CATALOGUE" in line


def test_skills_list_with_one_of_its_paths_missing_lists_the_rest_warns_and_exits_0(
    elsewhere: Path,
) -> None:
    # SPEC section 8: `skills list` with catalogue errors lists what loaded and exits 0
    good = elsewhere / "good"
    good.mkdir()
    (good / "good.yaml").write_text(GOOD, encoding="utf-8")
    done = _cli("skills", "list", "--json", cwd=elsewhere,
                catalogue=os.pathsep.join([str(good), "/no/such/catalogue"]))

    assert done.returncode == 0, done.stderr
    assert [s["name"] for s in json.loads(done.stdout)] == ["local/good"]
    [warning] = _lines_naming(done.stderr, "/no/such/catalogue")
    assert warning.startswith("warning: ")


def test_skills_check_of_a_path_that_does_not_exist_says_how_to_fix_it(elsewhere: Path) -> None:
    done = _cli("skills", "check", "no-such-skills", cwd=elsewhere)

    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "no-such-skills" in line
    assert "CLEVERAGENTS_CATALOGUE" in line


def test_submit_to_a_worker_whose_catalogue_does_not_exist_says_so(elsewhere: Path) -> None:
    # Given the embedded default: the local worker reads the same CLEVERAGENTS_CATALOGUE
    done = _cli(
        "submit",
        "local/good",
        "local/echo",
        "--wait",
        cwd=elsewhere,
        catalogue=str(elsewhere / "no-such-skills"),
    )

    assert done.returncode == 1
    assert "skill_not_found" in done.stderr
    assert str(elsewhere / "no-such-skills") in done.stderr
    [fix] = _lines_naming(done.stderr, "fix:")
    assert "does not exist" in fix
    assert "CLEVERAGENTS_CATALOGUE" in fix


def test_submit_json_keeps_skill_not_found_and_names_the_missing_path(elsewhere: Path) -> None:
    done = _cli(
        "submit",
        "local/good",
        "local/echo",
        "--wait",
        "--json",
        cwd=elsewhere,
        catalogue=str(elsewhere / "no-such-skills"),
    )

    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert error["error_type"] == "skill_not_found"
    assert error["message"].startswith("skill not found: local/good")
    assert str(elsewhere / "no-such-skills") in error["message"]
    assert error["details"]["missing_catalogue_paths"] == [str(elsewhere / "no-such-skills")]


# ------------------------------------------------------------------- a YAML syntax error


def test_skills_check_names_the_file_and_line_of_a_yaml_syntax_error(broken: Path) -> None:
    done = _cli("skills", "check", "skills", cwd=broken.parent)

    assert done.returncode == 1
    [line] = _lines_naming(done.stdout + done.stderr, "bad.yaml")
    assert line.startswith("skills/bad.yaml:3: ")
    assert "YAML" in line
    assert "<unicode string>" not in line  # no parser internals
    assert '"' not in line


def test_skills_list_warns_once_per_problem_with_file_and_line(broken: Path) -> None:
    done = _cli("skills", "list", "--json", cwd=broken.parent, catalogue="skills")

    # SPEC: what loaded is listed, the problems are warnings, exit 0
    assert done.returncode == 0, done.stderr
    assert [m["name"] for m in json.loads(done.stdout)] == ["local/good"]
    [bad] = _lines_naming(done.stderr, "bad.yaml")
    assert bad.startswith("warning: skills/bad.yaml:3: ")
    [typo] = _lines_naming(done.stderr, "typo.yaml")
    assert typo.startswith("warning: skills/typo.yaml:6: ")
    assert "did you mean 'writes'" in typo
    assert "Traceback" not in done.stderr


def test_skills_check_json_gives_every_problem_a_type_a_file_and_a_line(broken: Path) -> None:
    done = _cli("skills", "check", "--json", "skills", cwd=broken.parent)

    assert done.returncode == 1
    report = json.loads(done.stdout)
    by_file = {p["file"]: p for p in report["problems"]}
    assert set(by_file) == {"skills/bad.yaml", "skills/typo.yaml"}
    assert all(p["error_type"] == "validation_error" for p in report["problems"])
    assert by_file["skills/bad.yaml"]["line"] == 3
    assert by_file["skills/bad.yaml"]["where"] == "skills/bad.yaml"
    assert "<unicode string>" not in by_file["skills/bad.yaml"]["reason"]
    assert by_file["skills/typo.yaml"]["line"] == 6
    assert "did you mean 'writes'" in by_file["skills/typo.yaml"]["reason"]


# ------------------------------------------------------------------------ a misspelt key


def test_a_misspelt_key_names_the_line_the_key_and_the_closest_valid_key(broken: Path) -> None:
    done = _cli("skills", "check", "skills", cwd=broken.parent)

    assert done.returncode == 1
    [line] = _lines_naming(done.stdout + done.stderr, "typo.yaml")
    assert line.startswith("skills/typo.yaml:6: ")
    assert "unknown key 'write'" in line
    assert "did you mean 'writes'?" in line
    assert "Extra inputs are not permitted" not in line


def test_skills_show_of_a_skill_whose_file_has_problems_says_what_is_wrong(broken: Path) -> None:
    done = _cli("skills", "show", "local/typo", cwd=broken.parent, catalogue="skills")

    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: skill not found: local/typo")
    assert "skills/typo.yaml:6" in line
    assert "did you mean 'writes'?" in line


def test_submit_of_a_skill_whose_file_has_problems_points_at_skills_check(broken: Path) -> None:
    done = _cli(
        "submit", "local/typo", "local/t", "--wait", cwd=broken.parent, catalogue=str(broken)
    )

    assert done.returncode == 1
    assert "skill_not_found" in done.stderr
    assert "typo.yaml:6" in done.stderr
    [fix] = _lines_naming(done.stderr, "fix:")
    assert "cleveragents skills check" in fix


# ------------------------------------------------------------------ the library's view


def test_every_catalogue_problem_has_an_error_type_a_file_and_a_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(SYNTAX_ERROR, encoding="utf-8")
    (tmp_path / "typo.yaml").write_text(MISSPELT, encoding="utf-8")
    (tmp_path / "many.yaml").write_text(
        dedent("""\
        skills:
          - name: local/one
            includes: [local/nowhere]
          - name: local/good
          - name: local/good
        """),
        encoding="utf-8",
    )
    (tmp_path / "broken.json").write_text('{\n  "name": "local/j",\n  "tools": [,]\n}\n')

    catalogue = Catalogue.from_paths(tmp_path, tmp_path / "missing")

    located = {
        (Path(p.file).name if p.file else None, p.line, p.error_type) for p in catalogue.errors
    }
    assert located == {
        ("bad.yaml", 3, "validation_error"),
        ("typo.yaml", 6, "validation_error"),
        ("many.yaml", 2, "resolution_failure"),  # local/one's missing include
        ("many.yaml", 5, "resolution_failure"),  # the duplicate local/good
        ("broken.json", 3, "validation_error"),
        ("missing", None, "resolution_failure"),
    }
    assert all(str(p).startswith(f"{p.file}:{p.line}: ") for p in catalogue.errors if p.line)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: local/x\ndescripton: typo\n",
            "unknown key 'descripton'; did you mean 'description'?",
        ),
        ("name: local/x\ninclude: [local/y]\n", "did you mean 'includes'?"),
        ("name: local/x\ncolour: red\n", "unknown key 'colour'; valid keys: name, description"),
        (
            "name: local/x\ntools:\n  - {name: local/t, source: mcp, remote_tool: r, sever: {}}\n",
            "did you mean 'server'?",
        ),
        ("name: local/x\ntools:\n  - {name: local/t, source: python}\n", "needs entrypoint"),
        (
            "name: local/x\ntools:\n  - {name: local/t, entrypoint: a:b}\n",
            "tool local/t: missing required key 'source'",
        ),
        (
            "name: local/x\ntools: [{name: local/t, source: python, entrypoint: 'a:b'}]\n"
            "\tversion: 2\n",
            "tab",
        ),
        # Issue 48, item 6: inside retry and limits, the key meant; a string where a list
        # or a boolean goes, how to write it
        (
            "name: local/x\ntools:\n  - {name: local/t, source: python, entrypoint: 'a:b',\n"
            "     retry: {attempts: 3, backof_s: 1}}\n",
            "unknown key 'backof_s' in retry of tool local/t; did you mean 'backoff_s'?",
        ),
        (
            "name: local/x\ntools:\n  - {name: local/t, source: python, entrypoint: 'a:b',\n"
            "     limits: {concurency: 2}}\n",
            "unknown key 'concurency' in limits of tool local/t; did you mean 'concurrency'?",
        ),
        (
            "name: local/x\ntools:\n  - name: local/t\n    source: command\n"
            "    command: python3 journal.py\n",
            "write a list, e.g. command: [python3, journal.py]",
        ),
        (
            "name: local/x\ntools:\n  - {name: local/t, source: python, entrypoint: 'a:b',\n"
            "     requires_approval: yes please}\n",
            "write true or false",
        ),
    ],
)
def test_problems_are_said_in_plain_words(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "skill.yaml").write_text(text, encoding="utf-8")

    [problem] = Catalogue.from_paths(tmp_path).errors

    assert expected in problem.reason
    assert problem.error_type == "validation_error"
    assert problem.line is not None
    assert "Value error," not in problem.reason
    assert "Extra inputs" not in problem.reason


def test_the_not_found_result_of_a_worker_with_a_missing_catalogue_names_the_fix(
    tmp_path: Path,
) -> None:
    catalogue = Catalogue.from_paths(tmp_path / "missing")

    result = invoke({"skill": "local/x", "tool": "local/t"}, catalogue)

    assert result.error is not None
    assert result.error.error_type == "skill_not_found"  # pinned by SPEC
    assert str(tmp_path / "missing") in result.error.message
    fix = fix_for(result.error)
    assert fix is not None
    assert "CLEVERAGENTS_CATALOGUE" in fix


def test_a_not_found_skill_in_a_healthy_catalogue_keeps_the_plain_message(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD, encoding="utf-8")

    result = invoke({"skill": "local/x", "tool": "local/t"}, Catalogue.from_paths(tmp_path))

    assert result.error is not None
    assert result.error.message == "skill not found: local/x"
    assert fix_for(result.error) == (
        "`cleveragents skills list` shows the catalogue (the worker's is CLEVERAGENTS_CATALOGUE)"
    )


#: Two skills; the one a user means is ``me/greet``, whose tool is ``me/hello``.
GREET = """\
name: me/greet
tools:
  - {name: me/hello, source: python, entrypoint: cleveragents.examples.tools:echo}
  - {name: me/goodbye, source: python, entrypoint: cleveragents.examples.tools:echo}
"""


@pytest.mark.parametrize(
    ("skill", "tool", "error_type", "meant", "fix"),
    [
        # the namespace left out, as a new user does
        ("me/greet", "hello", "resolution_failure", "me/hello", "use 'me/hello' as the tool"),
        ("greet", "me/hello", "skill_not_found", "me/greet", "use 'me/greet' as the skill"),
        # a typo
        ("me/greet", "me/helo", "resolution_failure", "me/hello", "use 'me/hello' as the tool"),
        ("me/greeet", "me/hello", "skill_not_found", "me/greet", "use 'me/greet' as the skill"),
    ],
)
def test_a_name_close_to_one_in_the_catalogue_gets_it_named(
    tmp_path: Path, skill: str, tool: str, error_type: str, meant: str, fix: str
) -> None:
    # Given a catalogue with me/greet and local/good
    (tmp_path / "greet.yaml").write_text(GREET, encoding="utf-8")
    (tmp_path / "good.yaml").write_text(GOOD, encoding="utf-8")
    # When a request names a skill or tool that is not there but close to one that is
    result = invoke({"skill": skill, "tool": tool}, Catalogue.from_paths(tmp_path))
    # Then the error says which one was probably meant, and the fix says to use it
    assert result.error is not None
    assert result.error.error_type == error_type
    assert result.error.message.endswith(f"; did you mean {meant!r}?"), result.error.message
    assert result.error.details["did_you_mean"] == meant
    hint = fix_for(result.error)
    assert hint is not None
    assert hint.startswith(fix), hint


def test_a_name_close_to_none_gets_no_guess(tmp_path: Path) -> None:
    (tmp_path / "greet.yaml").write_text(GREET, encoding="utf-8")
    (tmp_path / "good.yaml").write_text(GOOD, encoding="utf-8")

    unknown_tool = invoke({"skill": "me/greet", "tool": "me/x"}, Catalogue.from_paths(tmp_path))
    unknown_skill = invoke({"skill": "local/x", "tool": "me/x"}, Catalogue.from_paths(tmp_path))

    assert unknown_tool.error is not None
    assert unknown_skill.error is not None
    assert unknown_tool.error.message == "tool 'me/x' is not part of skill 'me/greet'"
    assert unknown_skill.error.message == "skill not found: local/x"
    assert "did_you_mean" not in unknown_tool.error.details


def test_a_bad_schema_is_said_with_the_files_other_problems_at_its_line(tmp_path: Path) -> None:
    skill = tmp_path / "bad.yaml"
    skill.write_text(
        "name: me/bad\n"
        "description: x\n"
        "tools:\n"
        "  - name: me/t\n"
        "    source: python\n"
        "    entrypoint: cleveragents.examples.tools:echo\n"
        "    input_schema: {type: object, properties: {text: {type: strin}}}\n"
        "    bogus_key: 1\n"
    )
    # When the file is checked
    done = _cli("skills", "check", str(skill), cwd=tmp_path)
    # Then the schema's problem comes with the other one, at its line, in plain words
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    assert f"{skill}:7: input_schema of tool me/t: not a valid JSON Schema: type 'strin' is " \
        "not a JSON Schema type; did you mean 'string'?" in done.stdout, done.stdout
    assert any(line.startswith(f"{skill}:8: unknown key 'bogus_key'") for line in lines)
    assert "anyOf" not in done.stdout
    # And the skill does not load: it is not listed, rather than failing at run time
    listed = _cli("skills", "list", "--json", cwd=tmp_path, catalogue=str(tmp_path))
    assert "me/bad" not in listed.stdout
