"""Redis Sentinel over TLS, from the URLs alone: ``sentinel://...?ssl_ca_certs=...``.

The fleet here (``tests/support/sentinel.py`` with ``tls``) has no plain port: its
servers, replication and Sentinels speak TLS only, checked against a CA it makes. The
failover over TLS is ``test_sentinel_follow.py``'s (its ``tls`` case).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import worker_env
from tests.support.procs import REPO, Worker
from tests.support.sentinel import SentinelFleet, sentinel_fleet
from tests.support.worker_runs import clean_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fleet() -> Iterator[SentinelFleet]:
    with sentinel_fleet(tls=True) as made:
        yield made


def test_a_worker_and_the_cli_serve_on_a_sentinel_fleet_over_tls(
    fleet: SentinelFleet, tmp_path: Path
) -> None:
    # Given a worker on the TLS fleet's URL
    env = {"CLEVERAGENTS_HOME": str(tmp_path / "home")}
    worker = Worker({**worker_env(fleet.url), **env}).start()
    try:
        # When `cleveragents submit --wait` sends it an invocation, and `metrics` reads
        run = {**env, "CLEVERAGENTS_BROKER_URL": fleet.url}
        done = _cli(run, "submit", "local/text-tools", "local/word-count",
                    "--args", '{"text": "a b"}', "--wait")
        metrics = _cli(run, "metrics", "--once")
    finally:
        worker.stop()
    # Then both were served over TLS (there is no other way in)
    assert done.returncode == 0, (done.stderr, worker.log_text()[-2000:])
    assert '"words": 2' in done.stdout, done.stdout
    assert metrics.returncode == 0, metrics.stderr
    assert 'outcome="success"' in metrics.stdout, metrics.stdout[-2000:]


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("ssl_ca_cert=/ca.pem", "unknown TLS parameter 'ssl_ca_cert' in a sentinel:// URL"),
        ("ssl_ca_certs=/other.pem", "the sentinel:// URLs of the list give different ssl_*"),
    ],
    ids=["unknown", "disagreeing"],
)
def test_tls_parameters_a_fleet_cannot_use_are_named_in_one_line(
    fleet: SentinelFleet, tmp_path: Path, query: str, said: str
) -> None:
    url = f"{fleet.url};sentinel://127.0.0.1:1/0?{query}"
    done = _cli({"CLEVERAGENTS_HOME": str(tmp_path / "h"), "CLEVERAGENTS_BROKER_URL": url},
                "submit", "local/text-tools", "local/word-count", "--args", '{"text": "a"}')
    assert done.returncode != 0, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: CLEVERAGENTS_BROKER_URL: "), line
    assert said in line, line


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        env={**clean_env(), **env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True,
        text=True, timeout=90, check=False,
    )  # fmt: skip
