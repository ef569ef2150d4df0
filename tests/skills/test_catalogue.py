"""The catalogue: loading skill files, reporting every problem, resolving once."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent

import pytest

from cleveragents.errors import IncludeCycleError, ResolutionFailure, SkillNotFoundError
from cleveragents.settings import bundled_examples_path
from cleveragents.skills import Catalogue, SkillErrorType


def _write(folder: Path, relative: str, text: str) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dedent(text).lstrip(), encoding="utf-8")
    return path


def _where(catalogue: Catalogue) -> list[str]:
    return [p.where for p in catalogue.errors]


_ECHO_TOOL = """
    tools:
      - name: {tool}
        source: python
        entrypoint: cleveragents.examples.tools:echo
"""


def _simple(name: str, tool: str, extra: str = "") -> str:
    return f"name: {name}\n{extra}" + dedent(_ECHO_TOOL).format(tool=tool)


# --------------------------------------------------------------------------- loading


def test_yaml_yml_and_json_files_are_all_loaded(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", _simple("local/a", "local/ta"))
    _write(tmp_path, "b.yml", _simple("local/b", "local/tb"))
    _write(
        tmp_path,
        "c.json",
        json.dumps(
            {
                "name": "local/c",
                "includes": ["local/a"],
                "tools": [{"name": "local/tc", "source": "command", "command": ["true"]}],
            }
        ),
    )
    _write(tmp_path, "notes.txt", "not a skill file, and ignored")

    catalogue = Catalogue.from_paths(tmp_path)

    assert catalogue.errors == []
    assert catalogue.names == ["local/a", "local/b", "local/c"]
    assert [e.tool.name for e in catalogue.resolve("local/c").resolved_tools] == [
        "local/tc",
        "local/ta",
    ]


def test_a_skills_list_file_holds_several_skills(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "many.yaml",
        """
        skills:
          - name: local/one
          - name: local/two
            includes: [local/one]
        """,
    )
    catalogue = Catalogue.from_paths(tmp_path)
    assert catalogue.errors == []
    assert catalogue.names == ["local/one", "local/two"]


def test_nested_folders_are_read_recursively_in_sorted_path_order(tmp_path: Path) -> None:
    # The same skill in three places: the first in sorted path order wins.
    _write(tmp_path, "b/deeper/x.yaml", "name: local/dup\ndescription: from b/deeper\n")
    _write(tmp_path, "a/z.yaml", "name: local/dup\ndescription: from a/z\n")
    _write(tmp_path, "c.yaml", "name: local/dup\ndescription: from c\n")
    _write(tmp_path, "a/y/only.yml", "name: local/only\n")

    catalogue = Catalogue.from_paths(tmp_path)

    assert catalogue.names == ["local/dup", "local/only"]
    assert catalogue.resolve("local/dup").skill.description == "from a/z"
    assert catalogue.origin("local/dup") == str(tmp_path / "a/z.yaml")
    assert _where(catalogue) == [str(tmp_path / "b/deeper/x.yaml"), str(tmp_path / "c.yaml")]


def test_a_duplicate_skill_name_is_listed_and_the_first_wins(tmp_path: Path) -> None:
    first = _write(tmp_path, "1-first.yaml", _simple("local/dup", "local/first"))
    second = _write(tmp_path, "2-second.yaml", _simple("local/dup", "local/second"))

    catalogue = Catalogue.from_paths(tmp_path)

    assert [e.tool.name for e in catalogue.resolve("local/dup").resolved_tools] == ["local/first"]
    [problem] = catalogue.errors
    assert problem.where == str(second)
    assert "duplicate" in problem.reason
    assert "local/dup" in problem.reason
    assert str(first) in problem.reason


def test_a_bad_yaml_file_is_listed_and_the_others_still_load(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.yaml", "name: local/bad\ntools: [unclosed\n")
    _write(tmp_path, "good.yaml", _simple("local/good", "local/t"))

    catalogue = Catalogue.from_paths(tmp_path)

    assert catalogue.names == ["local/good"]
    [problem] = catalogue.errors
    assert problem.where == str(bad)
    assert "\n" not in problem.reason


@pytest.mark.parametrize(
    ("filename", "text"),
    [
        ("empty.yaml", ""),
        ("scalar.yaml", "just words\n"),
        ("list.yaml", "- name: local/x\n"),
        ("broken.json", "{not json"),
        ("skills-not-a-list.yaml", "skills: {name: local/x}\n"),
        ("unknown-key.yaml", "name: local/x\ncolour: red\n"),
        ("no-type-schema.yaml", "name: local/x\ninput_schema: {properties: {}}\n"),
    ],
)
def test_every_kind_of_bad_file_is_listed_without_hiding_others(
    tmp_path: Path, filename: str, text: str
) -> None:
    bad = _write(tmp_path, filename, text)
    _write(tmp_path, "good.yaml", "name: local/good\n")

    catalogue = Catalogue.from_paths(tmp_path)

    assert catalogue.names == ["local/good"]
    assert _where(catalogue) == [str(bad)]


def test_a_bad_entry_in_a_skills_list_does_not_hide_the_other_entries(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "many.yaml",
        """
        skills:
          - name: local/one
          - name: not-namespaced
          - just a string
          - name: local/three
            tools:
              - {name: local/t, source: python, entrypoint: cleveragents.examples.tools:echo}
        """,
    )
    catalogue = Catalogue.from_paths(tmp_path)

    assert catalogue.names == ["local/one", "local/three"]
    assert _where(catalogue) == [f"{path}[1]", f"{path}[2]"]
    assert "namespaced" in catalogue.errors[0].reason


def test_an_unquoted_yaml_version_keeps_its_text(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "versions.yaml",
        """
        skills:
          - {name: local/ten, version: 1.10}
          - {name: local/two, version: 1.2}
          - {name: local/int, version: 3}
        """,
    )
    catalogue = Catalogue.from_paths(tmp_path)
    assert catalogue.resolve("local/ten").metadata.version == "1.10"
    assert catalogue.resolve("local/two").metadata.version == "1.2"
    assert catalogue.resolve("local/int").metadata.version == "3"


def test_a_nonexistent_path_is_reported(tmp_path: Path) -> None:
    _write(tmp_path, "good.yaml", "name: local/good\n")
    missing = tmp_path / "no-such-folder"

    catalogue = Catalogue.from_paths(tmp_path, missing)

    assert catalogue.names == ["local/good"]
    assert _where(catalogue) == [str(missing)]


def test_a_single_file_can_be_given_as_a_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "one.yaml", "name: local/one\n")
    _write(tmp_path, "other.yaml", "name: local/other\n")
    assert Catalogue.from_paths(path).names == ["local/one"]


# --------------------------------------------------------------------------- resolving


def _catalogue_with_a_cycle(tmp_path: Path) -> Catalogue:
    _write(tmp_path, "a.yaml", "name: local/a\nincludes: [local/b]\n")
    _write(tmp_path, "b.yaml", "name: local/b\nincludes: [local/a]\n")
    _write(tmp_path, "deploy.yaml", "name: ops/deploy\nincludes: [ops/lifecycle]\n")
    _write(tmp_path, "good.yaml", _simple("local/good", "local/t"))
    return Catalogue.from_paths(tmp_path)


def test_skills_that_fail_to_resolve_are_listed_with_their_error_type(tmp_path: Path) -> None:
    catalogue = _catalogue_with_a_cycle(tmp_path)
    assert [(p.where, p.error_type) for p in catalogue.errors] == [
        ("local/a", SkillErrorType.CYCLE_DETECTED),
        ("local/b", SkillErrorType.CYCLE_DETECTED),
        ("ops/deploy", SkillErrorType.RESOLUTION_FAILURE),
    ]
    assert "local/a -> local/b -> local/a" in catalogue.errors[0].reason
    assert "ops/lifecycle" in catalogue.errors[2].reason


def test_resolve_of_a_failed_skill_raises_its_error(tmp_path: Path) -> None:
    catalogue = _catalogue_with_a_cycle(tmp_path)
    with pytest.raises(IncludeCycleError, match="local/a -> local/b -> local/a"):
        catalogue.resolve("local/a")
    with pytest.raises(ResolutionFailure, match="ops/lifecycle") as caught:
        catalogue.resolve("ops/deploy")
    assert caught.value.error_type is SkillErrorType.RESOLUTION_FAILURE


def test_list_omits_skills_that_fail_to_resolve(tmp_path: Path) -> None:
    catalogue = _catalogue_with_a_cycle(tmp_path)
    assert [m.name for m in catalogue.list()] == ["local/good"]
    assert "local/a" not in catalogue
    assert "local/good" in catalogue
    assert len(catalogue) == 1


def test_resolve_of_an_unknown_skill_is_skill_not_found(tmp_path: Path) -> None:
    catalogue = _catalogue_with_a_cycle(tmp_path)
    with pytest.raises(SkillNotFoundError, match="ops/bicycle") as caught:
        catalogue.resolve("ops/bicycle")
    assert caught.value.error_type is SkillErrorType.SKILL_NOT_FOUND


def test_resolve_returns_the_same_object_every_time(tmp_path: Path) -> None:
    catalogue = _catalogue_with_a_cycle(tmp_path)
    first = catalogue.resolve("local/good")
    assert catalogue.resolve("local/good") is first
    definition, entry = catalogue.find_tool("local/good", "local/t")
    assert definition is first
    assert entry is first.resolved_tools[0]


def test_find_tool_of_a_tool_outside_the_skill_is_a_resolution_failure(tmp_path: Path) -> None:
    catalogue = _catalogue_with_a_cycle(tmp_path)
    with pytest.raises(ResolutionFailure, match="local/elsewhere") as caught:
        catalogue.find_tool("local/good", "local/elsewhere")
    assert caught.value.error_type is SkillErrorType.RESOLUTION_FAILURE


def test_list_gives_metadata_sorted_by_name(tmp_path: Path) -> None:
    _write(tmp_path, "z.yaml", _simple("local/zeta", "local/tz", "version: 2.0.1\n"))
    _write(tmp_path, "a.yaml", _simple("local/alpha", "local/ta"))
    listed = Catalogue.from_paths(tmp_path).list()
    assert [(m.name, m.version, m.tool_count) for m in listed] == [
        ("local/alpha", "0.0.0", 1),
        ("local/zeta", "2.0.1", 1),
    ]


# --------------------------------------------------------------------------- bundled examples


@pytest.fixture(scope="module")
def examples() -> Catalogue:
    return Catalogue.from_paths(bundled_examples_path())


def test_the_bundled_examples_load_without_errors(examples: Catalogue) -> None:
    assert [str(p) for p in examples.errors] == []
    assert len(examples) >= 4


def test_the_bundled_examples_have_a_diamond(examples: Catalogue) -> None:
    notes = examples.resolve("local/notes")
    assert set(notes.skill.includes) >= {"local/text-tools", "local/inspect"}
    names = [e.tool.name for e in notes.resolved_tools]
    assert len(names) == len(set(names))
    from_common = [e for e in notes.resolved_tools if e.source_skill == "local/common"]
    common_tools = [t.name for t in examples.resolve("local/common").skill.tools]
    assert [e.tool.name for e in from_common] == common_tools
    assert from_common[0].via == ["local/text-tools", "local/common"]


def test_the_bundled_examples_have_a_read_only_and_a_writing_skill(examples: Catalogue) -> None:
    metadata = {m.name: m for m in examples.list()}
    research = examples.resolve("local/research")
    assert research.skill.read_only is True
    assert metadata["local/research"].read_only is True
    assert metadata["local/notes"].writes is True
    assert metadata["local/notes"].read_only is False


def test_the_bundled_examples_have_python_and_command_tools_and_schemas(
    examples: Catalogue,
) -> None:
    tools = [e.tool for name in examples.names for e in examples.resolve(name).resolved_tools]
    assert {t.source for t in tools} == {"python", "command"}
    assert any(t.input_schema for t in tools)
    assert any(t.output_schema for t in tools)
    definitions = [examples.resolve(name) for name in examples.names]
    assert any(d.input_schema and d.output_schema for d in definitions)
