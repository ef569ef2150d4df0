"""Structured logs and Prometheus metrics from real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cleveragents.client import SkillClient
from cleveragents.metrics.recorder import FLUSH_S
from tests.support.procs import REPO, Worker, free_port, kill_group, wait_until
from tests.support.prom import Samples
from tests.support.prom import scrape as _metrics
from tests.support.prom import value as _value

pytestmark = pytest.mark.timeout(180)

StartWorker = Callable[..., Worker]
SECRET = "sk-observe-me-not-1234"


TOTAL = "cleveragents_invocations_total"
DURATION_COUNT = "cleveragents_invocation_duration_seconds_count"


def _total(samples: Samples, name: str) -> float:
    """The sum of every series of ``name``."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


def test_metrics_count_invocations_by_skill_tool_and_error_type(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    start_worker(redis_url)
    for text in ("a", "a b", "a b c"):
        assert client.submit("local/text-tools", "local/word-count", {"text": text}).result(30)
    for _ in range(2):
        client.submit("local/text-tools", "local/word-count", {"text": 5}).result(30)
    client.submit("local/notes", "local/write-note", {"name": "n", "text": "t"}).result(30)
    # The workers' counters reach Redis every FLUSH_S: wait for all six invocations, in the
    # counter and in the histogram
    scraped: list[Samples] = []

    def all_counted() -> bool:
        scraped.append(_metrics(redis_url))
        return all(_total(scraped[-1], name) == 6 for name in (TOTAL, DURATION_COUNT))

    wait_until(all_counted, FLUSH_S + 30, "the counters to be flushed", interval=0.2)
    samples = scraped[-1]
    words = {"skill": "local/text-tools", "tool": "local/word-count"}
    invocations = "cleveragents_invocations_total"
    assert _value(samples, invocations, **words, outcome="success", error_type="", reason="") == 3
    assert (
        _value(
            samples,
            invocations,
            **words,
            outcome="failure",
            error_type="validation_error",
            reason="",
        )
        == 2
    )
    assert (
        _value(
            samples,
            invocations,
            skill="local/notes",
            tool="local/write-note",
            outcome="failure",
            error_type="permission_denied",
            reason="",
        )
        == 1
    )
    # The histogram keeps quick refusals apart from real runs
    count = "cleveragents_invocation_duration_seconds_count"
    assert _value(samples, count, **words, outcome="success") == 3
    assert _value(samples, count, **words, outcome="failure") == 2
    bucket = "cleveragents_invocation_duration_seconds_bucket"
    assert _value(samples, bucket, **words, outcome="success", le="+Inf") == 3
    duration_sum = "cleveragents_invocation_duration_seconds_sum"
    assert _value(samples, duration_sum, **words, outcome="success") > 0


def test_queue_length_and_oldest_age_show_waiting_work(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a read-only worker: writes wait in their queue, unconsumed
    start_worker(redis_url, read_only=True)
    for i in range(3):
        client.submit(
            "local/notes", "local/write-note", {"name": f"n{i}", "text": "t"}, allow_writes=True
        )
    # Not a wait for an event: the age reported is the clock itself (the oldest write must
    # have waited a second)
    time.sleep(1.2)
    samples = _metrics(redis_url)
    assert _value(samples, "cleveragents_queue_length", queue="skills.write") == 3
    assert _value(samples, "cleveragents_queue_oldest_age_seconds", queue="skills.write") >= 1.0
    assert _value(samples, "cleveragents_queue_length", queue="skills.read") == 0


def test_the_exporter_serves_metrics_over_http(redis_url: str) -> None:
    port = free_port()
    env = {**os.environ, "CLEVERAGENTS_BROKER_URL": redis_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cleveragents",
            "metrics",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(up, 20, "the exporter")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        names = {f.name for f in text_string_to_metric_families(body)}
        assert {"cleveragents_queue_length", "cleveragents_queue_oldest_age_seconds"} <= names
    finally:
        kill_group(proc)
        proc.wait(10)


def test_one_json_log_line_per_invocation_without_arguments_or_outputs(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url, CLEVERAGENTS_LOG_FORMAT="json")
    ok = client.submit("local/text-tools", "local/shout", {"text": SECRET})
    bad = client.submit("local/text-tools", "local/word-count", {"text": [SECRET]})
    assert ok.result(30).output_data == {"text": SECRET.upper()}
    assert bad.result(30).error is not None

    def lines() -> list[dict[str, object]]:
        found = []
        for line in worker.log_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("logger") == "cleveragents.invocations":
                    found.append(record)
        return found

    wait_until(lambda: len(lines()) >= 2, 20, "two invocation log lines")
    by_id = {record["request_id"]: record for record in lines()}
    assert by_id[ok.request_id]["outcome"] == "success"
    assert by_id[ok.request_id]["skill"] == "local/text-tools"
    assert by_id[ok.request_id]["tool"] == "local/shout"
    assert by_id[bad.request_id]["error_type"] == "validation_error"
    assert float(by_id[bad.request_id]["duration_ms"]) >= 0  # type: ignore[arg-type]
    log = worker.log_text()
    assert SECRET not in log
    assert SECRET.upper() not in log
