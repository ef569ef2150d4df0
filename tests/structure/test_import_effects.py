"""Importing the library does nothing; a bad setting is an error where it is used.

Every import runs in a fresh interpreter in an empty folder, so that nothing an
earlier test imported hides an effect.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kombu.transport import TRANSPORT_ALIASES

from cleveragents.client import SkillClient
from cleveragents.embedded.runner import LocalWorker
from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings
from tests.support.procs import EXAMPLE_SKILLS, REPO, Worker, wait_until

pytestmark = pytest.mark.timeout(180)

#: Settings that are all invalid: importing must not notice any of them.
BAD_SETTINGS = {
    "CLEVERAGENTS_READ_ONLY": "maybe",
    "CLEVERAGENTS_LOG_FORMAT": "xml",
    "CLEVERAGENTS_DEFAULT_TIMEOUT_S": "-1",
    "CLEVERAGENTS_VISIBILITY_TIMEOUT_S": "soon",
    "CLEVERAGENTS_RESULT_EXPIRES_S": "0",
}
#: What a command says of them: one line naming the first bad setting it reads.
ONE_LINE = re.compile(r"error: CLEVERAGENTS_[A-Z_]+ must [^\n]+, got '[^\n]+'")

#: Imports every module of the library, celeryconfig, worker and tasks; prints what changed.
IMPORT_EVERYTHING = r"""
import importlib, json, os, pkgutil, sys

import kombu.transport
from celery.app import trace
from kombu.transport import redis as kombu_redis

aliases = dict(kombu.transport.TRANSPORT_ALIASES)
connparams = kombu_redis.Channel._connparams
log_success = trace.LOG_SUCCESS
environ = dict(os.environ)


#: The Celery app and its tasks: importing them builds the app (Flower's columns, below).
APP = ("cleveragents.worker", "cleveragents.tasks")


def walk(package, skip=()):
    # __main__ modules are programs: importing one runs it. (pkgutil.walk_packages would
    # import a skipped package to look inside it.)
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__, package + "."):
        if info.name.endswith(".__main__") or info.name.startswith(skip):
            continue
        if info.ispkg:
            walk(info.name, skip)
        else:
            importlib.import_module(info.name)


walk("cleveragents", skip=APP)
library_environ = dict(os.environ)
for package in (*APP, "worker", "tasks"):
    walk(package)
importlib.import_module("celeryconfig")
print(json.dumps({
    "aliases_unchanged": dict(kombu.transport.TRANSPORT_ALIASES) == aliases,
    "connparams_unpatched": kombu_redis.Channel._connparams is connparams,
    "log_success_unchanged": trace.LOG_SUCCESS == log_success,
    "library_environ_unchanged": library_environ == environ,
    "environ_added": sorted(set(os.environ) - set(environ)),
}))
"""


def _python(
    code: str, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**_clean_env(), "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CLEVERAGENTS_", "FLOWER_"))}


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "broker",
    [None, "amqp://guest:guest@127.0.0.1:5672//", "redis://127.0.0.1:6379/0"],
    ids=["embedded", "rabbitmq-without-backend", "redis"],
)
def test_importing_every_module_with_bad_settings_creates_nothing_and_changes_nothing(
    tmp_path: Path, broker: str | None
) -> None:
    # Given an empty folder and nothing but invalid settings
    env = dict(BAD_SETTINGS)
    if broker is not None:
        env["CLEVERAGENTS_BROKER_URL"] = broker
    # When every module is imported there
    done = _python(IMPORT_EVERYTHING, tmp_path, env)
    # Then nothing raised, nothing was created, and no library's global changed
    assert done.returncode == 0, done.stderr[-3000:]
    assert _tree(tmp_path) == []
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["aliases_unchanged"]
    assert report["connparams_unpatched"]
    assert report["log_success_unchanged"]
    assert report["library_environ_unchanged"]
    # The app module's one exception: Flower's default columns
    # (cleveragents/worker/flower_columns.py).
    assert report["environ_added"] == ["FLOWER_TASKS_COLUMNS"]


def test_the_worker_app_reads_its_settings_when_configured_not_at_import(tmp_path: Path) -> None:
    # Given the app imported while a setting was invalid, then the setting fixed
    code = (
        "import os, worker\n"
        "from kombu.transport import redis\n"
        "from celery.app import trace\n"
        "os.environ['CLEVERAGENTS_READ_ONLY'] = '1'\n"
        "print(sorted(q.name for q in worker.app.conf.task_queues))\n"
        "print(worker.app.conf.broker_transport)\n"
        "print(hasattr(redis.Channel._connparams, '_cleveragents_patch'))\n"
        "print('return_value' in trace.LOG_SUCCESS)\n"
    )
    # When the app's configuration is first read (as Flower and `celery inspect` do)
    done = _python(code, tmp_path, {"CLEVERAGENTS_READ_ONLY": "maybe"})
    # Then it is the fixed environment's, and loading it created and patched nothing
    assert done.returncode == 0, done.stderr[-3000:]
    queues, transport, patched, logs_return_value = done.stdout.strip().splitlines()
    assert queues == "['skills.batch', 'skills.read']"
    assert transport == "cleveragents.broker.redis.transport:SocketTransport"
    assert patched == "False"
    assert logs_return_value == "True"
    assert _tree(tmp_path) == []


def test_a_client_with_a_bad_setting_raises_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLEVERAGENTS_READ_ONLY", "maybe")
    with pytest.raises(ConfigurationError, match="CLEVERAGENTS_READ_ONLY must be 1 or 0"):
        SkillClient()
    assert _tree(tmp_path) == []


def test_the_embedded_client_starts_the_homes_server_when_constructed(tmp_path: Path) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    with SkillClient(settings=settings):
        assert {"server/data", "server/server.json", "server/valkey.sock"} <= set(
            _tree(tmp_path / "home")
        )


def test_a_redis_client_creates_no_folder(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"CLEVERAGENTS_HOME": str(tmp_path / "home"), "CLEVERAGENTS_BROKER_URL": "redis://x:1/0"}
    )
    with SkillClient(settings=settings):
        assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["submit", "local/text-tools", "local/word-count", "--wait"],
        ["result", "some-id"],
        ["batch", "status", "some-id"],
        ["worker", "--concurrency", "1"],
    ],
    ids=["submit", "result", "batch-status", "worker"],
)
def test_the_cli_with_a_bad_setting_exits_2_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    done = _python("from cleveragents.cli import main; main()", tmp_path, BAD_SETTINGS, *command)
    assert done.returncode == 2
    assert ONE_LINE.fullmatch(done.stderr.strip()), done.stderr[-3000:]
    assert _tree(tmp_path) == []


@pytest.mark.parametrize(
    "command", [["worker"], ["flower"], ["inspect", "ping"]], ids=["worker", "flower", "inspect"]
)
def test_a_celery_command_of_the_app_with_a_bad_setting_fails_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    done = _python(
        "import sys; from celery.__main__ import main; sys.exit(main())",
        tmp_path,
        BAD_SETTINGS,
        "-A",
        "worker",
        *command,
    )
    assert done.returncode != 0
    assert ONE_LINE.fullmatch(done.stderr.strip()), done.stderr[-3000:]
    assert _tree(tmp_path) == []


def test_an_embedded_round_trip_leaves_kombus_transport_aliases_alone(tmp_path: Path) -> None:
    # Given the embedded default in an empty home, and kombu's table as shipped
    before = dict(TRANSPORT_ALIASES)
    settings = Settings.from_env(
        {"CLEVERAGENTS_HOME": str(tmp_path / "home"), "CLEVERAGENTS_CATALOGUE": str(EXAMPLE_SKILLS)}
    )
    # When a client sends through a real local worker on the embedded default's server
    with SkillClient(settings=settings) as client, LocalWorker(settings):
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a b c"})
        result = handle.result(timeout=60)
    # Then the invocation ran, and kombu's global alias table is unchanged
    assert result.output_data == {"words": 3}
    assert dict(TRANSPORT_ALIASES) == before


def test_a_started_worker_applies_the_patches_and_logs_no_return_value(
    redis_url: str, start_worker: Callable[..., Worker], client: SkillClient
) -> None:
    # Given a worker logging at INFO (tests/support/procs.py)
    worker = start_worker(redis_url)
    secret = "patch-secret-5151"
    # When an invocation succeeds
    assert client.submit("local/text-tools", "local/shout", {"text": secret}).result(30).success
    # Then the patches were applied at start, and the success line has no output
    wait_until(lambda: "succeeded in" in worker.log_text(), 10, "the success log line")
    log = worker.log_text()
    assert "applied cleveragents.broker.patches.kombu_connparams (kombu 5.7" in log
    assert "applied cleveragents.broker.patches.success_log (celery 5.7" in log
    assert secret.upper() not in log
