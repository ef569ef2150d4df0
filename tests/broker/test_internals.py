"""The table of private Celery and kombu members: true of the installed libraries, complete,
and obeyed outside the versions it was written for (``cleveragents/broker/internals.py``).

A newer kombu or Celery is simulated by setting its module's ``__version__`` in the
process, before anything reads it: in a real worker process started for the test.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from cleveragents.broker import internals
from cleveragents.broker.celery_settings import (
    celery_settings,
    consumer_transport,
    fallback_facts,
)
from cleveragents.broker.internals import INTERNALS, PARTS, InternalsRefused, check
from cleveragents.broker.patches import all_patches
from cleveragents.broker.queue_search import is_waiting
from cleveragents.client import SkillClient
from cleveragents.constants import HARD_LIMIT_GRACE_S
from cleveragents.pipeline.guard import CLAIM_GRACE_S
from cleveragents.settings import Settings
from cleveragents.skills.policies import LONGEST_RETRY_DELAY_S
from cleveragents.worker.consumer import CONTROL_STEP, check_steps
from tests.support.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, REPO, wait_until

#: Modules whose classes build on Celery's and kombu's.
BUILDERS = (
    "cleveragents.broker.redis.transport",
    "cleveragents.broker.redis.result_backend",
    "cleveragents.worker.consumer",
    "cleveragents.tasks.task_request",
)


def _resolve(member: str) -> tuple[object, str]:
    module_name, _, path = member.partition(":")
    owner: object = importlib.import_module(module_name)
    *outer, last = path.split(".")
    for name in outer:
        owner = getattr(owner, name)
    return owner, last


@pytest.mark.parametrize("entry", INTERNALS, ids=lambda e: f"{e.where}:{e.member}")
def test_every_private_member_in_the_table_exists_in_the_installed_library(
    entry: internals.Internal,
) -> None:
    owner, name = _resolve(entry.member)
    if entry.instance:  # set in __init__: named in the class's (or module's) source
        source = inspect.getsource(inspect.getmodule(owner) or owner)  # type: ignore[arg-type]
        assert f"self.{name}" in source, entry.member
    else:
        assert hasattr(owner, name), entry.member
    assert entry.part in PARTS
    assert entry.upstream.startswith("https://github.com/celery/")
    # The module named uses it: an honest table.
    assert name in Path(importlib.import_module(entry.where).__file__ or "").read_text()


@pytest.mark.parametrize(
    "entry", [e for e in INTERNALS if e.use == "copy"], ids=lambda e: e.member
)
def test_copied_upstream_code_is_unchanged_in_the_installed_library(
    entry: internals.Internal,
) -> None:
    # When this fails, upstream changed the code ours was copied from: compare the two,
    # carry the change over (or drop ours), then record the new digest.
    owner, name = _resolve(entry.member)
    source = inspect.getsource(getattr(owner, name))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == entry.copied_digest


def test_every_override_of_a_private_member_is_in_the_table() -> None:
    listed = {(e.where, e.member.rpartition(".")[2]) for e in INTERNALS}
    missing = []
    for module_name in BUILDERS:
        module = importlib.import_module(module_name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module_name:
                continue
            bases = [b for b in cls.__mro__[1:] if b.__module__.startswith(("celery", "kombu"))]
            for name in vars(cls):
                private = name.startswith("_") and not name.startswith("__")
                inherited = any(name in vars(b) for b in bases)
                if private and inherited and (module_name, name) not in listed:
                    missing.append(f"{module_name}:{cls.__name__}.{name}")
    assert missing == []


def test_each_patch_takes_its_release_series_from_the_table() -> None:
    for patch in all_patches():
        part = next(PARTS[e.part] for e in INTERNALS if e.where == patch.name)
        assert (patch.distribution, patch.series) == (part.distribution, part.series)
        assert patch.required == (part.outside == "refuse")


def test_the_installed_libraries_fit_every_part() -> None:
    assert [name for name in PARTS if not internals.fits(name)] == []


def test_a_newer_kombu_leaves_the_redis_transport_and_queue_search_to_kombu(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    import kombu

    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    assert consumer_transport(settings) is not None
    monkeypatch.setattr(kombu, "__version__", "5.8.0")
    verdict = check("worker", "redis")
    assert verdict.fallbacks == {"redis-transport"}
    (line,) = verdict.warnings
    assert "written for kombu 5.7.x and 5.8.0 is installed" in line
    assert "kombu's own Redis transport runs instead" in line
    assert consumer_transport(settings) is None
    assert is_waiting(settings, "some-id") is None  # "cannot tell", not a wrong "no"
    # On RabbitMQ the Redis transport is nothing to check.
    assert check("worker", "other").fallbacks == frozenset()


def test_under_kombus_own_transport_no_live_worker_holds_a_message_past_the_visibility_timeout(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    import kombu

    # Given the defaults (a visibility timeout of 900 s, CLEVERAGENTS_MAX_TIMEOUT_S 3600)
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    ours = celery_settings(settings)["broker_transport_options"]["visibility_timeout"]
    assert ours == settings.visibility_timeout_s == 900  # our transport never sweeps the live
    # When kombu is of a series our transport was not written for
    monkeypatch.setattr(kombu, "__version__", "5.8.0")
    in_force = celery_settings(settings)["broker_transport_options"]["visibility_timeout"]
    # Then kombu's sweep passes by every message a live worker may hold: through the
    # longest wait for a retry, then the hard time limit of the longest invocation
    longest_hold = (
        LONGEST_RETRY_DELAY_S + settings.max_timeout_s + CLAIM_GRACE_S + HARD_LIMIT_GRACE_S
    )
    assert in_force > longest_hold + 60
    # and the warning names the value in force and what changes, not "an hour"
    (line,) = check("worker", "redis", fallback_facts(settings)).warnings
    assert f"the visibility timeout in force is {in_force:.0f} s, raised from" in line
    assert "an hour" not in line
    assert "CLEVERAGENTS_RECOVERY_S" in line
    assert "CLEVERAGENTS_MAX_TIMEOUT_S" in line
    # as on a sentinel:// broker outside kombu 5.7, which kombu's own Sentinel transport serves
    sentinel = replace(settings, broker_url="sentinel://127.0.0.1:26379/0")
    assert celery_settings(sentinel)["broker_transport_options"]["visibility_timeout"] == in_force
    # and a longer one configured is kept
    longer = replace(settings, visibility_timeout_s=in_force * 2)
    assert celery_settings(longer)["broker_transport_options"]["visibility_timeout"] == (
        in_force * 2
    )


def test_a_newer_celery_refuses_a_producer_in_one_line(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    import celery

    monkeypatch.setattr(celery, "__version__", "5.8.0")
    with pytest.raises(InternalsRefused) as refused:
        SkillClient(redis_url)
    message = str(refused.value)
    assert "\n" not in message
    assert "written for celery 5.7.x and 5.8.0 is installed" in message
    assert "fix: pip install 'celery>=5.7,<5.8'" in message


def test_a_consumer_without_the_control_step_by_its_name_refuses_the_worker() -> None:
    check_steps()  # Celery as installed lists it
    steps = [s for s in importlib.import_module("celery.worker.consumer").Consumer.Blueprint
             .default_steps if s != CONTROL_STEP]
    with pytest.raises(InternalsRefused, match="remote control: it would run unguarded"):
        check_steps(steps)


def _worker(
    env: dict[str, str], simulate: str, folder: Path, concurrency: int = 1
) -> subprocess.Popen[bytes]:
    """A real worker process with one library's version set to 5.8.0 before it starts."""
    code = (
        f"import sys, {simulate}; {simulate}.__version__ = '5.8.0'\n"
        "from celery.__main__ import main\n"
        "sys.argv = ['celery', '-A', 'cleveragents.worker', 'worker', '--loglevel', 'INFO',"
        f" '--concurrency', '{concurrency}', '--without-mingle', '--without-gossip',"
        f" '--hostname', 'internals-{os.getpid()}@%h']\n"
        "main()\n"
    )
    full = {
        **os.environ,
        "CLEVERAGENTS_CATALOGUE": os.pathsep.join([str(EXAMPLE_SKILLS), str(FIXTURE_SKILLS)]),
        **env,
        "CLEVERAGENTS_READY_FILE": str(folder / "ready"),
        "PYTHONPATH": str(REPO),
    }
    with (folder / "worker.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cleveragents-internals-") as name:
        yield Path(name)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.slow
def test_a_worker_with_a_newer_kombu_runs_kombus_own_transport_and_says_so(
    redis_url: str, folder: Path
) -> None:
    # Given a worker whose kombu says 5.8.0
    proc = _worker({"CLEVERAGENTS_BROKER_URL": redis_url}, "kombu", folder)
    try:
        wait_until(
            lambda: (folder / "ready").exists() or proc.poll() is not None, 60, "worker ready"
        )
        log = (folder / "worker.log").read_text()
        assert proc.poll() is None, log[-3000:]
        # Then it says, in one warning line, what runs instead
        warnings = [line for line in log.splitlines() if "redis-transport was written" in line]
        assert len(warnings) == 1, log[-3000:]
        assert "WARNING" in warnings[0]
        assert "kombu's own Redis transport runs instead" in warnings[0]
        # And it still serves an invocation through Redis
        with SkillClient(redis_url) as client:
            handle = client.submit("local/text-tools", "local/word-count", {"text": "a b c"})
            result = handle.result(timeout=30)
        assert result.success, result
        assert result.output_data == {"words": 3}
    finally:
        _stop(proc)


@pytest.mark.slow
def test_a_worker_with_a_newer_celery_refuses_to_start_in_one_line(
    redis_url: str, folder: Path
) -> None:
    proc = _worker({"CLEVERAGENTS_BROKER_URL": redis_url}, "celery", folder)
    try:
        assert proc.wait(timeout=60) == 2
    finally:
        _stop(proc)
    log = (folder / "worker.log").read_text()
    refusals = [line for line in log.splitlines() if "cannot start" in line]
    assert len(refusals) == 1, log[-3000:]
    assert "written for celery 5.7.x and 5.8.0 is installed" in refusals[0]
    assert "fix: pip install 'celery>=5.7,<5.8'" in refusals[0]
    assert "Traceback" not in log
    assert not (folder / "ready").exists()


@pytest.mark.slow
def test_a_worker_on_kombus_own_transport_never_hands_out_a_live_workers_message_again(
    redis_url: str, folder: Path
) -> None:
    # Given a worker whose kombu says 5.8.0, two pool processes, a visibility timeout
    # of 2 s configured, and a read that runs 10 s
    env = {"CLEVERAGENTS_BROKER_URL": redis_url, "CLEVERAGENTS_VISIBILITY_TIMEOUT_S": "2"}
    proc = _worker(env, "kombu", folder, concurrency=2)
    runs = folder / "runs.txt"
    try:
        wait_until(
            lambda: (folder / "ready").exists() or proc.poll() is not None, 60, "worker ready"
        )
        # When it runs the read to its end
        with SkillClient(redis_url) as client:
            handle = client.submit(
                "test/faults", "test/read", {"path": str(runs), "key": "k", "sleep_s": 10}
            )
            result = handle.result(timeout=60)
        assert result.success, result
        # Then it ran once: kombu's sweep (every second, at most 2 s old) would have handed
        # it out again within 3 s of its start, to the idle pool process
        assert [line.split()[0] for line in runs.read_text().splitlines()] == ["k"]
        log = (folder / "worker.log").read_text()
        (warning,) = [line for line in log.splitlines() if "redis-transport was written" in line]
        assert "raised from CLEVERAGENTS_VISIBILITY_TIMEOUT_S=2 " in warning, warning
    finally:
        _stop(proc)
