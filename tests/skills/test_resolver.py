"""Resolution: flattening includes into one ordered tool list (SPEC section 4)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cleveragents.errors import (
    IncludeCycleError,
    ReadOnlyViolation,
    ResolutionFailure,
    SkillNotFoundError,
    SkillResolutionError,
)
from cleveragents.skills import (
    Catalogue,
    Skill,
    SkillDefinition,
    SkillErrorType,
    ToolSpec,
    map_tool_error,
    resolve_skill,
)

# --------------------------------------------------------------------------- helpers


def _tool(name: str, **flags: Any) -> ToolSpec:
    entrypoint = "cleveragents.examples.tools:echo"
    return ToolSpec(name=name, source="python", entrypoint=entrypoint, **flags)


def _skill(
    name: str,
    tools: Sequence[str | ToolSpec] = (),
    includes: Sequence[str] = (),
    **fields: Any,
) -> Skill:
    specs = [t if isinstance(t, ToolSpec) else _tool(t) for t in tools]
    return Skill(name=name, tools=specs, includes=list(includes), **fields)


def _by_name(*skills: Skill) -> dict[str, Skill]:
    return {s.name: s for s in skills}


def _order(definition: SkillDefinition) -> list[str]:
    return [e.tool.name for e in definition.resolved_tools]


def _vias(definition: SkillDefinition) -> dict[str, list[str]]:
    return {e.tool.name: e.via for e in definition.resolved_tools}


# --------------------------------------------------------------------------- order, diamond, via


def test_own_tools_come_first_then_includes_depth_first_in_declared_order() -> None:
    skills = _by_name(
        _skill("local/a", ["local/a1", "local/a2"], includes=["local/b", "local/c"]),
        _skill("local/b", ["local/b1"], includes=["local/d"]),
        _skill("local/c", ["local/c1"]),
        _skill("local/d", ["local/d1"]),
    )
    definition = resolve_skill("local/a", skills)
    assert _order(definition) == ["local/a1", "local/a2", "local/b1", "local/d1", "local/c1"]


def test_declared_include_order_is_kept_even_against_name_order() -> None:
    skills = _by_name(
        _skill("local/a", includes=["local/z", "local/m"]),
        _skill("local/m", ["local/m1"]),
        _skill("local/z", ["local/z1"]),
    )
    assert _order(resolve_skill("local/a", skills)) == ["local/z1", "local/m1"]


def test_a_diamond_contributes_its_tools_once() -> None:
    skills = _by_name(
        _skill("local/top", includes=["local/left", "local/right"]),
        _skill("local/left", ["local/l"], includes=["local/base"]),
        _skill("local/right", ["local/r"], includes=["local/base"]),
        _skill("local/base", ["local/b1", "local/b2"]),
    )
    definition = resolve_skill("local/top", skills)
    assert _order(definition) == ["local/l", "local/b1", "local/b2", "local/r"]
    base_entry = definition.resolved_tools[1]
    assert base_entry.source_skill == "local/base"
    assert base_entry.via == ["local/left", "local/base"]  # reached first through the left
    assert definition.metadata.tool_count == 4


def test_via_is_empty_for_own_tools_and_the_include_chain_otherwise() -> None:
    skills = _by_name(
        _skill("local/a", ["local/own"], includes=["local/b"]),
        _skill("local/b", ["local/mid"], includes=["local/c"]),
        _skill("local/c", ["local/deep"]),
    )
    definition = resolve_skill("local/a", skills)
    assert _vias(definition) == {
        "local/own": [],
        "local/mid": ["local/b"],
        "local/deep": ["local/b", "local/c"],
    }
    assert [e.source_skill for e in definition.resolved_tools] == [
        "local/a",
        "local/b",
        "local/c",
    ]


def test_via_starts_at_the_first_include_of_the_skill_being_resolved() -> None:
    skills = _by_name(
        _skill("local/a", includes=["local/b"]),
        _skill("local/b", ["local/mid"], includes=["local/c"]),
        _skill("local/c", ["local/deep"]),
    )
    definition = resolve_skill("local/b", skills)
    assert _vias(definition) == {"local/mid": [], "local/deep": ["local/c"]}


def test_the_definition_carries_the_skill_its_schemas_and_derived_metadata() -> None:
    root = _skill(
        "local/a",
        [_tool("local/w", writes=True)],
        includes=["local/b"],
        version="2.1",
        input_schema={"type": "object"},
        output_schema={"type": "array"},
    )
    skills = _by_name(root, _skill("local/b", ["local/r"]))
    definition = resolve_skill("local/a", skills)
    assert definition.skill is root
    assert definition.input_schema == {"type": "object"}
    assert definition.output_schema == {"type": "array"}
    assert definition.metadata.version == "2.1"
    assert definition.metadata.tool_count == 2
    assert definition.metadata.writes is True


# --------------------------------------------------------------------------- errors


def test_cycle_is_named_in_the_error() -> None:
    skills = _by_name(
        _skill("local/a", includes=["local/b"]),
        _skill("local/b", includes=["local/a"]),
    )
    with pytest.raises(IncludeCycleError) as caught:
        resolve_skill("local/a", skills)
    assert caught.value.error_type is SkillErrorType.CYCLE_DETECTED
    assert "local/a -> local/b -> local/a" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_skill_including_itself_is_a_cycle() -> None:
    skills = _by_name(_skill("local/a", includes=["local/a"]))
    with pytest.raises(IncludeCycleError, match="local/a -> local/a"):
        resolve_skill("local/a", skills)


def test_a_cycle_below_the_root_names_only_the_loop() -> None:
    skills = _by_name(
        _skill("local/root", includes=["local/b"]),
        _skill("local/b", includes=["local/c"]),
        _skill("local/c", includes=["local/b"]),
    )
    with pytest.raises(IncludeCycleError) as caught:
        resolve_skill("local/root", skills)
    assert "local/b -> local/c -> local/b" in str(caught.value)
    assert "local/root" not in str(caught.value)


def test_a_missing_include_is_a_resolution_failure() -> None:
    skills = _by_name(_skill("ops/deploy", includes=["ops/lifecycle"]))
    with pytest.raises(ResolutionFailure, match="ops/lifecycle") as caught:
        resolve_skill("ops/deploy", skills)
    assert caught.value.error_type is SkillErrorType.RESOLUTION_FAILURE
    # "lifecycle" holds "cycle": the error's own type still wins in the mapping.
    mapped = map_tool_error(caught.value, skill_name="ops/deploy")
    assert mapped.error_type is SkillErrorType.RESOLUTION_FAILURE


def test_an_unknown_skill_is_skill_not_found() -> None:
    with pytest.raises(SkillNotFoundError, match="ops/bicycle") as caught:
        resolve_skill("ops/bicycle", _by_name(_skill("local/a")))
    assert caught.value.error_type is SkillErrorType.SKILL_NOT_FOUND
    mapped = map_tool_error(caught.value, skill_name="ops/bicycle")
    assert mapped.error_type is SkillErrorType.SKILL_NOT_FOUND


def test_the_first_problem_in_walk_order_is_reported_missing_before_cycle() -> None:
    skills = _by_name(
        _skill("local/a", includes=["gone/x", "local/b"]),
        _skill("local/b", includes=["local/a"]),
    )
    with pytest.raises(ResolutionFailure, match="gone/x"):
        resolve_skill("local/a", skills)


def test_the_first_problem_in_walk_order_is_reported_cycle_before_missing() -> None:
    skills = _by_name(
        _skill("local/a", includes=["local/b", "gone/x"]),
        _skill("local/b", includes=["local/a"]),
    )
    with pytest.raises(IncludeCycleError):
        resolve_skill("local/a", skills)


def test_two_different_tools_with_one_name_are_a_resolution_failure() -> None:
    skills = _by_name(
        _skill("local/a", includes=["local/b", "local/c"]),
        _skill("local/b", [_tool("local/t", description="one")]),
        _skill("local/c", [_tool("local/t", description="two")]),
    )
    with pytest.raises(ResolutionFailure, match="local/t") as caught:
        resolve_skill("local/a", skills)
    assert caught.value.error_type is SkillErrorType.RESOLUTION_FAILURE


def test_an_own_tool_clashing_with_an_included_one_is_a_resolution_failure() -> None:
    skills = _by_name(
        _skill("local/a", [_tool("local/t")], includes=["local/b"]),
        _skill("local/b", [_tool("local/t", writes=True)]),
    )
    with pytest.raises(ResolutionFailure, match="local/t"):
        resolve_skill("local/a", skills)


def test_an_identical_tool_reached_twice_is_fine() -> None:
    shared = _tool("local/t", description="same everywhere")
    skills = _by_name(
        _skill("local/a", includes=["local/b", "local/c"]),
        _skill("local/b", [shared]),
        _skill("local/c", [_tool("local/t", description="same everywhere"), "local/c1"]),
    )
    definition = resolve_skill("local/a", skills)
    assert _order(definition) == ["local/t", "local/c1"]
    assert definition.resolved_tools[0].source_skill == "local/b"


@pytest.mark.parametrize("flag", ["writes", "side_effects"])
def test_read_only_true_reaching_a_write_capable_tool_is_a_validation_error(flag: str) -> None:
    skills = _by_name(
        _skill("local/reader", ["local/look"], includes=["local/helper"], read_only=True),
        _skill("local/helper", [_tool("local/poke", **{flag: True})]),
    )
    with pytest.raises(ReadOnlyViolation, match="local/poke") as caught:
        resolve_skill("local/reader", skills)
    assert caught.value.error_type is SkillErrorType.VALIDATION_ERROR
    mapped = map_tool_error(caught.value, skill_name="local/reader")
    assert mapped.error_type is SkillErrorType.VALIDATION_ERROR


def test_read_only_true_with_only_read_tools_resolves_read_only() -> None:
    skills = _by_name(
        _skill("local/reader", ["local/look"], includes=["local/b"], read_only=True),
        _skill("local/b", ["local/peek"]),
    )
    metadata = resolve_skill("local/reader", skills).metadata
    assert (metadata.read_only, metadata.writes) == (True, False)


def test_read_only_false_with_writing_tools_is_fine() -> None:
    skills = _by_name(
        _skill("local/writer", [_tool("local/put", writes=True)], read_only=False),
    )
    metadata = resolve_skill("local/writer", skills).metadata
    assert (metadata.read_only, metadata.writes) == (False, True)


@pytest.mark.parametrize("declared", [False, None])
def test_without_the_assertion_read_only_is_derived(declared: bool | None) -> None:
    skills = _by_name(_skill("local/plain", ["local/look"], read_only=declared))
    assert resolve_skill("local/plain", skills).metadata.read_only is True


def test_a_writer_reached_only_by_a_sibling_does_not_taint_a_read_only_skill() -> None:
    skills = _by_name(
        _skill("local/reader", includes=["local/base"], read_only=True),
        _skill("local/writer", [_tool("local/put", writes=True)], includes=["local/base"]),
        _skill("local/base", ["local/look"]),
    )
    assert resolve_skill("local/reader", skills).metadata.read_only is True
    assert resolve_skill("local/writer", skills).metadata.writes is True


# --------------------------------------------------------------------------- property test
#
# Random include graphs are resolved by the library and by the reference walk
# below, written independently (an explicit stack instead of recursion), from
# the words of SPEC section 4: own tools first, then each include's, depth first
# in declared order; a skill already entered is skipped; an include that is on
# the current path is a cycle; an include not in the catalogue is a missing
# include. The first problem met in that walk order is the one reported.

_SHARED = "t/shared"  # a tool name several skills may define, identically or not
_MISSING = ["gone/m0", "gone/m1"]


@dataclass(frozen=True)
class _Expected:
    tools: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    error: SkillErrorType | None = None
    cycle: list[str] | None = None
    missing: str | None = None
    clash: str | None = None
    writes: bool = False
    diamond: bool = False  # some skill was reached a second time and skipped


def _reference_walk(root: str, skills: dict[str, Skill]) -> _Expected:
    if root not in skills:
        return _Expected(error=SkillErrorType.SKILL_NOT_FOUND)
    found: list[tuple[str, str, tuple[str, ...]]] = []
    spec_of: dict[str, ToolSpec] = {}
    entered: set[str] = set()
    diamond = False

    def enter(name: str, via: tuple[str, ...]) -> str | None:
        entered.add(name)
        for tool in skills[name].tools:
            if tool.name not in spec_of:
                spec_of[tool.name] = tool
                found.append((tool.name, name, via))
            elif spec_of[tool.name] != tool:
                return tool.name
        return None

    clash = enter(root, ())
    if clash is not None:
        return _Expected(error=SkillErrorType.RESOLUTION_FAILURE, clash=clash)
    stack: list[tuple[str, Iterator[str]]] = [(root, iter(skills[root].includes))]
    while stack:
        include = next(stack[-1][1], None)
        if include is None:
            stack.pop()
            continue
        path = [name for name, _ in stack]
        if include in path:
            loop = [*path[path.index(include) :], include]
            return _Expected(error=SkillErrorType.CYCLE_DETECTED, cycle=loop)
        if include in entered:
            diamond = True
            continue
        if include not in skills:
            return _Expected(error=SkillErrorType.RESOLUTION_FAILURE, missing=include)
        clash = enter(include, (*path[1:], include))
        if clash is not None:
            return _Expected(error=SkillErrorType.RESOLUTION_FAILURE, clash=clash)
        stack.append((include, iter(skills[include].includes)))
    writes = any(spec_of[tool].writes or spec_of[tool].side_effects for tool, _, _ in found)
    return _Expected(tools=found, writes=writes, diamond=diamond)


@st.composite
def _include_graphs(draw: st.DrawFn) -> dict[str, Skill]:
    count = draw(st.integers(min_value=1, max_value=7))
    names = [f"g/s{i}" for i in range(count)]
    acyclic = draw(st.booleans())  # includes only point "forward": no cycle possible
    with_missing = draw(st.booleans())
    clashes_possible = draw(st.booleans())
    skills: dict[str, Skill] = {}
    for index, name in enumerate(names):
        pool = (names[index + 1 :] if acyclic else names) + (_MISSING if with_missing else [])
        includes = draw(st.lists(st.sampled_from(pool), max_size=3)) if pool else []
        kinds = draw(st.lists(st.sampled_from(["read", "writes", "side_effects"]), max_size=2))
        tools = [
            _tool(f"t/{name[2:]}-{n}", **({} if kind == "read" else {kind: True}))
            for n, kind in enumerate(kinds)
        ]
        variant = draw(st.sampled_from([None, 0, 1] if clashes_possible else [None, 0]))
        if variant is not None:
            tools.append(_tool(_SHARED, description=f"variant {variant}"))
        skills[name] = Skill(name=name, includes=includes, tools=tools)
    return skills


def _outcome(expected: _Expected) -> str:
    if expected.cycle is not None:
        return "cycle"
    if expected.missing is not None:
        return "missing include"
    if expected.clash is not None:
        return "tool clash"
    if expected.error is not None:
        return str(expected.error)
    return "resolved through a diamond" if expected.diamond else "resolved"


def _check_failure(exc: SkillResolutionError, expected: _Expected) -> None:
    assert exc.error_type is expected.error
    if expected.cycle is not None:
        assert exc.details["cycle"] == expected.cycle
        assert " -> ".join(expected.cycle) in str(exc)
    if expected.missing is not None:
        assert exc.details["missing_include"] == expected.missing
    if expected.clash is not None:
        assert exc.details["tool"] == expected.clash


@settings(max_examples=300, deadline=None)
@given(_include_graphs())
def test_resolution_agrees_with_a_reference_walk_on_random_graphs(
    skills: dict[str, Skill],
) -> None:
    catalogue = Catalogue.from_skills(skills.values())
    resolved_names: list[str] = []
    for name in [*skills, "g/unknown"]:
        expected = _reference_walk(name, skills)
        event(_outcome(expected))
        if expected.error is None:
            definition = resolve_skill(name, skills)
            got = [(e.tool.name, e.source_skill, tuple(e.via)) for e in definition.resolved_tools]
            assert got == expected.tools
            assert definition.metadata.writes is expected.writes
            assert definition.metadata.read_only is not expected.writes
            assert catalogue.resolve(name) == definition
            resolved_names.append(name)
            continue
        with pytest.raises(SkillResolutionError) as direct:
            resolve_skill(name, skills)
        _check_failure(direct.value, expected)
        with pytest.raises(SkillResolutionError) as via_catalogue:
            catalogue.resolve(name)
        _check_failure(via_catalogue.value, expected)
        if name in skills:
            problems = [p for p in catalogue.errors if p.where == name]
            assert [p.error_type for p in problems] == [expected.error]
    assert catalogue.names == sorted(resolved_names)
    assert [m.name for m in catalogue.list()] == sorted(resolved_names)
