"""The metrics package's two halves: a worker's recorder without ``prometheus_client``, and the
exporter's WSGI app (the page, its format whatever is asked, 404 and 503), called in process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import cleveragents.metrics
from cleveragents.metrics import exporter, recorder
from tests.support.procs import REPO, free_port
from tests.support.prom import parse, value


def _get(app: Any, path: str, accept: str = "") -> tuple[str, dict[str, str], bytes]:
    answered: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answered.update(status=status, headers=dict(headers))

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": ""}
    if accept:
        environ["HTTP_ACCEPT"] = accept
    body: Iterable[bytes] = app(environ, start_response)
    return answered["status"], answered["headers"], b"".join(body)


def test_the_package_keeps_its_names_and_a_worker_never_loads_prometheus_client() -> None:
    for name in cleveragents.metrics.__all__:
        assert getattr(cleveragents.metrics, name) is getattr(
            recorder if name in recorder.__all__ else exporter, name
        )
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, cleveragents.worker.invocation_report; "
            "print(sorted(m for m in sys.modules if m.startswith(('prometheus_client', "
            "'cleveragents.metrics.exporter'))))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_the_app_serves_the_classic_text_format_even_to_an_openmetrics_scraper(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    app = exporter.metrics_app(client)
    openmetrics = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.3"
    for path in ("/metrics", "/"):
        status, headers, body = _get(app, path, accept=openmetrics)
        assert status == "200 OK"
        assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = body.decode()
        assert "# TYPE cleveragents_invocations_total counter\n" in text
        assert "_created" not in text
        assert "process_" not in text
        assert "# EOF" not in text
        assert value(parse(text), "cleveragents_queue_length", queue="skills.read") == 0
    client.close()


def test_another_path_is_a_404_and_a_redis_that_does_not_answer_a_503() -> None:
    away = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
    app = exporter.metrics_app(away)
    status, _, _ = _get(app, "/other")
    assert status == "404 Not Found"
    status, _, body = _get(app, "/metrics")
    assert status == "503 Service Unavailable"
    assert body.startswith(b"Redis: ")
