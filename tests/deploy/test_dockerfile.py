"""The Dockerfile: a multi-stage build whose image runs as a non-root user."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from tests.support.composefile import (
    DOCKERFILE,
    DOCKERIGNORE,
)
from tests.support.procs import REPO

# ---- the Dockerfile --------------------------------------------------------------------------


def _dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments)."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comments and blank lines, also inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in instructions:
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, args))
    return stages


def _final_stage() -> list[tuple[str, str]]:
    return _dockerfile_stages()[-1]


def test_dockerfile_builds_wheels_in_a_builder_stage() -> None:
    stages = _dockerfile_stages()
    assert len(stages) >= 2, "a multi-stage build"
    builder = stages[0]
    assert builder[0] == ("FROM", "python:3.11-slim AS builder")
    assert any(k == "RUN" and "pip wheel . " in f"{a} " for k, a in builder)
    assert _final_stage()[0] == ("FROM", "python:3.11-slim")


#: The Debian packages the final stage may install: programs the worker runs, not build tools.
RUNTIME_PACKAGES = {"bubblewrap"}


def test_final_stage_installs_only_the_wheels() -> None:
    final = _final_stage()
    text = "\n".join(f"{k} {a}" for k, a in final)
    installs = [a for k, a in final if k == "RUN" and "pip install" in a]
    assert installs, "the final stage installs the wheels"
    for install in installs:
        assert "--no-index" in install, install
        assert "from=builder" in install, install
    assert "--no-cache-dir" in text or "PIP_NO_CACHE_DIR=1" in text
    # No sources copied in, no compilers, no build tools.
    assert not [a for k, a in final if k in ("COPY", "ADD") and "--from=" not in a]
    for tool in ("gcc", "g++", "clang", "build-essential", "python3-dev"):
        assert tool not in text, f"{tool} in the final stage"
    # Debian packages: only the programs the worker runs (bubblewrap makes the sandboxes of
    # sandboxed tools), without recommends, and no package lists left in the image.
    for run in (a for k, a in final if k == "RUN" and "apt-get install" in a):
        assert "--no-install-recommends" in run, run
        assert "rm -rf /var/lib/apt/lists/*" in run, run
        words = run.split("apt-get install", 1)[1].split("&&")[0].split()
        assert {w for w in words if not w.startswith("-")} <= RUNTIME_PACKAGES, run


def test_final_stage_runs_as_a_non_root_user_in_app() -> None:
    final = _final_stage()
    users = [a for k, a in final if k == "USER"]
    assert users, "the final stage sets a USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    assert user == "10001" or "--uid 10001" in " ".join(a for k, a in final if k == "RUN")
    assert [a for k, a in final if k == "WORKDIR"][-1] == "/app"


def test_final_stage_runs_a_worker_by_default_and_leaves_healthchecks_to_compose() -> None:
    final = _final_stage()
    cmd = [a for k, a in final if k == "CMD"][-1]
    assert json.loads(cmd) == [
        "celery", "-A", "cleveragents.worker", "worker", "--loglevel", "INFO"
    ]
    assert all(k != "HEALTHCHECK" for stage in _dockerfile_stages() for k, _ in stage)


def _dockerignore_matcher() -> Callable[[str], bool]:
    """Docker's .dockerignore rules for a path relative to the build context."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        rules.append((keep, re.compile(regex)))

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for keep, regex in rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                result = not keep
        return result

    return ignored


def test_dockerignore_keeps_secrets_and_local_state_out_and_the_sources_in() -> None:
    ignored = _dockerignore_matcher()
    for path in (".env", ".venv/bin/python", ".git/HEAD", ".cleveragents/results/x"):
        assert ignored(path), f"{path} would be sent to the Docker build"
    needed = ["pyproject.toml", "README.md", "celeryconfig.py"]
    for package in ("cleveragents", "worker", "tasks", "examples"):
        needed += [
            p.relative_to(REPO).as_posix()
            for p in (REPO / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    assert "examples/skills/text-tools.yaml" in needed
    assert [path for path in needed if ignored(path)] == []


def test_dockerignore_sends_skills_for_an_image_of_your_own() -> None:
    # docs/deployment.md, "Your own skills": `COPY skills/ /app/skills/` in a two-line
    # image built from this folder; this project's own image installs wheels only.
    ignored = _dockerignore_matcher()
    for path in ("skills/mathy/mathy.yaml", "skills/mathy/mathy_tools.py", "skills/a/run.sh"):
        assert not ignored(path), f"{path} would be left out of an image of your own"
    assert ignored("skills/mathy/__pycache__/mathy_tools.cpython-311.pyc")
