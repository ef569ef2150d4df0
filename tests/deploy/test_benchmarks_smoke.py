"""The side-by-side benchmark runs end to end at small sizes and prints its table.

Timings are not asserted: the machine is shared and noisy; the benchmark itself
prints the ratios (``benchmarks/compare.py``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support.procs import REPO

pytestmark = pytest.mark.slow


def test_compare_runs_every_available_system_and_prints_the_table() -> None:
    # Given only what is installed (Dramatiq is the optional bench extra)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    # When the comparison runs at its smoke-test sizes, one round
    proc = subprocess.run(
        [sys.executable, "benchmarks/compare.py", "--quick", "--rounds", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    # Then it succeeds and every system has its row, with its ratio to its baseline
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "jobs/s (round 1)" in out
    rows = {
        "plain Celery (defaults)": "baseline",
        "plain Celery, task events on": "x plain",
        "Celery chunks(..., 100)": "baseline",
        "Celery chunks of 100, each result stored and written in order": "x chunks",
        "cleveragents SkillClient.submit().result()": "x plain",
        "cleveragents batch run, 2,000 lines": "x chunks",
        "cleveragents batch run, slow tool": "x ideal",
    }
    if importlib.util.find_spec("dramatiq") is not None:
        rows["Dramatiq (2 processes x 8 threads)"] = "x plain"
    else:
        assert "dramatiq is not installed" in out
    lines = out.splitlines()
    for label, ratio in rows.items():
        row = [line for line in lines if line.startswith(label)]
        assert row, f"no row for {label!r} in:\n{out}"
        assert ratio in row[0], row[0]
    for verdict in ("singles: ", "singles against plain Celery with task events on", "batch: ",
                    "slow batch: ",
                    "chunks that store every result and write it in order: ",
                    "paired round trips, 20 each, in turns: singles p50",
                    "x events", "(paired; target <= 1.15)"):
        assert verdict in out


def _ablated(probe: str, ablate: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``probe`` with the ablation folder first on the path, as compare.py --ablate
    puts it, and ``BENCH_ABLATE=ablate``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    clean["PYTHONPATH"] = f"{REPO / 'benchmarks' / 'ablate'}{os.pathsep}{REPO}"
    return subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={**clean, **env, "BENCH_ABLATE": ablate},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ablations_change_only_what_they_name_and_only_where_asked() -> None:
    probe = (
        "import sys, cleveragents.runtime.invoke, cleveragents.runtime.kinds.python;"
        "m = sys.modules;"
        "i, p = m['cleveragents.runtime.invoke'], m['cleveragents.runtime.kinds.python'];"
        "print(i.validate is m['cleveragents.runtime.validation'].validate,"
        " p.call_with_deadline.__module__)"
    )

    def run(ablate: str) -> subprocess.CompletedProcess[str]:
        return _ablated(probe, ablate)

    # When nothing is named, nothing changes; when "schema" is, only validation goes
    assert run("").stdout.split() == ["True", "cleveragents.runtime.deadline"]
    assert run("schema").stdout.split() == ["False", "cleveragents.runtime.deadline"]
    # And a name it does not know stops the process, naming those it knows
    unknown = run("schema,speed")
    assert unknown.returncode != 0
    assert (
        "unknown ['speed']; known: bind, lookups, schema, deadline, observe, transport"
        in unknown.stderr
    )


def test_the_transport_ablation_leaves_the_worker_on_kombus_transport_and_celerys_backend() -> None:
    probe = (
        "from cleveragents.settings import Settings;"
        "from cleveragents.worker import startup;"
        "print(startup.consumer_transport(Settings.from_env()),"
        " startup.worker_result_backend('redis://127.0.0.1:1/0'))"
    )

    def run(ablate: str) -> list[str]:
        url = "redis://127.0.0.1:1/0"
        return _ablated(probe, ablate, CLEVERAGENTS_BROKER_URL=url).stdout.split()

    assert run("") == [
        "cleveragents.broker.redis.transport:Transport",
        "cleveragents.broker.redis.result_backend:RedisBackend+redis://127.0.0.1:1/0",
    ]
    assert run("transport") == ["None", "None"]
