"""A Redis restart the worker rides out leaves one warning and one line back, no traceback.

The worker is started as its users start it (``cleveragents worker``, no
``--without-gossip``), on a private redis-server with its append-only file, with
invocations running while Redis is killed and started again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.client import InvocationHandle, SkillClient
from cleveragents.settings import Settings
from tests.conftest import Broker
from tests.support.procs import EXAMPLE_SKILLS, RedisServer, kill_group, wait_until
from tests.support.worker_runs import answered_in, quiet, received_in

pytestmark = pytest.mark.timeout(180)

RESTARTS = 2


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    server = RedisServer(persistence=True).start()
    try:
        yield server
    finally:
        server.stop()


def _ride_out(client: SkillClient, fault: Callable[[], object], log: Callable[[], str]) -> None:
    """``RESTARTS`` times: invocations running and waiting as ``fault`` hits, until the
    worker's ``log`` says it connected again; then every one ends in a success."""
    sent: list[InvocationHandle] = []
    for n in range(RESTARTS):
        batch = [
            client.submit(client.build_request("local/common", "local/sleep", {"seconds": 1.5}))
            for _ in range(4)
        ]
        sent += batch
        wait_until(
            lambda batch=batch: any(client.state(h.request_id) == "STARTED" for h in batch),
            30,
            "an invocation running as the fault hits",
        )
        fault()
        wait_until(lambda n=n: log().count("again, after") > n, 60, "the worker connected again")
    results = [handle.result(timeout=90) for handle in sent]
    assert [r.success for r in results] == [True] * len(sent), [r.error for r in results]
    # And every delivery the worker received is answered, and acknowledged: nothing is left
    # that could still log (an acknowledgement the outage cut off included)
    broker, results_url = client.settings.broker_url, client.settings.result_backend
    assert broker is not None
    assert results_url is not None

    def settled() -> bool:
        text = log()
        done = all(
            received_in(text, h.request_id) == answered_in(text, h.request_id) for h in sent
        )
        return done and quiet(broker, results_url)

    wait_until(settled, 30, "every delivery answered and acknowledged")


def test_a_redis_restart_leaves_one_warning_one_line_back_and_no_traceback(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "CLEVERAGENTS_BROKER_URL": aof_redis.url,
        "CLEVERAGENTS_RESULT_BACKEND": aof_redis.url,
        "CLEVERAGENTS_CATALOGUE": str(EXAMPLE_SKILLS),
        "CLEVERAGENTS_READY_FILE": str(tmp_path / "ready"),
        "CLEVERAGENTS_HOME": str(tmp_path / "home"),
    }
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "cleveragents", "worker", "--concurrency", "2"],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: (tmp_path / "ready").exists() or worker.poll() is not None, 60, "ready")
        assert worker.poll() is None, log_path.read_text()
        client = SkillClient(settings=Settings.from_env(env))

        def restart() -> None:
            aof_redis.stop(signal.SIGKILL)
            time.sleep(3)  # the outage itself, the scenario's length: not a wait for an event
            aof_redis.start()

        # Given invocations running and waiting as Redis goes away; then all succeed
        _ride_out(client, restart, log_path.read_text)
    finally:
        worker.send_signal(signal.SIGTERM)  # as docker stop does: the main process only
        try:
            worker.wait(30)
        finally:
            kill_group(worker, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    # And the log holds, per restart, one warning of the loss and one line back
    assert text.count("consumer: Connection to broker lost") == RESTARTS, text
    assert len(re.findall(r"Connected to .* again, after \d+\.\d s away", text)) == RESTARTS
    # And no traceback, no ERROR line, no gossip or mingle, no deprecation paragraph
    assert "Traceback" not in text, text
    assert not re.search(r"ERROR/|CRITICAL/", text), text
    assert "Gossip" not in text
    assert "mingle" not in text
    assert "CPendingDeprecationWarning" not in text
    assert "Cannot connect to" not in text  # the attempts within a minute are not said


def test_an_ack_the_outage_cut_off_is_one_warning_without_a_traceback() -> None:
    import logging

    from redis.exceptions import ConnectionError as RedisConnectionError

    from cleveragents.worker.reconnect_log import ReconnectLog

    try:
        raise RedisConnectionError("Error 111 connecting")
    except RedisConnectionError as exc:
        record = logging.LogRecord(
            "celery.worker.request", logging.CRITICAL, __file__, 1,
            "Couldn't ack %r, reason:%r", ("tag-1", exc), sys.exc_info(),
        )
    assert ReconnectLog().filter(record)
    assert record.levelname == "WARNING"
    assert record.exc_info is None
    said = record.getMessage()
    assert said.startswith("could not acknowledge message tag-1 (")
    assert "ConnectionError" in said
    assert "): the broker is away; it will be delivered again" in said


def _close_connections(vhost_url: str) -> int:
    """Close every connection of the URL's virtual host, as a broker restart would."""
    vhost = vhost_url.rsplit("/", 1)[1]
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "-p", vhost, "pid"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pids = out.stdout.split()
    assert pids, f"no connection to close in {vhost}"
    for pid in pids:
        subprocess.run(
            ["rabbitmqctl", "-q", "close_connection", pid, "test: broker restart"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    return len(pids)


def test_a_rabbitmq_connection_drop_leaves_no_traceback(
    rabbit_url: str, redis_url: str, start_worker: Any
) -> None:
    worker = start_worker(Broker("rabbitmq", rabbit_url, redis_url))
    client = SkillClient(settings=Settings.from_env(
        {"CLEVERAGENTS_BROKER_URL": rabbit_url, "CLEVERAGENTS_RESULT_BACKEND": redis_url}
    ))  # fmt: skip
    # Given invocations running and waiting as every connection of the vhost drops;
    # then all succeed
    _ride_out(client, lambda: _close_connections(rabbit_url), worker.log_text)
    text = worker.log_text()
    # And the log says each drop and each return, with no traceback and no ERROR line
    assert text.count("consumer: Connection to broker lost") == RESTARTS, text
    assert "Traceback" not in text, text
    assert not re.search(r"ERROR/|CRITICAL/", text), text


@pytest.mark.parametrize(
    ("module", "args", "error"),
    [
        ("celery.bootsteps", ("Error on %s %s: %r", "stopping", "Hub"), BrokenPipeError(32, "x")),
        (
            "celery.worker.loops",
            ("Error cleaning up after event loop: %r",),
            ConnectionResetError(104, "x"),
        ),
    ],
)
def test_closing_what_the_broker_closed_is_not_logged_but_another_error_is(
    module: str, args: tuple[str, ...], error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib
    import inspect

    from cleveragents.worker.reconnect_log import install

    celery_module = importlib.import_module(module)
    # Celery still words it so (else the filter lets it through, and this says so)
    assert args[0] in inspect.getsource(celery_module)
    install()
    logger = celery_module.logger
    for exc in (error, ValueError("a real bug")):
        try:
            raise exc
        except Exception as raised:
            logger.exception(*args, raised)
    said = [r for r in caplog.records if r.name == module]
    # The lost connection's clean-up is dropped; a real bug keeps its ERROR and traceback
    assert len(said) == 1
    assert said[0].levelname == "ERROR"
    assert said[0].exc_info is not None
    assert isinstance(said[0].exc_info[1], ValueError)
