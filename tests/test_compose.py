"""The docker compose deployment, checked without a Docker engine (none runs here).

docker-compose.yml is validated against the Compose Specification schema and read
the way Compose reads it: ``${VARIABLES}`` filled in from .env.example, which must
define every one of them. Its structure is checked for what the deployment promises
(persistent, password-protected Redis; scalable, health-checked workers; Flower
behind basic auth) and for least privilege (no env_file: each service gets only the
variables it needs, and no password is on a command line of this project's image),
and every command a service runs, health checks included, must exist in this project
and accept the options it is given. The services' own commands then run against a
real Redis: a worker, its health check, the producer and Flower.
The Dockerfile is checked for a multi-stage build that runs as a non-root user.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cleveragents.cli.app import cli
from cleveragents.constants import QUEUE_BATCH, QUEUE_READ
from cleveragents.runtime import invoke
from cleveragents.settings import Settings, bundled_examples_path
from cleveragents.skills import Catalogue
from tests.procs import REPO, RedisServer, free_port, kill_group, wait_until

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


# ---- the Compose Specification -------------------------------------------------------------


def test_compose_file_matches_the_compose_specification_schema() -> None:
    # check-jsonschema ships the Compose Specification schema: this needs no network.
    checker = BIN / "check-jsonschema"
    assert checker.exists(), "check-jsonschema is missing: install the dev extra"
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_file_has_no_obsolete_version_key() -> None:
    assert "version" not in _raw_compose()


def test_compose_file_interpolates_without_errors() -> None:
    # Every $ is a valid interpolation or an escaped $$ (a ValueError otherwise).
    assert _compose()["services"]


def test_default_services_and_profiles() -> None:
    services = _services()
    assert set(services) >= DEFAULT_SERVICES
    unprofiled = {name for name, spec in services.items() if not spec.get("profiles")}
    assert unprofiled == DEFAULT_SERVICES
    assert services["worker-readonly"]["profiles"] == ["readonly"]
    assert services["producer"]["profiles"] == ["producer"]


# ---- .env.example --------------------------------------------------------------------------


def test_env_example_is_plain_key_value_lines() -> None:
    # Compose reads .env to fill in the ${VARIABLES}: keep to what every dotenv parser agrees on.
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, line
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), line
        assert not value.startswith(("'", '"')), f"no quotes, please: {line}"
        assert " #" not in value, f"comments go on lines of their own: {line}"


def test_every_variable_of_the_compose_file_is_in_env_example() -> None:
    used: set[str] = set()
    _interpolate(_raw_compose(), _user_env(), used)
    assert used, "the compose file uses no variables?"
    assert used <= set(_read_env_file(ENV_EXAMPLE)), sorted(used - set(_read_env_file(ENV_EXAMPLE)))


def test_env_example_documents_the_settings_of_the_deployment() -> None:
    defined = set(_read_env_file(ENV_EXAMPLE))
    assert {
        "REDIS_PASSWORD",
        "FLOWER_USER",
        "FLOWER_PASSWORD",
        "WORKER_CONCURRENCY",
        "CLEVERAGENTS_DEFAULT_TIMEOUT_S",
        "CLEVERAGENTS_VISIBILITY_TIMEOUT_S",
        "CLEVERAGENTS_RESULT_EXPIRES_S",
        "CLEVERAGENTS_LOG_FORMAT",
    } <= defined


def test_compose_refuses_to_start_until_the_passwords_are_set() -> None:
    example = _read_env_file(ENV_EXAMPLE)
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    for name in SECRETS:
        # Not prefilled in the example, and required (${VAR:?...}) wherever it is used.
        assert example[name] == "", f"{name} must be empty in .env.example"
        uses = re.findall(rf"\$\{{{name}(\W*)", text)
        assert uses, f"{name} is not used"
        assert all(op.startswith(":?") for op in uses), f"{name} must be ${{{name}:?...}}"
        with pytest.raises(MissingVariableError, match=name):
            _interpolate(_raw_compose(), {**_user_env(), name: ""})


def test_env_example_values_are_valid_settings_for_every_service() -> None:
    for name, spec in _app_services().items():
        settings = Settings.from_env(_container_env(spec))
        assert settings.broker_url == f"redis://:{PLACEHOLDER}@redis:6379/0", name
        assert not settings.embedded
        # An unacknowledged invocation must not be handed to a second worker while the
        # first one still runs it (docs/configuration.md).
        assert settings.visibility_timeout_s > settings.default_timeout_s, name


def test_workers_get_the_settings_of_env_example_and_the_same_defaults_without_them() -> None:
    # Without env_file, a setting of .env reaches a worker only through its `environment`:
    # each one must be passed on, and its ${VAR:-default} must be .env.example's value, so
    # that an .env without the line behaves the same.
    example = _user_env()
    assert set(WORKER_SETTINGS) == {
        key for key in example if key.startswith("CLEVERAGENTS_") and key != "CLEVERAGENTS_IMAGE"
    }, "a CLEVERAGENTS_* setting of .env.example that no worker gets"
    without = {key: value for key, value in example.items() if key not in WORKER_SETTINGS}
    for name in ("worker", "worker-readonly"):
        given = _container_env(_services()[name])
        defaults = _container_env(_compose(without)["services"][name])
        for key in WORKER_SETTINGS:
            assert given[key] == example[key], f"{name}: {key}"
            assert defaults[key] == example[key], f"{name}: the default of {key}"
        settings = Settings.from_env(given)
        assert settings.default_timeout_s == float(example["CLEVERAGENTS_DEFAULT_TIMEOUT_S"])
        assert settings.visibility_timeout_s == float(example["CLEVERAGENTS_VISIBILITY_TIMEOUT_S"])
        assert settings.result_expires_s == float(example["CLEVERAGENTS_RESULT_EXPIRES_S"])
        assert settings.log_format == example["CLEVERAGENTS_LOG_FORMAT"]


# ---- least privilege: who gets which secret --------------------------------------------------


def _holding(node: Any, needle: str, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths below ``node`` whose string value contains ``needle``."""
    if isinstance(node, str):
        return [path] if needle in node else []
    if isinstance(node, list):
        return [
            hit for i, item in enumerate(node) for hit in _holding(item, needle, (*path, str(i)))
        ]
    if isinstance(node, dict):
        return [hit for k, v in node.items() for hit in _holding(v, needle, (*path, str(k)))]
    return []


def test_no_service_reads_all_of_env() -> None:
    for name, spec in _raw_compose()["services"].items():
        assert "env_file" not in spec, f"{name}: env_file hands every secret of .env over"


def test_each_app_service_gets_only_the_variables_it_needs() -> None:
    apps = _app_services()
    assert set(apps) == set(SERVICE_ENVIRONMENT)
    for name, spec in apps.items():
        assert set(_container_env(spec)) == SERVICE_ENVIRONMENT[name], name


def test_each_password_reaches_only_the_services_that_need_it() -> None:
    # Distinct values, so that every place each password lands can be told apart.
    redis_password, flower_password = "redissecret0123", "flowersecret0123"
    tree = _compose(
        {**_user_env(), "REDIS_PASSWORD": redis_password, "FLOWER_PASSWORD": flower_password}
    )
    # Outside the services only the x- fields (ignored by Compose) may hold one.
    rest = {
        key: value for key, value in tree.items() if key != "services" and not key.startswith("x-")
    }
    assert not _holding(rest, redis_password)
    assert not _holding(rest, flower_password)
    services = tree["services"]

    # FLOWER_PASSWORD: Flower's environment only, and not its command line.
    flower_hits = {
        (name, *path) for name, spec in services.items() for path in _holding(spec, flower_password)
    }
    assert flower_hits == {("flower", "environment", "FLOWER_BASIC_AUTH")}

    # REDIS_PASSWORD: Redis' own settings, and the broker URL of the services that use Redis.
    broker_url = f"redis://:{redis_password}@redis:6379/0"
    for name, spec in services.items():
        for path in _holding(spec, redis_password):
            if name == "redis":
                assert path[0] in ("command", "environment"), path
                continue
            assert path == ("environment", "CLEVERAGENTS_BROKER_URL"), (name, path)
            assert spec["environment"]["CLEVERAGENTS_BROKER_URL"] == broker_url, name
    redis = services["redis"]
    assert redis["environment"]["REDISCLI_AUTH"] == redis_password
    assert redis_password in _argv(redis["command"])
    assert {name for name, spec in services.items() if _holding(spec, redis_password)} == {
        "redis",
        *SERVICE_ENVIRONMENT,
    }


def test_no_password_is_on_a_command_line_of_this_projects_image() -> None:
    # A command line shows in the process list and in `docker inspect`; the environment
    # of a process is readable by its own user only.
    for name, spec in _app_services().items():
        for part in ("command", "healthcheck", "entrypoint"):
            assert not _holding(spec.get(part), PLACEHOLDER), f"{name}: a password in its {part}"


# ---- the services --------------------------------------------------------------------------


def _published_hosts(spec: Mapping[str, Any]) -> list[str]:
    hosts = []
    for port in spec.get("ports", []):
        if isinstance(port, dict):
            hosts.append(str(port.get("host_ip", "")))
        else:
            parts = str(port).rsplit(":", 2)
            hosts.append(parts[0] if len(parts) == 3 else "")
    return hosts


def test_published_ports_listen_on_localhost_only() -> None:
    for name, spec in _services().items():
        for host in _published_hosts(spec):
            assert host == "127.0.0.1", f"{name} publishes a port on {host or 'every interface'}"


def test_redis_persists_requires_a_password_and_has_a_healthcheck() -> None:
    redis = _services()["redis"]
    argv = _argv(redis["command"])
    assert argv[0] == "redis-server"
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "everysec"
    assert argv[argv.index("--requirepass") + 1] == PLACEHOLDER
    assert any(str(volume).endswith(":/data") for volume in redis["volumes"])
    assert "redis-cli" in " ".join(redis["healthcheck"]["test"])
    assert not redis.get("ports"), "Redis is for this project's containers only"


def test_project_services_share_one_image_built_from_this_repository() -> None:
    apps = _app_services()
    assert set(apps) == {"worker", "worker-readonly", "flower", "metrics", "producer"}
    assert {json.dumps(spec["build"]) for spec in apps.values()} == {json.dumps(".")}
    assert len({spec["image"] for spec in apps.values()}) == 1


def test_worker_waits_for_redis_scales_and_checks_its_health() -> None:
    for name in ("worker", "worker-readonly"):
        worker = _services()[name]
        assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
        # --scale worker=N needs no fixed name and no host port.
        assert "container_name" not in worker
        assert not worker.get("ports")
        test = " ".join(worker["healthcheck"]["test"])
        # $$HOSTNAME in the file: the container's shell fills in its own hostname.
        assert "inspect ping" in test
        assert "celery@$HOSTNAME" in test


def test_worker_writes_and_the_readonly_worker_only_reads() -> None:
    services = _services()
    assert _container_env(services["worker"])["CLEVERAGENTS_READ_ONLY"] == "0"
    assert _container_env(services["worker-readonly"])["CLEVERAGENTS_READ_ONLY"] == "1"
    argv = _argv(services["worker-readonly"]["command"])
    assert set(argv[argv.index("-Q") + 1].split(",")) == {QUEUE_READ, QUEUE_BATCH}
    worker = _argv(services["worker"]["command"])
    assert worker[worker.index("--concurrency") + 1] == _user_env()["WORKER_CONCURRENCY"]


def test_flower_has_basic_auth_persistent_state_and_a_healthcheck() -> None:
    flower = _services()["flower"]
    argv = _argv(flower["command"])
    options = dict(arg.partition("=")[::2] for arg in argv if arg.startswith("--"))
    # The login is in Flower's environment (FLOWER_BASIC_AUTH), not on its command line.
    assert "--basic-auth" not in options
    assert "--basic_auth" not in options
    login = _container_env(flower)["FLOWER_BASIC_AUTH"]
    assert login == f"{_user_env()['FLOWER_USER']}:{PLACEHOLDER}"
    assert "," not in login, "Flower splits FLOWER_BASIC_AUTH on commas"
    assert options["--persistent"] == "True"
    assert int(options["--state_save_interval"]) > 0
    # The state file lies on a volume, so it outlives the container.
    mounts = [str(volume).split(":")[1] for volume in flower["volumes"]]
    assert any(Path(options["--db"]).parent == Path(mount) for mount in mounts)
    assert flower["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/healthcheck" in " ".join(flower["healthcheck"]["test"])


@pytest.mark.parametrize("service", ["flower", "metrics"])
def test_http_services_check_the_port_they_serve_and_publish(service: str) -> None:
    spec = _services()[service]
    argv = _argv(spec["command"])
    option = next(arg for arg in argv if arg.startswith("--port"))
    port = option.split("=", 1)[1] if "=" in option else argv[argv.index(option) + 1]
    assert [str(p).rsplit(":", 1)[1] for p in spec["ports"]] == [port]
    assert f"localhost:{port}/" in " ".join(spec["healthcheck"]["test"])


# ---- every command a service runs exists, with its options ---------------------------------

SERVICE_COMMANDS = _service_commands()


def test_every_project_service_runs_a_command_and_has_a_healthcheck() -> None:
    for name, spec in _app_services().items():
        assert "command" in spec, name
        if name != "producer":  # a one-shot job has nothing to probe
            assert "healthcheck" in spec, name


def _celery_subcommand(argv: list[str]) -> tuple[list[str], list[str]]:
    """(``celery -A worker SUB [ACTION]``, the arguments after it), checking ``-A worker``."""
    rest = argv[1:]
    app = None
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("-A", "--app"):
            app = rest.pop(0)
        elif option.startswith("--app="):
            app = option.split("=", 1)[1]
    assert app == "worker", f"{shlex.join(argv)}: runs app {app!r}, not `-A worker`"
    assert rest, f"{shlex.join(argv)}: no celery command"
    sub = [rest.pop(0)]
    if sub[0] in ("inspect", "control") and rest:
        sub.append(rest.pop(0))
    return ["-A", "worker", *sub], rest


def _flower_option_names(env: Mapping[str, str]) -> set[str]:
    code = "from flower.options import options; print(*options._options, sep='\\n')"
    done = _run([sys.executable, "-c", code], env)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def _cleveragents_command(args: list[str]) -> tuple[list[str], click.Command | None, list[str]]:
    """(the command path, its click command if it exists, the arguments after it)."""
    path: list[str] = []
    command: click.Command = cli
    rest = list(args)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        path.append(name)
        found = command.commands.get(name)
        if found is None:
            return path, None, rest
        command = found
    return path, command, rest


@pytest.mark.parametrize("command", SERVICE_COMMANDS, ids=[c.id for c in SERVICE_COMMANDS])
def test_service_command_exists_in_this_project(command: ServiceCommand, tmp_path: Path) -> None:
    argv = list(command.argv)
    shown = f"{command.service} {command.role}: {shlex.join(argv)}"
    env = _subprocess_env(command.service, tmp_path)
    program = Path(argv[0]).name

    if program == "celery":
        sub, rest = _celery_subcommand(argv)
        done = _run([sys.executable, "-m", "celery", *sub, "--help"], env)
        assert done.returncode == 0, f"{shown}\n{done.stdout}{done.stderr}"
        if sub[2] == "flower":
            # Flower parses its own options (tornado) and silently drops unknown ones;
            # tornado takes only --name=value.
            known = _flower_option_names(env)
            # FLOWER_<OPTION> variables set options too; Flower ignores unknown ones.
            for variable in (key for key in env if key.startswith("FLOWER_")):
                name = variable.removeprefix("FLOWER_").lower().replace("_", "-")
                assert name in known, f"{command.service}: Flower has no option for {variable}"
            for arg in rest:
                name = arg.lstrip("-").split("=", 1)[0].replace("_", "-")
                assert arg.startswith("--"), f"{shown}: write {arg} as --name=value"
                assert "=" in arg, f"{shown}: write {arg} as --name=value"
                assert name in known, f"{shown}: Flower has no option {arg}"
        else:
            for option in _option_names(rest):
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", done.stdout), (
                    f"{shown}: `celery {' '.join(sub[2:])}` has no option {option}"
                )
    elif program == "cleveragents":
        path, click_command, rest = _cleveragents_command(argv[1:])
        done = _run([sys.executable, "-m", "cleveragents", *path, "--help"], env)
        assert done.returncode == 0, f"{shown}\n{done.stdout}{done.stderr}"
        assert click_command is not None, f"{shown}: no command `cleveragents {' '.join(path)}`"
        # Parse the arguments with the command's own parser (its callback is not run).
        try:
            click_command.make_context(" ".join(path), list(rest))
        except click.ClickException as exc:
            pytest.fail(f"{shown}: {exc.format_message()}")
    elif program in ("python", "python3") and argv[1] == "-c":
        compile(argv[2], f"<{command.service} healthcheck>", "exec")
    else:
        pytest.fail(f"{shown}: {program} is neither celery, cleveragents nor python -c")


def test_producer_request_succeeds_on_the_workers_catalogue() -> None:
    # The worker mounts no catalogue: it serves the bundled examples, and the producer's
    # request must be one of theirs (and must not need writes).
    services = _services()
    assert "CLEVERAGENTS_CATALOGUE" not in _container_env(services["worker"])
    path, command, rest = _cleveragents_command(_argv(services["producer"]["command"])[1:])
    assert path == ["submit"]
    assert command is not None
    params = command.make_context("submit", rest).params
    assert params["wait"], "the producer waits for its result (and exits 1 if it failed)"
    request = {
        "skill": params["skill"],
        "tool": params["tool"],
        "arguments": json.loads(params["args_json"] or "{}"),
        "allow_writes": params["allow_writes"],
        "timeout_s": params["timeout"],
    }
    catalogue = Catalogue.from_paths(bundled_examples_path())
    result = invoke(request, catalogue, read_only=False)
    assert result.success, result.error


# ---- the services' commands against a real Redis --------------------------------------------


@contextlib.contextmanager
def _started(
    args: list[str], env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait(10)


def _program(argv: list[str]) -> list[str]:
    """``argv`` with its program taken from this interpreter's environment."""
    return [str(BIN / argv[0]), *argv[1:]]


def _live_env(service: str, tmp_path: Path, redis_url: str) -> dict[str, str]:
    env = _subprocess_env(service, tmp_path)
    env["CLEVERAGENTS_BROKER_URL"] = redis_url  # instead of redis://...@redis:6379/0
    return env


@pytest.mark.slow
def test_worker_healthcheck_and_producer_work_on_a_real_redis(
    redis_url: str, tmp_path: Path
) -> None:
    # Given the worker started with its compose command, in an empty working directory
    # (like /app in the image: no ./skills, so the bundled examples)
    services = _services()
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    env = _live_env("worker", tmp_path, redis_url)
    ready = tmp_path / "ready"
    env["CLEVERAGENTS_READY_FILE"] = str(ready)
    log = tmp_path / "worker.log"
    with _started(_program(_argv(services["worker"]["command"])), env, app_dir, log):
        wait_until(ready.exists, 60, "the compose worker to be ready")

        # When its health check runs in a shell with the container's HOSTNAME
        test = services["worker"]["healthcheck"]["test"]
        assert test[0] == "CMD-SHELL"
        check_env = {**env, "HOSTNAME": socket.gethostname()}
        health = subprocess.run(
            ["sh", "-c", test[1]],
            cwd=app_dir,
            env=check_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # Then it passes
        assert health.returncode == 0, health.stdout + health.stderr + log.read_text()

        # And the producer's command gets a successful result through the queue
        producer = _live_env("producer", tmp_path, redis_url)
        done = subprocess.run(
            _program(_argv(services["producer"]["command"])),
            cwd=app_dir,
            env=producer,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr + log.read_text()
        assert json.loads(done.stdout)["success"] is True


def _status(url: str, headers: Mapping[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _with_option(argv: list[str], name: str, value: str) -> list[str]:
    return [f"{name}={value}" if arg.startswith(f"{name}=") else arg for arg in argv]


@pytest.fixture
def redis_with_password() -> Iterator[RedisServer]:
    """A private redis-server that wants a password, as the compose file's Redis does."""
    server = RedisServer(password="redispassword0123", persistence=False).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.mark.slow
def test_flower_passes_its_healthcheck_and_asks_everyone_else_for_the_password(
    redis_with_password: RedisServer, tmp_path: Path
) -> None:
    # Given Flower started with its compose command and environment (the login only in
    # FLOWER_BASIC_AUTH), on a free port of 127.0.0.1
    flower = _services()["flower"]
    port = str(free_port())
    argv = _with_option(_argv(flower["command"]), "--port", port)
    argv = _with_option(argv, "--db", str(tmp_path / "flower.db"))
    argv.append("--address=127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    env = _live_env("flower", tmp_path, redis_with_password.url)
    assert env["FLOWER_BASIC_AUTH"] == f"{_user_env()['FLOWER_USER']}:{PLACEHOLDER}"
    with _started(_program(argv), env, tmp_path, tmp_path / "flower.log") as proc:
        wait_until(lambda: _status(f"{base}/healthcheck") == 200, 60, "flower to listen")

        # Then neither password is on its command line (what `ps` shows)
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        if cmdline.exists():
            shown = cmdline.read_bytes().decode(errors="replace")
            assert "flower" in shown
            assert PLACEHOLDER not in shown
            assert redis_with_password.password not in shown

        # Then its health check passes without credentials
        kind, *check = flower["healthcheck"]["test"]
        assert kind == "CMD"
        assert check[0] in ("python", "python3")
        check = [arg.replace("localhost:5555", f"localhost:{port}") for arg in check]
        health = subprocess.run(
            [sys.executable, *check[1:]], capture_output=True, text=True, timeout=30, check=False
        )
        assert health.returncode == 0, health.stderr

        # And its pages and API want the basic-auth login, which they accept
        user_password = f"{_user_env()['FLOWER_USER']}:{PLACEHOLDER}"
        login = {"Authorization": "Basic " + base64.b64encode(user_password.encode()).decode()}
        wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:wrong").decode()}
        assert _status(f"{base}/") == 401
        assert _status(f"{base}/api/workers") == 401
        assert _status(f"{base}/", wrong) == 401
        assert _status(f"{base}/", login) == 200
        # And Prometheus scrapes /metrics without a login (it is published on 127.0.0.1 only)
        assert _status(f"{base}/metrics") == 200


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
    for tool in ("gcc", "g++", "clang", "build-essential", "python3-dev", "apt-get install"):
        assert tool not in text, f"{tool} in the final stage"


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
    assert json.loads(cmd) == ["celery", "-A", "worker", "worker", "--loglevel", "INFO"]
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
