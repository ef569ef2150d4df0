"""RabbitMQ over TLS: an ``amqps://`` URL carries the CA its nodes' certificates are
checked against (``?ssl_ca_certs=...``, as ``rediss://`` does), and a node whose
certificate that CA did not sign is refused in one line (``broker/url_tls.py``).

The machine's RabbitMQ behind a TLS proxy (``tests/support/tls_proxy.py``) with a
certificate signed by a CA the test makes; a real worker and producer on the URL.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.support.procs import REPO, Worker
from tests.support.rig_ca import RigCA, make_ca
from tests.support.tls_proxy import tls_proxy
from tests.support.worker_runs import clean_env

pytestmark = pytest.mark.timeout(120)

StartWorker = Callable[..., Worker]


@pytest.fixture
def amqps_node(rabbit_url: str, tmp_path: Path) -> Iterator[tuple[RigCA, str]]:
    """The test's virtual host behind TLS: the CA, and the ``amqps://`` URL without it."""
    ca = make_ca(tmp_path / "ca", names=["localhost"], addresses=["127.0.0.1"])
    plain = urlsplit(rabbit_url)
    with tls_proxy(ca, (plain.hostname or "127.0.0.1", plain.port or 5672)) as port:
        yield ca, f"amqps://guest:guest@localhost:{port}{plain.path}"


def test_a_fleet_on_amqps_checks_each_node_against_the_ca_its_url_names(
    amqps_node: tuple[RigCA, str], redis_url: str, start_worker: StartWorker
) -> None:
    # Given a worker and a producer on an amqps:// URL that names the CA
    ca, url = amqps_node
    broker = f"{url}?ssl_ca_certs={ca.ca}&ssl_cert_reqs=required"
    start_worker(broker, CLEVERAGENTS_RESULT_BACKEND=redis_url)
    env = {"CLEVERAGENTS_BROKER_URL": broker, "CLEVERAGENTS_RESULT_BACKEND": redis_url}
    # When an invocation is sent over it
    with SkillClient(settings=Settings.from_env(env)) as client:
        result = client.submit("local/text-tools", "local/word-count", {"text": "a b c"}).result(
            timeout=60
        )
    # Then it is served: the CA checked the node's certificate, host name included
    assert result.success, result
    assert result.output_data == {"words": 3}


def test_a_node_the_ca_did_not_sign_is_refused_in_one_line(
    amqps_node: tuple[RigCA, str], redis_url: str, tmp_path: Path
) -> None:
    # Given an amqps:// URL naming another CA than the one that signed the node's certificate
    _, url = amqps_node
    other = make_ca(tmp_path / "other", names=["localhost"], addresses=["127.0.0.1"])
    env = {"CLEVERAGENTS_BROKER_URL": f"{url}?ssl_ca_certs={other.ca}",
           "CLEVERAGENTS_RESULT_BACKEND": redis_url,
           "CLEVERAGENTS_HOME": str(tmp_path / "home")}
    # When a command is run on it
    done = _submit(env)
    # Then it exits 2 (a broker it cannot use) with one line that says the node's
    # certificate was not trusted and what to check
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "certificate verify failed" in lines[0], lines[0]
    assert "not trusted over TLS" in lines[0]
    assert "ssl_ca_certs in CLEVERAGENTS_BROKER_URL" in lines[0]


def test_an_unknown_tls_parameter_is_named_in_one_line(
    amqps_node: tuple[RigCA, str], redis_url: str, tmp_path: Path
) -> None:
    _, url = amqps_node
    env = {"CLEVERAGENTS_BROKER_URL": f"{url}?ssl_ca_cert=/tmp/ca.pem",
           "CLEVERAGENTS_RESULT_BACKEND": redis_url, "CLEVERAGENTS_HOME": str(tmp_path / "h")}
    done = _submit(env)
    assert done.returncode != 0, done
    assert done.stderr.strip().splitlines() == [
        "error: CLEVERAGENTS_BROKER_URL: unknown TLS parameter 'ssl_ca_cert' in an amqps:// "
        "URL; it takes ssl_ca_certs, ssl_cert_reqs, ssl_certfile, ssl_keyfile"
    ], done.stderr


def _submit(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cleveragents submit`` of a word count under ``env``, run from the checkout."""
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", "local/text-tools", "local/word-count",
         "--args", '{"text": "a"}'],
        env={**clean_env(), **env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
