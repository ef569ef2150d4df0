"""The public surface: every public package's ``__all__``, and the names SPEC pins (httpx-style)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from enum import StrEnum

import pytest
from pydantic import BaseModel

import cleveragents
import cleveragents.skills
import cleveragents.skills.protocol

#: SPEC section 3: exactly the seed's protocol types and ``map_tool_error``.
PROTOCOL_NAMES = {
    "SkillErrorType",
    "SkillError",
    "SkillMetadata",
    "SkillDefinition",
    "SkillResult",
    "map_tool_error",
}
#: SPEC section 4: the protocol types plus the skill model and the catalogue.
SKILLS_NAMES = PROTOCOL_NAMES | {
    "ToolSpec",
    "Skill",
    "ResolvedToolEntry",
    "SkillCapabilitySummary",
    "Catalogue",
}
#: Public extras the package already offers beyond what the SPEC pins.
SKILLS_EXTRAS = {"CatalogueProblem", "resolve_skill"}


@pytest.mark.parametrize("module_name", ["cleveragents.skills", "cleveragents.skills.protocol"])
def test_every_exported_name_is_importable(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert len(module.__all__) == len(set(module.__all__)), "duplicates in __all__"
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"{module_name}.{name} is missing"
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import *", namespace)
    assert set(module.__all__) <= set(namespace)


def test_the_protocol_module_exports_exactly_the_seed_types() -> None:
    assert set(cleveragents.skills.protocol.__all__) == PROTOCOL_NAMES


def test_the_skills_package_exports_the_spec_names_and_its_extras() -> None:
    assert set(cleveragents.skills.__all__) == SKILLS_NAMES | SKILLS_EXTRAS


def test_the_package_reexports_the_same_protocol_objects() -> None:
    for name in PROTOCOL_NAMES:
        assert getattr(cleveragents.skills, name) is getattr(cleveragents.skills.protocol, name)


def test_the_model_types_are_frozen_pydantic_models() -> None:
    for name in SKILLS_NAMES - {"SkillErrorType", "map_tool_error", "Catalogue"}:
        model = getattr(cleveragents.skills, name)
        assert issubclass(model, BaseModel), name
        assert model.model_config.get("frozen") is True, name


def test_skill_error_type_is_a_str_enum_and_map_tool_error_is_callable() -> None:
    assert issubclass(cleveragents.skills.SkillErrorType, StrEnum)
    assert callable(cleveragents.skills.map_tool_error)


#: What users import from the top-level package.
TOP_LEVEL_NAMES = {
    "__version__",
    "SkillClient",
    "InvocationHandle",
    "AsyncSkillClient",
    "AsyncInvocationHandle",
    "SkillInvocationRequest",
    "ToolOutput",
    "invoke",
    "Catalogue",
    "SkillDefinition",
    "SkillError",
    "SkillErrorType",
    "SkillMetadata",
    "SkillResult",
    "ToolSpec",
    "CleverAgentsError",
    "ConfigurationError",
    "IncludeCycleError",
    "ReadOnlyViolation",
    "ResolutionFailure",
    "SchemaValidationError",
    "SkillNotFoundError",
    "SkillResolutionError",
    "ToolActivationError",
    "ToolExecutionError",
    "WriteRefused",
}


def _public_packages() -> list[str]:
    names = ["cleveragents"]
    for info in pkgutil.walk_packages(cleveragents.__path__, "cleveragents."):
        if info.ispkg and not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def test_the_top_level_package_exports_what_users_import() -> None:
    assert set(cleveragents.__all__) == TOP_LEVEL_NAMES
    assert cleveragents.SkillResult is cleveragents.skills.SkillResult
    assert cleveragents.invoke is importlib.import_module("cleveragents.runtime").invoke


def test_importing_the_top_level_package_loads_no_celery() -> None:
    code = "import sys, cleveragents; print('celery' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("package", _public_packages())
def test_every_public_package_declares_what_it_exports(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package} has no __all__"
    assert len(exported) == len(set(exported)), f"duplicates in {package}.__all__"
    for name in exported:
        assert getattr(module, name, None) is not None, f"{package}.{name} is missing"
    # Every public class or function defined in (or re-exported by) the package is declared.
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) and getattr(
            value, "__module__", ""
        ).startswith("cleveragents"):
            assert name in exported, f"{package}.{name} is public but not in __all__"
