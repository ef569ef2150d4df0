"""Read docker-compose.yml, .env.example and the Dockerfile the way Compose and Docker do."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.procs import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BIN = Path(sys.executable).parent

#: Stands in for what a user writes into .env where .env.example leaves a value empty.
PLACEHOLDER = "placeholder0123"
#: Variables that must be set by the user: compose refuses to start without them.
SECRETS = ("REDIS_PASSWORD", "FLOWER_PASSWORD")
#: The services of a plain `docker compose up`.
DEFAULT_SERVICES = {"redis", "worker", "flower", "metrics"}
#: The settings of .env.example that configure a worker (CLEVERAGENTS_IMAGE is Compose's).
WORKER_SETTINGS = (
    "CLEVERAGENTS_DEFAULT_TIMEOUT_S",
    "CLEVERAGENTS_VISIBILITY_TIMEOUT_S",
    "CLEVERAGENTS_RESULT_EXPIRES_S",
    "CLEVERAGENTS_LOG_FORMAT",
)
#: Every variable each app service's container gets: what it needs, nothing more.
SERVICE_ENVIRONMENT = {
    "worker": {"CLEVERAGENTS_BROKER_URL", "CLEVERAGENTS_READ_ONLY", *WORKER_SETTINGS},
    "worker-readonly": {"CLEVERAGENTS_BROKER_URL", "CLEVERAGENTS_READ_ONLY", *WORKER_SETTINGS},
    "flower": {"CLEVERAGENTS_BROKER_URL", "FLOWER_BASIC_AUTH"},
    "metrics": {"CLEVERAGENTS_BROKER_URL"},
    "producer": {"CLEVERAGENTS_BROKER_URL"},
}


# ---- reading the files the way Compose does ----------------------------------------------

# Compose's interpolation: $$ is a literal $; ${VAR}, ${VAR:-default}, ${VAR-default},
# ${VAR:?error}, ${VAR?error}, ${VAR:+alt}, ${VAR+alt} and $VAR; any other $ is an error.
_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<invalid>))"
)


class MissingVariableError(ValueError):
    """Raised where Compose would refuse to start: a ${VAR:?message} without a value."""


def _substitute(text: str, env: Mapping[str, str], seen: set[str] | None = None) -> str:
    def one(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["invalid"] is not None:
            raise ValueError(f"invalid interpolation in {text!r}")
        name = match["braced"] or match["named"]
        if seen is not None:
            seen.add(name)
        value, op, arg = env.get(name), match["op"], match["arg"]
        if op is None:
            return value or ""
        missing = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if missing else str(value)
        if op.endswith("?"):
            if missing:
                raise MissingVariableError(f"{name}: {arg}")
            return str(value)
        return "" if missing else arg  # the + forms

    return _INTERPOLATION.sub(one, text)


def _interpolate(node: Any, env: Mapping[str, str], seen: set[str] | None = None) -> Any:
    """``node`` with every string value (not key) interpolated, as Compose does."""
    if isinstance(node, str):
        return _substitute(node, env, seen)
    if isinstance(node, list):
        return [_interpolate(item, env, seen) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate(value, env, seen) for key, value in node.items()}
    return node


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _raw_compose() -> dict[str, Any]:
    # PyYAML's safe loader resolves the << merge keys the file uses, as Compose does.
    loaded = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _user_env() -> dict[str, str]:
    """.env as a user writes it: .env.example with the empty secrets filled in."""
    return {key: value or PLACEHOLDER for key, value in _read_env_file(ENV_EXAMPLE).items()}


def _compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """docker-compose.yml as Compose sees it with .env copied from .env.example (or ``env``)."""
    tree = _interpolate(_raw_compose(), _user_env() if env is None else env)
    assert isinstance(tree, dict)
    return tree


def _services() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    assert isinstance(services, dict)
    return services


def _app_services() -> dict[str, dict[str, Any]]:
    """The services that run this project's image (built from the Dockerfile)."""
    return {name: spec for name, spec in _services().items() if "build" in spec}


def _container_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """A container's environment: its `environment` (no service has an env_file)."""
    assert "env_file" not in spec, "a service gets the variables it needs, not all of .env"
    environment = spec.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    return {key: "" if value is None else str(value) for key, value in environment.items()}


def _argv(command: str | list[Any]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def _shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script (split at |, &&, || and ;)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("|", "||", "&&", ";", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


@dataclass(frozen=True)
class ServiceCommand:
    """One command that a service of this project's image runs."""

    service: str
    role: str  # "command" or "healthcheck"
    argv: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.service}-{self.role}-{Path(self.argv[0]).name}"


def _service_commands() -> list[ServiceCommand]:
    found: list[ServiceCommand] = []
    for name, spec in _app_services().items():
        if "command" in spec:
            found.append(ServiceCommand(name, "command", tuple(_argv(spec["command"]))))
        test = spec.get("healthcheck", {}).get("test")
        if test is None:
            continue
        if isinstance(test, str):
            test = ["CMD-SHELL", test]
        kind, *rest = test
        if kind == "CMD":
            found.append(ServiceCommand(name, "healthcheck", tuple(rest)))
        elif kind == "CMD-SHELL":
            for argv in _shell_commands(" ".join(rest)):
                found.append(ServiceCommand(name, "healthcheck", tuple(argv)))
    return found


def _option_names(args: list[str] | tuple[str, ...]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("-") and arg != "-"]


def _run(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=REPO, env=dict(env), capture_output=True, text=True, timeout=120, check=False
    )


def _subprocess_env(service: str, tmp_path: Path) -> dict[str, str]:
    """The service's container environment, on this machine (nothing is contacted)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    return {
        **keep,
        **_container_env(_services()[service]),
        "CLEVERAGENTS_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    }
