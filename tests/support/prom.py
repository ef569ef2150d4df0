"""Reading ``cleveragents metrics`` as Prometheus does: run the exporter, parse its text."""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import REPO

#: One scrape: (sample name, its sorted labels) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def exporter_env(url: str, backend: str | None = None) -> dict[str, str]:
    """The environment of an exporter on the broker at ``url`` (results: ``backend``)."""
    env = {**os.environ, "CLEVERAGENTS_BROKER_URL": url, "PYTHONPATH": str(REPO)}
    if backend is not None:
        env["CLEVERAGENTS_RESULT_BACKEND"] = backend
    return env


def scrape_text(url: str, backend: str | None = None) -> str:
    """What ``cleveragents metrics --once`` prints for the broker at ``url``."""
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "metrics", "--once"],
        env=exporter_env(url, backend),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def parse(text: str) -> Samples:
    """Every sample of an exposition, by name and labels."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def scrape(url: str, backend: str | None = None) -> Samples:
    """Every sample the exporter serves for the broker at ``url`` (results: ``backend``)."""
    return parse(scrape_text(url, backend))


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels (0 when there is none)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= set(got))
