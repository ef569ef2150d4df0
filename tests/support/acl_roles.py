"""Each role of the deployment as its own Redis user: a worker started with its compose
command, a producer's client, a Celery app with a service's user.

Shared by the tests of the compose file's Redis users (tests/deploy/test_redis_acl.py)
and of what a hostile holder of one role can still do (tests/deploy/test_role_abuse.py).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from cleveragents.broker.celery_settings import celery_settings
from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.support.composefile import (
    RedisWithUsers,
    _argv,
    _program,
    _services,
    _started,
    _subprocess_env,
)
from tests.support.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, wait_until

__all__ = ["as_user", "cli_as", "compose_worker", "producer_client", "refused", "role_app"]


@contextmanager
def compose_worker(
    server: RedisWithUsers, service: str, folder: Path, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker run with ``service``'s compose command and environment, as its Redis user."""
    folder.mkdir(parents=True, exist_ok=True)
    ready = folder / "ready"
    environment = {
        **_subprocess_env(service, folder),
        "CLEVERAGENTS_BROKER_URL": server.service_url(service),
        "CLEVERAGENTS_CATALOGUE": os.pathsep.join([str(FIXTURE_SKILLS), str(EXAMPLE_SKILLS)]),
        "CLEVERAGENTS_NOTES_DIR": str(folder / "notes"),
        "CLEVERAGENTS_READY_FILE": str(ready),
        # In the deployment the worker runs as its own user and so do its command tools;
        # here the test runs it as root, and its tools write into root's tmp_path.
        "CLEVERAGENTS_TOOL_USER": "root" if os.geteuid() == 0 else "",
        **env,
    }
    # Mingle and gossip on, as in the deployment; a node name of its own per worker.
    argv = [*_program(_argv(_services()[service]["command"]))]
    argv += ["--hostname", f"{service}-{uuid.uuid4().hex[:8]}@%h"]
    log = folder / "worker.log"
    with _started(argv, environment, folder, log) as proc:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, f"{service} ready")
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        yield proc


def producer_client(server: RedisWithUsers, home: Path) -> SkillClient:
    url = server.service_url("producer")
    return SkillClient(
        settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": url, "CLEVERAGENTS_HOME": str(home)})
    )


def role_app(server: RedisWithUsers, service: str) -> Celery:
    """A Celery app with the project's settings and ``service``'s broker URL (so its user).

    As ``flower``: the app Flower has (``celery -A worker flower``), for its events,
    inspect and results.
    """
    app = Celery(f"as-{service}", set_as_current=False)
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": server.service_url(service)})
    app.conf.update(celery_settings(settings))
    return app


def as_user(server: RedisWithUsers, user: str) -> Any:
    """A Redis client logged in as ``user``."""
    return redis.Redis.from_url(server.url(user), socket_timeout=10)


def refused(client: redis.Redis, *command: str) -> bool:
    """Whether Redis refuses ``command`` to ``client``'s user (its ACL)."""
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError:
        return True
    return False


def cli_as(
    server: RedisWithUsers, user: str, home: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The console script as ``user`` runs it (its URL, so its Redis user), ``env`` added."""
    environment = {
        **_subprocess_env("worker", home),
        "CLEVERAGENTS_BROKER_URL": server.url(user),
        **env,
    }
    return subprocess.run(
        [*_program(["cleveragents"]), *args],
        cwd=home, env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
