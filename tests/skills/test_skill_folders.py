"""A skill folder is a unit you can copy (issue 16): its modules and scripts travel with it.

What the user did: a skill file beside its python module and its scripts, in
its own folder, copied elsewhere and named by ``CLEVERAGENTS_CATALOGUE``, then
run from another folder. Python entrypoints import from the skill file's folder
first, each folder into its own namespace (two folders may both hold a
``tools.py``); relative paths in a ``command`` resolve against the skill file.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.runtime import invoke
from cleveragents.runtime.kinds.command import resolve_command
from cleveragents.skills import Catalogue, Skill, ToolSpec
from cleveragents.skills.protocol import SkillResult

pytestmark = pytest.mark.timeout(120)

# ---- the skill folder the user wrote ------------------------------------------------------

MATHY: dict[str, str] = {
    "mathy.yaml": """\
name: mathy/tools
description: A skill folder with its own module and scripts
tools:
  - name: mathy/double
    source: python
    entrypoint: mathy_tools:double
    input_schema: {type: object, properties: {n: {type: integer}}, required: [n]}
  - name: mathy/later
    description: imports its sibling module only when it runs
    source: python
    entrypoint: mathy_tools:later
  - name: mathy/reverse
    source: command
    command: [./reverse.py]
    input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  - name: mathy/shout
    source: command
    command: [python3, scripts/shout.py]
  - name: mathy/halve
    source: command
    command: [python3, -m, mathy_cmd]
""",
    "mathy_tools.py": '''\
"""Python tools of mathy/tools: a sibling module imported by its plain name."""

import mathy_helpers


def double(n: int) -> dict[str, int]:
    return {"doubled": mathy_helpers.twice(n)}


def later() -> dict[str, str]:
    import mathy_helpers as helpers  # an import that runs at call time

    return {"helper": helpers.__file__.rsplit("/", 1)[-1]}
''',
    "mathy_helpers.py": "def twice(n: int) -> int:\n    return 2 * n\n",
    "mathy_cmd.py": """\
import json
import sys

json.dump({"halved": json.load(sys.stdin)["n"] / 2}, sys.stdout)
""",
    "reverse.py": """\
#!/usr/bin/env python3
import json
import sys

json.dump({"reversed": json.load(sys.stdin)["text"][::-1]}, sys.stdout)
""",
    "scripts/shout.py": """\
import json
import os
import sys

json.dump(
    {"text": json.load(sys.stdin)["text"].upper() + "!",
     "skill_dir": os.environ.get("CLEVERAGENTS_SKILL_DIR")},
    sys.stdout,
)
""",
}


def _twin(side: str) -> dict[str, str]:
    """A skill folder whose module is called ``tools``, like its twin's."""
    return {
        f"{side}.yaml": f"""\
name: twins/{side}
tools:
  - name: twins/{side}-which
    source: python
    entrypoint: tools:which
  - name: twins/{side}-nested
    source: python
    entrypoint: kit.inner:which
  - name: twins/{side}-count
    description: a module of the worker's environment, as before
    source: python
    entrypoint: cleveragents.examples.tools:word_count
""",
        "tools.py": f'''\
import helpers

SIDE = "{side}"


def which() -> dict[str, str]:
    return {{"tools": SIDE, "helpers": helpers.SIDE}}
''',
        "helpers.py": f'SIDE = "{side}"\n',
        "kit/__init__.py": "",
        "kit/inner.py": """\
from . import sibling
from .sibling import SIDE


def which() -> dict[str, str]:
    return {"kit": SIDE, "sibling": sibling.__name__.rsplit(".", 1)[-1]}
""",
        "kit/sibling.py": f'SIDE = "{side}"\n',
    }


def _write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if text.startswith("#!"):
            path.chmod(0o755)
    return folder


def _copied(files: dict[str, str], where: Path, name: str) -> Path:
    """Write a skill folder in a scratch place, then copy it to ``where/name`` (as the user did)."""
    with tempfile.TemporaryDirectory() as source:
        _write(Path(source) / name, files)
        return Path(shutil.copytree(Path(source) / name, where / name))


@pytest.fixture
def deployed() -> Iterator[Path]:
    """A folder of skill folders that anyone may read, as a worker's tool user must.

    pytest's ``tmp_path`` is root's alone; a root worker runs command tools as ``nobody``.
    """
    root = Path(tempfile.mkdtemp(prefix="cleveragents-skill-folders-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ok(result: SkillResult) -> Any:
    assert result.success, result.error
    return result.output_data


# ---- through the CLI, from another folder ---------------------------------------------------


def _cli(cwd: Path, catalogue: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    """``cleveragents ...`` on the embedded default, run from ``cwd``, no PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CLEVERAGENTS_") and k != "PYTHONPATH"
    }
    env["CLEVERAGENTS_CATALOGUE"] = os.pathsep.join(str(p) for p in catalogue)
    env["CLEVERAGENTS_HOME"] = str(cwd / ".cleveragents")
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def test_a_copied_skill_folder_runs_its_python_tool_from_another_folder(
    deployed: Path, tmp_path: Path
) -> None:
    # Given the skill folder copied to /somewhere/skills, and a shell in another folder
    skills = _copied(MATHY, deployed, "mathy").parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # When the user submits a python tool of it and waits
    done = _cli(
        elsewhere,
        [skills],
        "submit",
        "mathy/tools",
        "mathy/double",
        "--args",
        '{"n": 21}',
        "--wait",
        "--json",
    )

    # Then its module (and the module that imports) came from the skill folder
    assert done.returncode == 0, done.stderr + done.stdout
    assert json.loads(done.stdout)["output_data"] == {"doubled": 42}


def test_every_tool_of_copied_skill_folders_runs_from_another_folder(
    deployed: Path, tmp_path: Path
) -> None:
    # Given the mathy folder and two twin folders, each with its own tools.py
    _copied(MATHY, deployed, "mathy")
    _copied(_twin("left"), deployed, "left")
    _copied(_twin("right"), deployed, "right")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lines = [
        ("mathy/tools", "mathy/double", {"n": 4}, {"doubled": 8}),
        ("mathy/tools", "mathy/later", {}, {"helper": "mathy_helpers.py"}),
        ("mathy/tools", "mathy/reverse", {"text": "abc"}, {"reversed": "cba"}),
        ("mathy/tools", "mathy/halve", {"n": 3}, {"halved": 1.5}),
        ("twins/left", "twins/left-which", {}, {"tools": "left", "helpers": "left"}),
        ("twins/right", "twins/right-which", {}, {"tools": "right", "helpers": "right"}),
        ("twins/right", "twins/right-nested", {}, {"kit": "right", "sibling": "sibling"}),
        ("twins/left", "twins/left-count", {"text": "a b c"}, {"words": 3}),
    ]
    batch = elsewhere / "batch.jsonl"
    batch.write_text(
        "".join(
            json.dumps({"request_id": f"r{i}", "skill": s, "tool": t, "arguments": a}) + "\n"
            for i, (s, t, a, _) in enumerate(lines)
        ),
        encoding="utf-8",
    )

    # When the whole batch runs from another folder, with the catalogue pointing at them
    done = _cli(elsewhere, [deployed], "batch", "run", str(batch), "--out", "out.jsonl")

    # Then every tool found its module or its script in its own skill folder
    assert done.returncode == 0, done.stderr + done.stdout
    results = {
        row["request_id"]: row
        for row in map(json.loads, (elsewhere / "out.jsonl").read_text().splitlines())
    }
    for i, (_, tool, _, expected) in enumerate(lines):
        assert results[f"r{i}"]["output_data"] == expected, (tool, results[f"r{i}"]["error"])

    # And a relative script path that was an argument, with the folder in the environment
    shout = _cli(
        elsewhere,
        [deployed],
        "submit",
        "mathy/tools",
        "mathy/shout",
        "--args",
        '{"text": "hey"}',
        "--wait",
        "--json",
    )
    assert shout.returncode == 0, shout.stderr + shout.stdout
    assert json.loads(shout.stdout)["output_data"] == {
        "text": "HEY!",
        "skill_dir": str(deployed.resolve() / "mathy"),
    }


# ---- in-process: isolation and the rules -----------------------------------------------------


def test_two_skill_folders_with_the_same_module_names_each_get_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two folders that both hold tools.py, helpers.py and kit/, run from a third
    left = _write(tmp_path / "left", _twin("left"))
    right = _write(tmp_path / "right", _twin("right"))
    monkeypatch.chdir(tmp_path)
    catalogue = Catalogue.from_paths(left, right)
    assert catalogue.errors == []
    before = set(sys.modules)

    def run(side: str, tool: str) -> Any:
        return _ok(invoke({"skill": f"twins/{side}", "tool": f"twins/{side}-{tool}"}, catalogue))

    # When both run in one process, in either order, twice
    for _ in range(2):
        assert run("left", "which") == {"tools": "left", "helpers": "left"}
        assert run("right", "which") == {"tools": "right", "helpers": "right"}
        assert run("right", "nested") == {"kit": "right", "sibling": "sibling"}
        assert run("left", "nested") == {"kit": "left", "sibling": "sibling"}

    # Then neither leaked its modules under their plain names
    added = set(sys.modules) - before
    for plain in ("tools", "helpers", "kit", "kit.inner", "kit.sibling"):
        assert plain not in added
    # And installed modules still import as before, from a skill in a folder
    counted = invoke(
        {"skill": "twins/right", "tool": "twins/right-count", "arguments": {"text": "a b"}},
        catalogue,
    )
    assert _ok(counted) == {"words": 2}


def test_the_skill_folder_comes_before_the_path_and_only_for_its_own_skills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a module `json_shadow` on sys.path, and another of that name in a skill folder
    on_path = tmp_path / "on_path"
    _write(on_path, {"json_shadow.py": 'WHERE = "path"\n\ndef where() -> str:\n    return WHERE\n'})
    monkeypatch.syspath_prepend(str(on_path))
    folder = _write(
        tmp_path / "skill",
        {
            "json_shadow.py": 'WHERE = "folder"\n\ndef where() -> str:\n    return WHERE\n',
            "s.yaml": """\
name: shadow/folder
tools:
  - {name: shadow/folder-where, source: python, entrypoint: "json_shadow:where"}
""",
        },
    )
    catalogue = Catalogue.from_paths(folder)
    in_code = Catalogue.from_skills(
        [
            Skill(
                name="shadow/path",
                tools=[
                    ToolSpec(
                        name="shadow/path-where", source="python", entrypoint="json_shadow:where"
                    ),
                ],
            )
        ]
    )

    # Then the skill file's tool takes its folder's; a tool built in code, the path's
    assert (
        _ok(invoke({"skill": "shadow/folder", "tool": "shadow/folder-where"}, catalogue))
        == "folder"
    )
    assert _ok(invoke({"skill": "shadow/path", "tool": "shadow/path-where"}, in_code)) == "path"


def test_a_skill_file_tells_its_tools_their_folder_without_changing_the_wire_format(
    tmp_path: Path,
) -> None:
    folder = _write(tmp_path / "mathy", MATHY)
    catalogue = Catalogue.from_paths(folder)
    entry = catalogue.resolve("mathy/tools").resolved_tools[0]

    assert entry.tool.skill_folder == folder.resolve()
    assert "skill_folder" not in entry.tool.model_dump()
    assert "skill_folder" not in catalogue.resolve("mathy/tools").model_dump_json()
    assert ToolSpec(name="a/b", source="python", entrypoint="m:f").skill_folder is None


def test_relative_paths_of_a_command_resolve_against_the_skill_folder(tmp_path: Path) -> None:
    folder = _write(tmp_path / "mathy", MATHY)
    (folder / "data").mkdir()
    (folder / "kit").mkdir()

    def resolved(*argv: str) -> list[str]:
        return resolve_command(list(argv), folder)

    # A program written with a slash, and arguments that name a file of the folder
    assert resolved("./reverse.py") == [str(folder / "reverse.py")]
    assert resolved("python3", "scripts/shout.py", "x") == [
        "python3",
        str(folder / "scripts" / "shout.py"),
        "x",
    ]
    assert resolved("python3", "reverse.py") == ["python3", str(folder / "reverse.py")]
    # A folder of the skill, when written as a path (with a slash)
    assert resolved("ls", "data/") == ["ls", str(folder / "data") + "/"]
    assert resolved("ls", "./kit") == ["ls", str(folder / "kit")]
    # Left alone: bare programs (PATH), options, module names, names of nothing in the folder,
    # a bare folder name, absolute paths
    assert resolved("python3", "-m", "mathy_cmd") == ["python3", "-m", "mathy_cmd"]
    assert resolved("reverse.py") == ["reverse.py"]
    assert resolved("python3", "--file=reverse.py") == ["python3", "--file=reverse.py"]
    assert resolved("python3", "nothing/here.py") == ["python3", "nothing/here.py"]
    assert resolved("ls", "kit") == ["ls", "kit"]
    assert resolved("/bin/true", "/etc/hostname") == ["/bin/true", "/etc/hostname"]
    # Without a skill folder (a tool built in code): unchanged
    assert resolve_command(["./reverse.py", "reverse.py"], None) == ["./reverse.py", "reverse.py"]


def test_command_tools_of_a_folder_run_with_it_first_on_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _write(tmp_path / "mathy", MATHY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    catalogue = Catalogue.from_paths(folder)

    halved = invoke(
        {"skill": "mathy/tools", "tool": "mathy/halve", "arguments": {"n": 5}}, catalogue
    )
    shout = invoke(
        {"skill": "mathy/tools", "tool": "mathy/shout", "arguments": {"text": "a"}}, catalogue
    )
    reverse = invoke(
        {"skill": "mathy/tools", "tool": "mathy/reverse", "arguments": {"text": "ab"}}, catalogue
    )

    assert _ok(halved) == {"halved": 2.5}
    assert _ok(shout) == {"text": "A!", "skill_dir": str(folder.resolve())}
    assert _ok(reverse) == {"reversed": "ba"}
    assert stat.S_IMODE((folder / "reverse.py").stat().st_mode) & 0o111


def test_an_included_tool_keeps_the_folder_of_the_file_that_defines_it(tmp_path: Path) -> None:
    # Given skill twins/left's folder, and a skill elsewhere that includes it
    left = _write(tmp_path / "left", _twin("left"))
    top = _write(
        tmp_path / "top",
        {
            "top.yaml": "name: twins/top\nincludes: [twins/left]\n",
            "tools.py": 'def which() -> dict[str, str]:\n    return {"tools": "top"}\n',
        },
    )
    catalogue = Catalogue.from_paths(top, left)

    # Then the included tool runs the module of its own folder, not the includer's
    which = invoke({"skill": "twins/top", "tool": "twins/left-which"}, catalogue)
    assert _ok(which) == {"tools": "left", "helpers": "left"}


def test_one_tool_defined_alike_in_two_folders_is_two_tools(tmp_path: Path) -> None:
    tool = "  - {name: same/which, source: python, entrypoint: 'tools:which'}\n"
    left = _write(tmp_path / "a", {**_twin("left"), "a.yaml": f"name: same/a\ntools:\n{tool}"})
    right = _write(tmp_path / "b", {**_twin("right"), "b.yaml": f"name: same/b\ntools:\n{tool}"})
    both = _write(tmp_path / "c", {"c.yaml": "name: same/both\nincludes: [same/a, same/b]\n"})
    catalogue = Catalogue.from_paths(left, right, both)

    assert _ok(invoke({"skill": "same/a", "tool": "same/which"}, catalogue))["tools"] == "left"
    assert _ok(invoke({"skill": "same/b", "tool": "same/which"}, catalogue))["tools"] == "right"
    refused = invoke({"skill": "same/both", "tool": "same/which"}, catalogue)
    assert refused.error is not None
    assert refused.error.error_type == "resolution_failure"
