"""Read docker-compose.yml, .env.example and the Dockerfile the way Compose and Docker do."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import yaml

from tests.support.procs import REPO, free_port, kill_group, wait_until

COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BIN = Path(sys.executable).parent

#: Stands in for what a user writes into .env where .env.example leaves a value empty.
PLACEHOLDER = "placeholder0123"
#: The Redis user of each service that talks to Redis, and the variable of its password.
REDIS_USERS = {
    "worker": ("worker", "REDIS_WORKER_PASSWORD"),
    "worker-readonly": ("worker-readonly", "REDIS_WORKER_READONLY_PASSWORD"),
    "producer": ("producer", "REDIS_PRODUCER_PASSWORD"),
    "flower": ("flower", "REDIS_FLOWER_PASSWORD"),
    "metrics": ("metrics", "REDIS_METRICS_PASSWORD"),
}
#: Redis users no service of the compose file logs in as (people run them from their own
#: machines: an approver's `cleveragents approvals approve`), and the variable of each
#: one's password.
REDIS_PEOPLE = {"approver": "REDIS_APPROVER_PASSWORD"}
#: Redis' admin user and the variable of its password (Redis' own health check uses it).
REDIS_ADMIN = ("admin", "REDIS_PASSWORD")
#: Variables that must be set by the user: compose refuses to start without them.
SECRETS = (
    REDIS_ADMIN[1],
    *(var for _, var in REDIS_USERS.values()),
    *REDIS_PEOPLE.values(),
    "FLOWER_PASSWORD",
)
#: Set by the user, without a default, though not secret.
REQUIRED = (*SECRETS, "FLOWER_USER")
#: The services of a plain `docker compose up`.
DEFAULT_SERVICES = {"redis", "worker", "flower", "metrics"}
#: The settings of .env.example that configure a worker (CLEVERAGENTS_IMAGE is Compose's).
WORKER_SETTINGS = (
    "CLEVERAGENTS_DEFAULT_TIMEOUT_S",
    "CLEVERAGENTS_VISIBILITY_TIMEOUT_S",
    "CLEVERAGENTS_RESULT_EXPIRES_S",
    "CLEVERAGENTS_LOG_FORMAT",
    # Traces: off unless OTEL_TRACES_EXPORTER says where spans go (the traces profile)
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER",
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


@contextlib.contextmanager
def _started(
    args: list[str], env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A process of its own session, ended (TERM, then KILL) with everything it started."""
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


# ---- the compose file's Redis users, on a private redis-server --------------------------------

#: Where the compose file's Redis reads its users (the target of the redis-users config).
ACL_FILE_TARGET = "/usr/local/etc/redis/users.acl"


def _redis_users_config(tree: Mapping[str, Any]) -> str:
    content = tree["configs"]["redis-users"]["content"]
    assert isinstance(content, str)
    return content


class RedisWithUsers:
    """A private redis-server whose users are the compose file's, each with its own password.

    The ACL file is the compose file's ``redis-users`` config, filled in the way Compose
    does from .env.example and a fresh password per variable: what Redis loads in the
    deployment, loaded here.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="cleveragents-redis-acl-"))
        #: .env's password variables, each a distinct value (letters and digits).
        self.passwords = {name: f"pw{secrets.token_hex(12)}" for name in SECRETS}
        self.env = {**_user_env(), **self.passwords}
        self.acl = _redis_users_config(_compose(self.env))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisWithUsers:
        """Start redis-server with the ACL file; wait until the admin user gets a PONG."""
        aclfile = self.dir / "users.acl"
        aclfile.write_text(self.acl, encoding="utf-8")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.dir), "--save", "", "--appendonly", "no"]
        args += ["--logfile", str(self.dir / "redis.log"), "--aclfile", str(aclfile)]
        self.proc = subprocess.Popen(
            args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        proc = self.proc
        admin = self.admin()
        wait_until(lambda: _pings(admin) or proc.poll() is not None, 10, "redis-server")
        assert proc.poll() is None, (self.dir / "redis.log").read_text()
        return self

    def password(self, user: str) -> str:
        """The password of a Redis user of the compose file."""
        roles = {name: var for name, var in (REDIS_ADMIN, *REDIS_USERS.values())}
        roles.update(REDIS_PEOPLE)
        return self.passwords[roles[user]]

    def url(self, user: str) -> str:
        """A redis:// URL that logs in as ``user``."""
        return f"redis://{user}:{self.password(user)}@127.0.0.1:{self.port}/0"

    def service_url(self, service: str) -> str:
        """The broker URL of a compose service, pointed at this server instead of redis:6379."""
        environment = _container_env(_compose(self.env)["services"][service])
        url = environment["CLEVERAGENTS_BROKER_URL"]
        assert "@redis:6379/" in url, url
        return url.replace("@redis:6379/", f"@127.0.0.1:{self.port}/")

    def admin(self) -> redis.Redis:
        """A client logged in as the admin user."""
        user, _ = REDIS_ADMIN
        return redis.Redis(port=self.port, username=user, password=self.password(user))

    def denials(self) -> list[dict[str, Any]]:
        """ACL LOG: every command, key or channel Redis refused since the last reset."""
        entries = self.admin().acl_log(count=1000)
        assert isinstance(entries, list)
        return entries

    def stop(self) -> None:
        """Kill the server and remove its folder."""
        if self.proc is not None:
            kill_group(self.proc)
            self.proc.wait(10)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
