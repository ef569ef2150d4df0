"""Metrics as a Prometheus user reads them (issue 16): every invocation counted, time-outs
told apart by their reason, every catalogue series from zero, promtool's lint, a real
Prometheus scraping the exporter, and the Grafana dashboard's queries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.client import SkillClient
from cleveragents.metrics.recorder import (
    BUCKETS,
    MAX_CACHED_SERIES,
    REASONS,
    ZERO_SERIES,
    MetricsRecorder,
    reason_label,
)
from cleveragents.runtime.outcomes import failed_result
from cleveragents.skills import Catalogue, SkillErrorType, SkillResult
from cleveragents.stores import MemoryMetricStore, MetricCounts
from cleveragents.worker.invocation_report import catalogue_tools
from tests.support.procs import (
    EXAMPLE_SKILLS,
    FIXTURE_SKILLS,
    REPO,
    Worker,
    free_port,
    kill_group,
    process_alive,
    wait_until,
)
from tests.support.prom import Samples, exporter_env, scrape, scrape_text, total, value

pytestmark = pytest.mark.timeout(120)

StartWorker = Callable[..., Worker]
WORDS = {"skill": "local/text-tools", "tool": "local/word-count"}
HANG = {"skill": "test/basic", "tool": "test/hang"}
INVOCATIONS = "cleveragents_invocations_total"
COUNT = "cleveragents_invocation_duration_seconds_count"
BUCKET = "cleveragents_invocation_duration_seconds_bucket"
DASHBOARD = REPO / "grafana" / "cleveragents-dashboard.json"
HOSTILE_SKILLS = REPO / "tests" / "fixtures" / "hostile_tools_skills"


def _ok(seconds: float = 0.002) -> SkillResult:
    return SkillResult(skill_name="s", tool_name="t", success=True, duration_ms=seconds * 1000)


def _failed(details: dict[str, Any] | None) -> SkillResult:
    return failed_result("s", "t", SkillErrorType.TOOL_EXECUTION_FAILURE, "no", details)


# --- the recorder, without a server ----------------------------------------------------


@pytest.mark.parametrize(
    ("result", "label"),
    [
        (_ok(), ""),
        (_failed(None), ""),
        (_failed({"exit_code": 3}), ""),
        (_failed({"reason": "timeout", "timeout_s": 1}), "timeout"),
        (_failed({"reason": "output_too_large"}), "output_too_large"),
        (_failed({"reason": "a reason no one listed"}), "other"),
        (_failed({"reason": {"not": "a string"}}), "other"),
    ],
)
def test_the_reason_label_is_a_known_reason_other_or_empty(result: SkillResult, label: str) -> None:
    assert reason_label(result) == label


def test_every_reason_the_code_gives_is_a_label_of_its_own() -> None:
    # A reason added to the code but not to REASONS would be counted as "other".
    given: set[str] = set()
    for folder in ("cleveragents", "worker", "tasks"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            given.update(re.findall(r'"reason":\s*"([a-z_]+)"', text))
            given.update(re.findall(r'^REASON_[A-Z_]+\s*=\s*"([a-z_]+)"', text, re.M))
    assert "timeout" in given
    assert "request_id_reused" in given
    assert given <= REASONS, given - REASONS


def test_close_adds_what_is_pending_at_once() -> None:
    store = MemoryMetricStore()
    recorder = MetricsRecorder(store)
    recorder.record(_ok())
    recorder.record(_failed({"reason": "timeout"}))
    assert recorder.close(5)
    assert sum(store.totals().invocations.values()) == 2


def test_names_a_producer_makes_up_keep_few_series_keys_and_count_as_unknown() -> None:
    # Given a recorder that knows one tool
    store = MemoryMetricStore()
    recorder = MetricsRecorder(store, lambda skill, tool: (skill, tool) == ("s", "t"))
    # When it counts far more made-up names than it keeps keys for, and the known one
    made_up = MAX_CACHED_SERIES + 100
    for n in range(made_up):
        recorder.record(SkillResult(skill_name=f"s{n}", tool_name="t", success=True))
    recorder.record(_ok())
    recorder.record(_ok())
    assert recorder.close(5)
    # Then its keys stay bounded and every count lands under the right labels
    assert len(recorder._keys) <= MAX_CACHED_SERIES
    counts = {tuple(json.loads(k))[:3]: n for k, n in store.totals().invocations.items()}
    assert counts == {("unknown", "unknown", "success"): made_up, ("s", "t", "success"): 2}


def test_close_gives_up_after_its_wait_when_the_store_does_not_answer() -> None:
    class Stuck(MemoryMetricStore):
        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()

        def add(self, counts: MetricCounts) -> None:
            self.release.wait(30)
            super().add(counts)

    store = Stuck()
    recorder = MetricsRecorder(store)
    recorder.record(_ok())
    started = time.monotonic()
    assert not recorder.close(0.3)
    assert time.monotonic() - started < 2
    store.release.set()


def test_a_forked_child_counts_only_its_own_invocations(tmp_path: Path) -> None:
    class ToFile(MemoryMetricStore):
        def add(self, counts: MetricCounts) -> None:
            out = tmp_path / f"{os.getpid()}.json"
            out.write_text(json.dumps(sum(counts.invocations.values())), encoding="utf-8")

    recorder = MetricsRecorder(ToFile())
    recorder.record(_ok())  # pending in the parent when it forks
    pid = os.fork()
    if pid == 0:  # the child: one invocation of its own
        try:
            recorder.record(_ok())
            recorder.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert json.loads((tmp_path / f"{pid}.json").read_text(encoding="utf-8")) == 1


# --- through a real worker -------------------------------------------------------------


def _stopped_with_sigterm(worker: Worker, whole_group: bool) -> None:
    assert worker.proc is not None
    pool = worker.child_pids()
    if whole_group:  # what systemd's default KillMode does
        kill_group(worker.proc, signal.SIGTERM)
    else:  # what docker stop (through tini) and most supervisors do
        worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(30)
    # Signalled as a group, each pool process flushes its counts on its own, and may
    # still be at it when the main process has gone: done once every process has exited
    wait_until(lambda: not any(process_alive(pid) for pid in pool), 10, "the pool to exit")


@pytest.mark.parametrize("whole_group", [False, True], ids=["worker", "process-group"])
def test_a_worker_stopped_with_sigterm_right_after_its_invocations_has_counted_them_all(
    redis_url: str, start_worker: StartWorker, client: SkillClient, whole_group: bool
) -> None:
    # Given a worker that has just finished N invocations (well inside one flush interval)
    worker = start_worker(redis_url)
    n = 40
    handles = [client.submit(WORDS["skill"], WORDS["tool"], {"text": "a b"}) for _ in range(n)]
    assert all(h.result(30).success for h in handles)
    # When it is stopped with SIGTERM (a warm shutdown)
    _stopped_with_sigterm(worker, whole_group)
    # Then every one of them was counted, with no wait for a flush
    samples = scrape(redis_url)
    assert total(samples, INVOCATIONS, **WORDS) == n
    assert total(samples, COUNT, **WORDS) == n


def test_a_time_out_is_counted_with_its_reason_and_apart_from_quick_failures(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url)
    timed_out = client.submit(HANG["skill"], HANG["tool"], {"seconds": 30}, timeout_s=0.3)
    quick = client.submit(HANG["skill"], HANG["tool"], {"no_such_argument": 1})
    ran = client.submit(HANG["skill"], HANG["tool"], {"seconds": 0.05})
    result = timed_out.result(30)
    assert result.error is not None
    assert result.error.details["reason"] == "timeout"
    quick_error = quick.result(30).error
    assert quick_error is not None
    assert "reason" not in quick_error.details
    assert ran.result(30).success
    _stopped_with_sigterm(worker, whole_group=False)
    samples = scrape(redis_url)
    execution = {**HANG, "outcome": "failure", "error_type": "tool_execution_failure"}
    assert value(samples, INVOCATIONS, **execution, reason="timeout") == 1
    assert value(samples, INVOCATIONS, **execution, reason="") == 1
    assert value(samples, INVOCATIONS, **HANG, outcome="success", error_type="", reason="") == 1
    # The histogram has the outcome: failures are not mixed with real runs
    assert value(samples, COUNT, **HANG, outcome="failure") == 2
    assert value(samples, COUNT, **HANG, outcome="success") == 1
    assert value(samples, BUCKET, **HANG, outcome="failure", le="0.1") == 1  # the quick one
    assert value(samples, BUCKET, **HANG, outcome="failure", le="0.25") == 1
    assert value(samples, BUCKET, **HANG, outcome="failure", le="0.5") == 2  # and the time-out
    assert value(samples, BUCKET, **HANG, outcome="success", le="0.01") == 0
    assert value(samples, BUCKET, **HANG, outcome="success", le="0.1") == 1


def test_a_fresh_exporter_shows_every_catalogue_tool_at_zero_before_any_invocation(
    redis_url: str, start_worker: StartWorker
) -> None:
    # Given a worker that has started, and no invocation yet
    start_worker(redis_url)
    samples = scrape(redis_url)
    # Then every tool of its catalogue has each series at zero, so the first invocation
    # is an increase that increase() and rate() see
    tools = catalogue_tools(Catalogue.from_paths(FIXTURE_SKILLS, EXAMPLE_SKILLS))
    assert (WORDS["skill"], WORDS["tool"]) in tools
    for skill, tool in tools:
        names = {"skill": skill, "tool": tool}
        for outcome, error, reason in ZERO_SERIES:
            labels = {**names, "outcome": outcome, "error_type": error, "reason": reason}
            key = (INVOCATIONS, tuple(sorted(labels.items())))
            assert samples.get(key) == 0, key
        for outcome in ("success", "failure"):
            key = (COUNT, tuple(sorted({**names, "outcome": outcome}.items())))
            assert samples.get(key) == 0, key
            key = (BUCKET, tuple(sorted({**names, "outcome": outcome, "le": "+Inf"}.items())))
            assert samples.get(key) == 0, key


@pytest.mark.slow
def test_an_invocation_ended_by_the_hard_time_limit_is_counted_by_the_worker(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a tool that nothing in its pool process can stop (1 s timeout, 6 s hard limit)
    start_worker(redis_url, CLEVERAGENTS_CATALOGUE=str(HOSTILE_SKILLS))
    names = {"skill": "test/hostile-tools", "tool": "test/unstoppable"}
    result = client.submit(names["skill"], names["tool"]).result(timeout=60)
    assert result.error is not None
    assert result.error.details["reason"] == "timeout"
    # Then the worker's main process, which ended it, counted it as a time-out
    labels = {**names, "outcome": "failure", "error_type": "tool_execution_failure"}

    def counted() -> bool:
        return value(scrape(redis_url), INVOCATIONS, **labels, reason="timeout") == 1

    wait_until(counted, 20, "the hard time-out in the metrics", interval=0.5)
    samples = scrape(redis_url)
    assert value(samples, COUNT, **names, outcome="failure") == 1
    assert value(samples, BUCKET, **names, outcome="failure", le="5.0") == 0
    assert value(samples, BUCKET, **names, outcome="failure", le="10.0") == 1


# --- promtool, a real Prometheus and the dashboard -------------------------------------


def _some_invocations(client: SkillClient) -> None:
    handles = [client.submit(WORDS["skill"], WORDS["tool"], {"text": "a b"}) for _ in range(5)]
    handles += [client.submit(WORDS["skill"], WORDS["tool"], {"text": 5}) for _ in range(2)]
    handles.append(client.submit(HANG["skill"], HANG["tool"], {"seconds": 30}, timeout_s=0.2))
    handles.append(client.submit("no/such-skill", "no/tool"))
    for handle in handles:
        handle.result(30)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_finds_nothing_to_complain_about(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url)
    _some_invocations(client)
    _stopped_with_sigterm(worker, whole_group=False)
    text = scrape_text(redis_url)
    assert 'reason="timeout"' in text
    assert 'skill="unknown"' in text
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == ""
    assert checked.stderr.strip() == ""


def _dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries


def _families(samples: Samples) -> dict[str, set[str]]:
    """Every sample name the exporter serves, with the label names it carries."""
    found: dict[str, set[str]] = {}
    for name, labels in samples:
        found.setdefault(name, set()).update(label for label, _ in labels)
    return found


def test_the_dashboard_queries_only_metrics_and_labels_the_exporter_serves(
    redis_url: str, start_worker: StartWorker
) -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert board["uid"]
    assert board["title"]
    assert board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    start_worker(redis_url)  # its catalogue's series, at zero
    served = _families(scrape(redis_url))
    for query in _dashboard_queries():
        names = set(re.findall(r"\bcleveragents_[a-z_]+\b", query))
        assert names, query
        assert names <= set(served), (query, names - set(served))
        labels = set().union(*(served[name] for name in names))
        used = {
            label.strip()
            for group in re.findall(r"\bby \(([^)]*)\)", query)
            for label in group.split(",")
        }
        used |= set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"", query))
        used |= set(re.findall(r", ([a-z_]+)\)$", query))  # label_values(metric, label)
        assert used <= labels, (query, used - labels)


@pytest.fixture
def exporter(redis_url: str) -> Iterator[int]:
    """``cleveragents metrics`` serving on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "metrics", "--port", str(port)],
        env=exporter_env(redis_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: _get(f"http://127.0.0.1:{port}/metrics") is not None, 20, "exporter")
        yield port
    finally:
        kill_group(proc)
        proc.wait(10)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read())
    except OSError:
        return None


class Prometheus:
    """A real Prometheus server that scrapes one target every second."""

    def __init__(self, target_port: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cleveragents-prometheus-"))
        self.port = free_port()
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: cleveragents\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n",
            encoding="utf-8",
        )
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", (promql, answer)
        return list(answer["data"]["result"])

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def scraped(self) -> bool:
        """True once the server runs and has scraped its target."""
        try:
            return self.scalar('up{job="cleveragents"} == 1') == 1
        except OSError:
            return False

    def stop(self) -> None:
        kill_group(self.proc)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed")
def test_a_real_prometheus_scrapes_exact_counts_and_answers_every_dashboard_query(
    redis_url: str, start_worker: StartWorker, client: SkillClient, exporter: int
) -> None:
    worker = start_worker(redis_url)
    prometheus = Prometheus(exporter)
    try:
        wait_until(prometheus.scraped, 30, "Prometheus to scrape the exporter", interval=0.2)
        # When invocations run and their worker stops
        _some_invocations(client)
        _stopped_with_sigterm(worker, whole_group=False)
        # Then what Prometheus stores is exactly what ran
        words = f'skill="{WORDS["skill"]}", tool="{WORDS["tool"]}"'
        wanted = {
            f"sum(cleveragents_invocations_total{{{words}}})": 7.0,
            f'sum(cleveragents_invocations_total{{{words}, outcome="failure"}})': 2.0,
            'sum(cleveragents_invocations_total{reason="timeout"})': 1.0,
            'sum(cleveragents_invocations_total{skill="unknown"})': 1.0,
            f"sum(cleveragents_invocation_duration_seconds_count{{{words}}})": 7.0,
        }

        def stored() -> bool:
            return all(prometheus.scalar(q) == n for q, n in wanted.items())

        wait_until(stored, 20, f"Prometheus to store {wanted}", interval=0.5)
        # And every query of the dashboard is valid PromQL that finds series (the scrapes
        # from before the invocations put two samples in every rate() window)
        for query in _dashboard_queries():
            promql = (
                query.replace("$__rate_interval", "15s")
                .replace("$__range", "1m")
                .replace("$skill", ".*")
                .replace("$tool", ".*")
            )
            if promql.startswith("label_values("):
                metric = promql[len("label_values(") :].rsplit(",", 1)[0]
                assert prometheus.query(metric), query
                continue
            assert prometheus.query(promql), query
    finally:
        prometheus.stop()


def test_the_buckets_in_the_operations_guide_are_the_exporters() -> None:
    doc = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    listed = ", ".join(f"{b:g}" for b in BUCKETS)
    assert listed in doc, listed
