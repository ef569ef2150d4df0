"""Every command a compose service runs exists in this project, and works against a real Redis."""

from __future__ import annotations

import base64
import json
import re
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import click
import pytest

from cleveragents.cli.app import cli
from cleveragents.runtime import invoke
from cleveragents.settings import bundled_examples_path
from cleveragents.skills import Catalogue
from tests.support.composefile import (
    PLACEHOLDER,
    RedisWithUsers,
    ServiceCommand,
    _app_services,
    _argv,
    _container_env,
    _option_names,
    _program,
    _run,
    _service_commands,
    _services,
    _started,
    _subprocess_env,
    _user_env,
)
from tests.support.procs import free_port, wait_until

# ---- every command a service runs exists, with its options ---------------------------------

SERVICE_COMMANDS = _service_commands()


def test_every_project_service_runs_a_command_and_has_a_healthcheck() -> None:
    for name, spec in _app_services().items():
        assert "command" in spec, name
        if name != "producer":  # a one-shot job has nothing to probe
            assert "healthcheck" in spec, name


#: The Celery app of every compose command: the package's, as the image installs it.
APP = "cleveragents.worker"


def _celery_subcommand(argv: list[str]) -> tuple[list[str], list[str]]:
    """(``celery -A APP SUB [ACTION]``, the arguments after it), checking the app.

    The image holds the installed wheel alone: its app is ``cleveragents.worker``.
    """
    rest = argv[1:]
    app = None
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("-A", "--app"):
            app = rest.pop(0)
        elif option.startswith("--app="):
            app = option.split("=", 1)[1]
    assert app == APP, f"{shlex.join(argv)}: runs app {app!r}, not `-A {APP}`"
    assert rest, f"{shlex.join(argv)}: no celery command"
    sub = [rest.pop(0)]
    if sub[0] in ("inspect", "control") and rest:
        sub.append(rest.pop(0))
    return ["-A", APP, *sub], rest


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
        found = command.get_command(click.Context(command), name)  # imports a lazy one
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


def _live_env(service: str, tmp_path: Path, server: RedisWithUsers) -> dict[str, str]:
    env = _subprocess_env(service, tmp_path)
    # The service's own URL (its Redis user and password), at the private server's port.
    env["CLEVERAGENTS_BROKER_URL"] = server.service_url(service)
    return env


@pytest.fixture
def redis_with_users() -> Iterator[RedisWithUsers]:
    """A private redis-server with the compose file's Redis users, as its Redis has."""
    server = RedisWithUsers().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_worker_healthcheck_and_producer_work_on_a_real_redis(
    redis_with_users: RedisWithUsers, tmp_path: Path
) -> None:
    # Given the worker started with its compose command, in an empty working directory
    # (like /app in the image: no ./skills, so the bundled examples), logged in to a Redis
    # with the compose file's users as its own Redis user
    services = _services()
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    env = _live_env("worker", tmp_path, redis_with_users)
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
        producer = _live_env("producer", tmp_path, redis_with_users)
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
    # And Redis refused none of their commands
    assert redis_with_users.denials() == []
    # And the worker wrote nothing into its working directory, which is read-only in the
    # container (but for its .cleveragents, a tmpfs there)
    written = [p for p in app_dir.rglob("*") if ".cleveragents" not in p.relative_to(app_dir).parts]
    assert written == []


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


@pytest.mark.slow
def test_flower_passes_its_healthcheck_and_asks_everyone_else_for_the_password(
    redis_with_users: RedisWithUsers, tmp_path: Path
) -> None:
    # Given Flower started with its compose command and environment (the login only in
    # FLOWER_BASIC_AUTH), on a free port of 127.0.0.1, logged in to Redis as its own user
    flower = _services()["flower"]
    port = str(free_port())
    argv = _with_option(_argv(flower["command"]), "--port", port)
    argv = _with_option(argv, "--db", str(tmp_path / "flower.db"))
    argv.append("--address=127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    env = _live_env("flower", tmp_path, redis_with_users)
    assert env["FLOWER_BASIC_AUTH"] == f"{_user_env()['FLOWER_USER']}:{PLACEHOLDER}"
    with _started(_program(argv), env, tmp_path, tmp_path / "flower.log") as proc:
        wait_until(lambda: _status(f"{base}/healthcheck") == 200, 60, "flower to listen")

        # Then neither password is on its command line (what `ps` shows)
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        if cmdline.exists():
            shown = cmdline.read_bytes().decode(errors="replace")
            assert "flower" in shown
            assert PLACEHOLDER not in shown
            for password in redis_with_users.passwords.values():
                assert password not in shown

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
        # And its Broker page reads the queue lengths, which its Redis user may
        assert _status(f"{base}/api/queues/length", login) == 200
    # And Redis refused none of its commands (events, broker page)
    assert redis_with_users.denials() == []
