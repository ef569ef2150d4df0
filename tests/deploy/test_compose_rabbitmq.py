"""The compose deployment on RabbitMQ: the ``rabbitmq`` profile and docker-compose.rabbitmq.yml.

Checked without a Docker engine, as test_compose.py does: the override file against the
Compose Specification schema, and the services as Compose merges it over
docker-compose.yml (``environment`` key by key, ``depends_on`` service by service),
with .env copied from .env.example.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleveragents.broker.rabbitmq import uses_amqp
from cleveragents.constants import HARD_LIMIT_GRACE_S
from cleveragents.settings import Settings
from tests.support.composefile import (
    BIN,
    COMPOSE_FILE,
    ENV_EXAMPLE,
    PLACEHOLDER,
    REDIS_PEOPLE,
    REDIS_USERS,
    SECRETS,
    SERVICE_ENVIRONMENT,
    MissingVariableError,
    RedisWithUsers,
    _app_services,
    _argv,
    _compose,
    _container_env,
    _interpolate,
    _program,
    _read_env_file,
    _started,
    _user_env,
)
from tests.support.procs import REPO, wait_until
from tests.support.prom import parse, value

OVERRIDE = COMPOSE_FILE.parent / "docker-compose.rabbitmq.yml"
#: What the override may change in a service: where it sends invocations, and what it waits for.
MERGED_KEYS = {"environment", "depends_on"}


def _raw_override() -> dict[str, Any]:
    loaded = yaml.safe_load(OVERRIDE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _merged(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Every service as Compose runs it with both files (and .env from .env.example)."""
    env = _user_env() if env is None else env
    services: dict[str, dict[str, Any]] = _compose(env)["services"]
    override = _interpolate(_raw_override(), env)["services"]
    for name, extra in override.items():
        assert set(extra) <= MERGED_KEYS, name
        spec = services[name]
        spec["environment"] = {**_container_env(spec), **_container_env(extra)}
        spec["depends_on"] = {**spec.get("depends_on", {}), **extra.get("depends_on", {})}
    return services


def test_the_override_matches_the_compose_specification_schema() -> None:
    done = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(OVERRIDE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_profile_runs_rabbitmq_with_its_data_on_a_volume_and_a_health_check() -> None:
    rabbitmq = _compose()["services"]["rabbitmq"]
    assert rabbitmq["profiles"] == ["rabbitmq"]
    assert rabbitmq["image"].startswith("rabbitmq:3-management")
    # Its data lives under its node name, rabbit@<hostname>: fixed, so a recreated
    # container finds the volume's queues.
    assert rabbitmq["hostname"] == "rabbitmq"
    assert any(str(v).endswith(":/var/lib/rabbitmq") for v in rabbitmq["volumes"])
    assert "rabbitmq-data" in _compose()["volumes"]
    # AMQP is for this project's containers only; the management UI on 127.0.0.1 only.
    assert [str(port) for port in rabbitmq["ports"]] == ["127.0.0.1:15672:15672"]
    assert "rabbitmq-diagnostics" in _argv(rabbitmq["healthcheck"]["test"])
    # A delivery may stay unacknowledged for the longest invocation, and a wait behind
    # one in a worker's prefetch: RabbitMQ's consumer_timeout (30 min) is raised past it.
    [config] = rabbitmq["configs"]
    assert config["target"].startswith("/etc/rabbitmq/conf.d/")
    conf = _compose()["configs"][config["source"]]["content"]
    timeout_ms = int(dict(line.split(" = ") for line in conf.splitlines())["consumer_timeout"])
    assert timeout_ms > (Settings.from_env({}).max_timeout_s + HARD_LIMIT_GRACE_S) * 1000
    environment = _container_env(rabbitmq)
    assert environment["RABBITMQ_DEFAULT_USER"] == _user_env()["RABBITMQ_USER"]
    assert environment["RABBITMQ_DEFAULT_PASS"] == PLACEHOLDER


def test_the_override_points_every_app_service_at_rabbitmq_and_keeps_redis_for_results() -> None:
    services = _merged()
    apps = _app_services()
    assert set(_raw_override()["services"]) == set(apps)
    user = _user_env()["RABBITMQ_USER"]
    for name in apps:
        spec = services[name]
        environment = _container_env(spec)
        extra = {"CLEVERAGENTS_RESULT_BACKEND"} | (
            {"FLOWER_BROKER_API"} if name == "flower" else set()
        )
        assert set(environment) == SERVICE_ENVIRONMENT[name] | extra, name
        settings = Settings.from_env(environment)
        assert uses_amqp(settings), name
        assert settings.broker_url == f"amqp://{user}:{PLACEHOLDER}@rabbitmq:5672//", name
        redis_user, _ = REDIS_USERS[name]
        assert settings.result_backend == f"redis://{redis_user}:{PLACEHOLDER}@redis:6379/0"
        for needed in ("redis", "rabbitmq"):
            assert spec["depends_on"][needed]["condition"] == "service_healthy", (name, needed)
    # The default services without the override stay on Redis alone.
    for name, spec in apps.items():
        assert _container_env(spec)["CLEVERAGENTS_BROKER_URL"].startswith("redis://"), name


def test_the_override_refuses_to_start_without_the_rabbitmq_password() -> None:
    assert _read_env_file(ENV_EXAMPLE)["RABBITMQ_PASSWORD"] == ""
    with pytest.raises(MissingVariableError, match="RABBITMQ_PASSWORD"):
        _merged({**_user_env(), "RABBITMQ_PASSWORD": ""})
    # docker-compose.yml alone still starts without it (nobody uses RabbitMQ then).
    assert _compose({**_user_env(), "RABBITMQ_PASSWORD": ""})["services"]


def test_each_password_reaches_only_the_services_that_need_it_on_rabbitmq() -> None:
    names = (*SECRETS, "RABBITMQ_PASSWORD")
    passwords = {name: f"secret{i:02d}value" for i, name in enumerate(names)}
    services = _merged({**_user_env(), **passwords})
    apps = set(_app_services())
    for name, password in passwords.items():
        hits = {
            (service, key)
            for service, spec in services.items()
            for key, value in _container_env(spec).items()
            if password in value
        }
        for service, spec in services.items():
            for part in ("command", "healthcheck", "entrypoint"):
                assert password not in str(spec.get(part, "")), (name, service, part)
        if name == "RABBITMQ_PASSWORD":
            expected = {("rabbitmq", "RABBITMQ_DEFAULT_PASS"), ("flower", "FLOWER_BROKER_API")}
            expected |= {(service, "CLEVERAGENTS_BROKER_URL") for service in apps}
            assert hits == expected
        elif name in {var for _, var in REDIS_USERS.values()}:
            # A Redis role's password: now in its one service's result backend only.
            [service] = [svc for svc, (_, var) in REDIS_USERS.items() if var == name]
            assert hits == {(service, "CLEVERAGENTS_RESULT_BACKEND")}, name
        elif name in REDIS_PEOPLE.values():
            assert hits == set(), name  # no service logs in as a person's role


# ---- the services' commands on a real RabbitMQ, each with its own Redis user ----------------


def _live_env(
    services: Mapping[str, Any], name: str, rabbit_url: str, server: RedisWithUsers, home: Path
) -> dict[str, str]:
    """A service's merged environment, pointed at this machine's RabbitMQ and Redis."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    environment = _container_env(services[name])
    backend = environment["CLEVERAGENTS_RESULT_BACKEND"]
    assert "@redis:6379/" in backend, backend
    return {
        **keep,
        **environment,
        "CLEVERAGENTS_BROKER_URL": rabbit_url,
        "CLEVERAGENTS_RESULT_BACKEND": backend.replace(
            "@redis:6379/", f"@127.0.0.1:{server.port}/"
        ),
        "CLEVERAGENTS_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    }


@pytest.mark.slow
def test_the_worker_producer_and_exporter_work_on_rabbitmq_as_their_own_redis_users(
    rabbit_url: str, tmp_path: Path
) -> None:
    # Given a Redis with the compose file's users, and the worker started with its compose
    # command and its merged environment (RabbitMQ as broker, Redis as user `worker`)
    server = RedisWithUsers().start()
    try:
        services = _merged(server.env)
        env = _live_env(services, "worker", rabbit_url, server, tmp_path / "home")
        ready = tmp_path / "ready"
        env["CLEVERAGENTS_READY_FILE"] = str(ready)
        app_dir = tmp_path / "app"
        app_dir.mkdir()
        log = tmp_path / "worker.log"
        with _started(_program(_argv(services["worker"]["command"])), env, app_dir, log):
            wait_until(ready.exists, 60, "the compose worker to be ready")
            # When its health check, the producer's command and the exporter run
            check = subprocess.run(
                ["sh", "-c", services["worker"]["healthcheck"]["test"][1]],
                cwd=app_dir,
                env={**env, "HOSTNAME": socket.gethostname()},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            producer = _live_env(services, "producer", rabbit_url, server, tmp_path / "home")
            done = subprocess.run(
                _program(_argv(services["producer"]["command"])),
                cwd=app_dir,
                env=producer,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            exporter = _live_env(services, "metrics", rabbit_url, server, tmp_path / "home")
            scraped = subprocess.run(
                [str(BIN / "cleveragents"), "metrics", "--once"],
                cwd=app_dir,
                env=exporter,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        # Then each succeeded
        assert check.returncode == 0, check.stdout + check.stderr + log.read_text()
        assert done.returncode == 0, done.stdout + done.stderr + log.read_text()
        assert json.loads(done.stdout)["success"] is True
        assert scraped.returncode == 0, scraped.stderr
        lengths = parse(scraped.stdout)
        assert ("cleveragents_queue_length", (("queue", "skills.read"),)) in lengths
        assert value(lengths, "cleveragents_queue_length", queue="skills.read") == 0
        # And Redis refused none of their commands
        assert server.denials() == []
    finally:
        server.stop()
