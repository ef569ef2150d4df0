"""Write gating through ``invoke``: a write-capable tool runs only when every gate allows it.

The gates (SPEC section 6): the skill's metadata is read-only; the request does not
set ``allow_writes``; the runtime runs read-only. A refused tool is never started,
which the tests see through ``record_start``, a fixture tool that records each call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cleveragents.runtime import check_write_gates, invoke
from cleveragents.runtime.gating import (
    GATE_REQUEST,
    GATE_SKILL_READ_ONLY,
    GATE_WORKER_READ_ONLY,
)
from cleveragents.skills import (
    Catalogue,
    ResolvedToolEntry,
    Skill,
    SkillDefinition,
    SkillErrorType,
    SkillMetadata,
    SkillResult,
    ToolSpec,
)
from tests.fixtures import tools as fixture_tools
from tests.fixtures.catalogues import py_tool

KINDS = {
    "writes": {"writes": True},
    "side_effects": {"side_effects": True},
    "writes_and_side_effects": {"writes": True, "side_effects": True},
    "neither": {},
}


def counting_tool(name: str, kind: str) -> ToolSpec:
    """A tool of the given kind that records in ``STARTED`` whenever it starts."""
    return py_tool(name, "record_start", **KINDS[kind])


class ForgedCatalogue(Catalogue):
    """Serves one definition that no real catalogue can build: metadata read-only, yet a writer.

    It shows the skill gate holding on its own (defence in depth), since resolution
    never produces such a definition.
    """

    def __init__(self, definition: SkillDefinition) -> None:
        super().__init__()
        self._forged = definition

    def find_tool(self, skill: str, tool: str) -> tuple[SkillDefinition, ResolvedToolEntry]:
        entry = next(e for e in self._forged.resolved_tools if e.tool.name == tool)
        return self._forged, entry


def forged_read_only(skill: Skill) -> SkillDefinition:
    """A definition of ``skill`` whose metadata claims read-only whatever its tools do."""
    entries = [ResolvedToolEntry(tool=t, source_skill=skill.name, via=[]) for t in skill.tools]
    metadata = SkillMetadata.from_skill(skill, resolved=entries).model_copy(
        update={"read_only": True, "writes": False}
    )
    return SkillDefinition.model_construct(
        skill=skill,
        resolved_tools=entries,
        metadata=metadata,
        input_schema=None,
        output_schema=None,
    )


def invoke_counting(
    cat: Catalogue, skill: str, tool: str, *, allow_writes: bool, read_only: bool
) -> tuple[SkillResult, bool]:
    """Invoke; return the result and whether the tool started."""
    before = len(fixture_tools.STARTED)
    req = {"skill": skill, "tool": tool, "arguments": {"probe": tool}, "allow_writes": allow_writes}
    result = invoke(req, cat, read_only=read_only)
    started = len(fixture_tools.STARTED) > before
    if started:
        assert fixture_tools.STARTED[-1] == {"probe": tool}
    return result, started


MATRIX = list(itertools.product([False, True], [False, True], [False, True], sorted(KINDS)))


@pytest.mark.parametrize(
    ("skill_read_only", "allow_writes", "runtime_read_only", "kind"),
    MATRIX,
    ids=[f"skill_ro={a}-allow_writes={b}-runtime_ro={c}-{d}" for a, b, c, d in MATRIX],
)
def test_a_write_capable_tool_runs_only_when_every_gate_allows_it(
    skill_read_only: bool, allow_writes: bool, runtime_read_only: bool, kind: str
) -> None:
    tool = counting_tool("gate/tool", kind)
    skill = Skill(name="gate/skill", tools=[tool])
    cat: Catalogue = (
        ForgedCatalogue(forged_read_only(skill))
        if skill_read_only
        else Catalogue.from_skills([skill])
    )

    result, started = invoke_counting(
        cat, "gate/skill", "gate/tool", allow_writes=allow_writes, read_only=runtime_read_only
    )

    refusing = [
        gate
        for gate, refuses in (
            (GATE_SKILL_READ_ONLY, skill_read_only),
            (GATE_REQUEST, not allow_writes),
            (GATE_WORKER_READ_ONLY, runtime_read_only),
        )
        if refuses
    ]
    if kind == "neither" or not refusing:
        assert result.success, result
        assert started
        assert result.output_data == {"ok": True}
    else:
        assert not started, "a refused tool was started"
        assert not result.success
        assert result.error is not None
        assert result.error.error_type == SkillErrorType.PERMISSION_DENIED
        assert result.error.details["gate"] == refusing[0]
        assert result.error.details["gates"] == refusing
        assert result.error.tool_name == "gate/tool"
        assert result.resource_changes == []


def test_a_refusal_message_names_the_tool_and_what_it_does() -> None:
    cat = Catalogue.from_skills(
        [Skill(name="gate/skill", tools=[counting_tool("gate/side", "side_effects")])]
    )

    result, _ = invoke_counting(cat, "gate/skill", "gate/side", allow_writes=False, read_only=True)

    assert result.error is not None
    assert "gate/side" in result.error.message
    assert "side effects" in result.error.message
    assert GATE_REQUEST in result.error.message
    assert GATE_WORKER_READ_ONLY in result.error.message


def test_allow_writes_defaults_to_false() -> None:
    cat = Catalogue.from_skills(
        [Skill(name="gate/skill", tools=[counting_tool("gate/w", "writes")])]
    )
    before = len(fixture_tools.STARTED)

    result = invoke({"skill": "gate/skill", "tool": "gate/w"}, cat)

    assert result.error is not None
    assert result.error.details["gate"] == GATE_REQUEST
    assert len(fixture_tools.STARTED) == before


def test_gates_apply_before_argument_validation() -> None:
    schema = {"type": "object", "properties": {"probe": {"type": "integer"}}}
    tool = py_tool("gate/w", "record_start", writes=True, input_schema=schema)
    cat = Catalogue.from_skills([Skill(name="gate/skill", tools=[tool])])

    refused, _ = invoke_counting(cat, "gate/skill", "gate/w", allow_writes=False, read_only=False)
    allowed, _ = invoke_counting(cat, "gate/skill", "gate/w", allow_writes=True, read_only=False)

    assert refused.error is not None
    assert refused.error.error_type == SkillErrorType.PERMISSION_DENIED
    assert allowed.error is not None
    assert allowed.error.error_type == SkillErrorType.VALIDATION_ERROR


def test_a_writer_reached_through_includes_is_gated_like_an_own_tool() -> None:
    cat = Catalogue.from_skills(
        [
            Skill(name="gate/base", tools=[counting_tool("gate/w", "writes")]),
            Skill(name="gate/mid", includes=["gate/base"]),
            Skill(
                name="gate/top", includes=["gate/mid"], tools=[counting_tool("gate/r", "neither")]
            ),
        ]
    )

    refused, started = invoke_counting(
        cat, "gate/top", "gate/w", allow_writes=False, read_only=False
    )
    allowed, _ = invoke_counting(cat, "gate/top", "gate/w", allow_writes=True, read_only=False)

    assert not started
    assert refused.error is not None
    assert refused.error.error_type == SkillErrorType.PERMISSION_DENIED
    assert allowed.success, allowed


# --- a read-only skill reaching a writer: impossible by construction ------------------------


def test_a_skill_is_read_only_exactly_when_none_of_its_resolved_tools_can_write() -> None:
    cat = Catalogue.from_skills(
        [
            Skill(name="ro/base", tools=[counting_tool("ro/side", "side_effects")]),
            Skill(name="ro/reader", tools=[counting_tool("ro/r", "neither")]),
            Skill(name="ro/both", includes=["ro/reader", "ro/base"]),
        ]
    )

    assert cat.resolve("ro/reader").metadata.read_only is True
    assert cat.resolve("ro/base").metadata.read_only is False
    assert cat.resolve("ro/both").metadata.read_only is False


def test_a_skill_asserting_read_only_cannot_reach_a_writer() -> None:
    cat = Catalogue.from_skills(
        [
            Skill(name="ro/base", tools=[counting_tool("ro/w", "writes")]),
            Skill(name="ro/liar", read_only=True, includes=["ro/base"]),
        ]
    )

    result, started = invoke_counting(cat, "ro/liar", "ro/w", allow_writes=True, read_only=False)

    assert not started
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert "ro/w" in result.error.message
    assert any(p.where == "ro/liar" for p in cat.errors)


def test_a_definition_with_read_only_metadata_and_a_writer_cannot_be_built() -> None:
    skill = Skill(name="ro/skill", tools=[counting_tool("ro/w", "writes")])
    forged = forged_read_only(skill)

    with pytest.raises(ValueError, match="read-only"):
        SkillDefinition.model_validate(forged.model_dump())


def test_a_skill_asserting_read_only_runs_its_read_tools_under_every_gate() -> None:
    cat = Catalogue.from_skills(
        [Skill(name="ro/skill", read_only=True, tools=[counting_tool("ro/r", "neither")])]
    )

    for allow_writes, read_only in itertools.product([False, True], repeat=2):
        result, started = invoke_counting(
            cat, "ro/skill", "ro/r", allow_writes=allow_writes, read_only=read_only
        )
        assert result.success, result
        assert started


def test_the_gate_function_reports_every_gate_that_refused() -> None:
    skill = Skill(name="gate/skill", tools=[counting_tool("gate/w", "writes")])
    forged = forged_read_only(skill)

    with pytest.raises(PermissionError) as caught:
        check_write_gates(forged, skill.tools[0], allow_writes=False, read_only=True)

    assert caught.value.details == {  # type: ignore[attr-defined]
        "gate": GATE_SKILL_READ_ONLY,
        "gates": [GATE_SKILL_READ_ONLY, GATE_REQUEST, GATE_WORKER_READ_ONLY],
    }


# --- property: random catalogues, requests and runtimes -------------------------------------


@dataclass(frozen=True)
class ToolPlan:
    name: str
    writes: bool
    side_effects: bool

    @property
    def write_capable(self) -> bool:
        return self.writes or self.side_effects


@dataclass(frozen=True)
class SkillPlan:
    name: str
    tools: tuple[ToolPlan, ...]
    includes: tuple[str, ...]
    read_only: bool | None


SKILL_NAMES = [f"prop/s{i}" for i in range(4)]


@st.composite
def catalogues(draw: st.DrawFn) -> list[SkillPlan]:
    count = draw(st.integers(min_value=1, max_value=len(SKILL_NAMES)))
    names = SKILL_NAMES[:count]
    plans = []
    for index, name in enumerate(names):
        flags = draw(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=3))
        tools = tuple(
            ToolPlan(f"prop/t{index}-{n}", writes, side) for n, (writes, side) in enumerate(flags)
        )
        # Mostly includes of earlier skills (no cycle); now and then any skill (maybe a cycle).
        earlier = names[:index]
        includes = (
            draw(st.lists(st.sampled_from(earlier), unique=True, max_size=2)) if earlier else []
        )
        if draw(st.integers(0, 5)) == 0:
            includes.append(draw(st.sampled_from(names)))
        read_only = draw(st.sampled_from([None, True, False]))
        own = tuple(dict.fromkeys(i for i in includes if i != name))
        plans.append(SkillPlan(name, tools, own, read_only))
    return plans


def build(plans: list[SkillPlan]) -> Catalogue:
    return Catalogue.from_skills(
        Skill(
            name=plan.name,
            includes=list(plan.includes),
            read_only=plan.read_only,
            tools=[
                py_tool(t.name, "record_start", writes=t.writes, side_effects=t.side_effects)
                for t in plan.tools
            ],
        )
        for plan in plans
    )


def expected(
    plans: list[SkillPlan], skill: str, tool: str, *, allow_writes: bool, read_only: bool
) -> tuple[SkillErrorType | None, bool]:
    """An independent oracle: the error type expected (None: success) and whether to start."""
    by_name = {p.name: p for p in plans}
    if skill not in by_name:
        return SkillErrorType.SKILL_NOT_FOUND, False
    reached: list[str] = []
    cycle = False

    def walk(name: str, path: tuple[str, ...]) -> None:
        nonlocal cycle
        if name in path:
            cycle = True
            return
        if name in reached:
            return
        reached.append(name)
        for include in by_name[name].includes:
            walk(include, (*path, name))

    walk(skill, ())
    if cycle:
        return SkillErrorType.CYCLE_DETECTED, False
    tools = {t.name: t for name in reached for t in by_name[name].tools}
    writers = [t for t in tools.values() if t.write_capable]
    if by_name[skill].read_only is True and writers:
        return SkillErrorType.VALIDATION_ERROR, False
    if tool not in tools:
        return SkillErrorType.RESOLUTION_FAILURE, False
    skill_read_only = not writers
    target = tools[tool]
    if target.write_capable and (skill_read_only or not allow_writes or read_only):
        return SkillErrorType.PERMISSION_DENIED, False
    return None, True


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    plans=catalogues(),
    data=st.data(),
    allow_writes=st.booleans(),
    runtime_read_only=st.booleans(),
)
def test_no_combination_lets_a_refused_write_capable_tool_start(
    plans: list[SkillPlan], data: Any, allow_writes: bool, runtime_read_only: bool
) -> None:
    cat = build(plans)
    by_name = {p.name: p for p in plans}
    # Mostly a skill of the catalogue and a tool near it; sometimes neither.
    skill = data.draw(st.sampled_from([p.name for p in plans] * 3 + ["prop/missing"]))
    near = [
        t.name
        for name in (skill, *(by_name[skill].includes if skill in by_name else ()))
        if name in by_name
        for t in by_name[name].tools
    ]
    anywhere = [t.name for p in plans for t in p.tools] + ["prop/not-a-tool"]
    tool = data.draw(st.sampled_from(near * 3 + anywhere), label="tool")

    result, started = invoke_counting(
        cat, skill, tool, allow_writes=allow_writes, read_only=runtime_read_only
    )

    error_type, should_start = expected(
        plans, skill, tool, allow_writes=allow_writes, read_only=runtime_read_only
    )
    event(f"outcome: {error_type or 'success'}")
    assert started == should_start
    assert result.success == (error_type is None), result
    if error_type is not None:
        assert result.error is not None
        assert result.error.error_type == error_type, result.error
    if started:
        definition = cat.resolve(skill)
        spec = next(e.tool for e in definition.resolved_tools if e.tool.name == tool)
        if spec.write_capable:
            assert allow_writes
            assert not runtime_read_only
            assert not definition.metadata.read_only


def test_an_allowed_write_runs_once_and_a_refused_one_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_file = tmp_path / "count"
    monkeypatch.setenv(fixture_tools.COUNT_FILE_ENV, str(count_file))
    tool = py_tool("gate/count", "count_write", writes=True)
    cat = Catalogue.from_skills([Skill(name="gate/skill", tools=[tool])])
    req = {"skill": "gate/skill", "tool": "gate/count"}

    refused = [
        invoke(req, cat),
        invoke({**req, "allow_writes": True}, cat, read_only=True),
    ]
    assert not count_file.exists()
    allowed = invoke({**req, "allow_writes": True}, cat)

    assert [r.error.error_type for r in refused if r.error] == [
        SkillErrorType.PERMISSION_DENIED,
        SkillErrorType.PERMISSION_DENIED,
    ]
    assert allowed.success, allowed
    assert count_file.read_text().splitlines() == ["ran"]
    assert allowed.resource_changes == [{"action": "changed", "resource": str(count_file)}]
