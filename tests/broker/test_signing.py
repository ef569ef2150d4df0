"""Message signing: only messages signed by a trusted key run (docs/security.md).

Keys and self-signed certificates are made in a temporary folder with the
``cryptography`` package: a pair for producers and one for workers, both
certificates in one store, and an outsider's pair that the store does not hold.
Attacks are sent the way someone with broker access would send them (raw kombu,
or a Celery app of their own) to a real worker on a real Redis; a write tool that
appends a line per run shows whether anything ran.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kombu
import pytest
from celery import Celery
from celery.security.certificate import Certificate
from celery.security.key import PrivateKey
from celery.security.serialization import SecureSerializer
from celery.utils.serialization import b64decode, b64encode
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kombu.serialization import registry  # type: ignore[attr-defined]

from cleveragents.broker.signing import (
    DIGEST,
    ENVELOPE_SEPARATOR,
    SIGNED_CONTENT_TYPE,
    SIGNED_SERIALIZER,
    check_signing,
    register_signing,
)
from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_READ, TASK_INVOKE
from cleveragents.errors import ConfigurationError
from cleveragents.settings import SIGNING_VARIABLES, MessageSigning, Settings
from cleveragents.skills import SkillErrorType
from tests.support.procs import REPO, Worker

pytestmark = pytest.mark.timeout(240)

StartWorker = Callable[..., Worker]
_NO_LINKS = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@dataclass(frozen=True)
class Pair:
    """A private key and its self-signed certificate, as PEM files."""

    key: Path
    cert: Path


@dataclass(frozen=True)
class Keys:
    """Everything the tests sign with: two trusted pairs, their store, and an outsider."""

    producer: Pair
    worker: Pair
    store: Path
    outsider: Pair

    def env(self, pair: Pair) -> dict[str, str]:
        """The signing settings of a process that signs with ``pair``."""
        return dict(zip(SIGNING_VARIABLES, (str(pair.key), str(pair.cert), str(self.store)),
                        strict=True))

    def signing(self, pair: Pair) -> MessageSigning:
        signing = MessageSigning.from_env(self.env(pair))
        assert signing is not None
        return signing


def _make_pair(folder: Path, name: str, *, days: float = 30) -> Pair:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    pair = Pair(folder / f"{name}.key", folder / f"{name}.pem")
    pair.key.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """Producer and worker pairs with both certificates in one store; an outsider's pair."""
    root = tmp_path_factory.mktemp("signing")
    producer = _make_pair(root / "keys", "producer")
    worker = _make_pair(root / "keys", "worker")
    store = root / "store"
    store.mkdir()
    for pair in (producer, worker):
        (store / pair.cert.name).write_bytes(pair.cert.read_bytes())
    return Keys(producer, worker, store, _make_pair(root / "outsider", "outsider"))


@pytest.fixture
def signed_client(redis_url: str, keys: Keys) -> Iterator[SkillClient]:
    """A producer that signs with the producers' key."""
    env = {"CLEVERAGENTS_BROKER_URL": redis_url, **keys.env(keys.producer)}
    with SkillClient(settings=Settings.from_env(env)) as producer:
        yield producer


@pytest.fixture
def signing_worker(redis_url: str, start_worker: StartWorker, keys: Keys) -> Worker:
    """A real worker that signs with the workers' key and runs only signed messages."""
    return start_worker(redis_url, **keys.env(keys.worker))


def _write_request(request_id: str, target: Path) -> dict[str, Any]:
    return {"request_id": request_id, "skill": "test/basic", "tool": "test/count-write",
            "arguments": {"path": str(target)}, "allow_writes": True, "timeout_s": None}


def _sign(pair: Pair, data: Any, *, as_cert: Path | None = None, inner: str = "json") -> bytes:
    """Data signed the way Celery's auth serializer signs it (optionally claiming another cert)."""
    signer = SecureSerializer(
        PrivateKey(pair.key.read_text()),
        Certificate((as_cert or pair.cert).read_text()),
        None,
        DIGEST,
        serializer=inner,
    )
    return signer.serialize(data)


def _publish(url: str, body: bytes, task_id: str, content_type: str = SIGNED_CONTENT_TYPE) -> None:
    exchange = kombu.Exchange(QUEUE_READ, type="direct")
    headers = {"lang": "py", "task": TASK_INVOKE, "id": task_id, "root_id": task_id,
               "parent_id": None, "group": None}
    with kombu.Connection(url) as conn:
        conn.Producer().publish(
            body, exchange=exchange, routing_key=QUEUE_READ, headers=headers,
            content_type=content_type, content_encoding="utf-8",
            declare=[kombu.Queue(QUEUE_READ, exchange, routing_key=QUEUE_READ)],
        )


def _refusal(client: SkillClient, request_id: str) -> str:
    result = client.wait(request_id, timeout=60)
    assert result.error is not None, result
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR, result.error
    return result.error.message


def test_a_signed_request_runs_on_a_signing_worker(
    signing_worker: Worker, signed_client: SkillClient, tmp_path: Path
) -> None:
    target = tmp_path / "writes.txt"
    read = signed_client.submit("local/text-tools", "local/word-count", {"text": "a b c"})
    write = signed_client.submit("test/basic", "test/count-write", {"path": str(target)},
                                 allow_writes=True)
    assert read.result(timeout=60).output_data == {"words": 3}
    assert write.result(timeout=60).success
    assert target.read_text() == "ran\n"
    assert "rejected message" not in signing_worker.log_text()


def test_a_signed_batch_runs_and_the_chunks_a_worker_requeues_are_signed_by_the_worker(
    signing_worker: Worker, signed_client: SkillClient, tmp_path: Path
) -> None:
    # Given one chunk of requests that take 5 ms each: the worker runs 20 ms of it and
    # requeues the rest as a new message, which it signs with its own key
    tally = tmp_path / "tally.txt"
    requests = [
        {"request_id": f"batch-{i}", "skill": "test/batch", "tool": "test/tally",
         "arguments": {"path": str(tally), "key": str(i), "sleep_s": 0.005}}
        for i in range(120)
    ]
    # When they run through the batch path
    results = list(signed_client.batches.run_many(requests, chunk_size=200))
    # Then every one ran once, in chunks the worker requeued, none refused
    assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
    assert sorted(tally.read_text().split(), key=int) == [str(i) for i in range(120)]
    log = signing_worker.log_text()
    assert len(re.findall(r"Task skills\.invoke_chunk\[[^\]]+\] received", log)) >= 2
    assert "rejected message" not in log


@pytest.mark.parametrize("sender", ["raw kombu", "an unsigned Celery app"])
def test_a_plain_json_request_is_refused_and_never_runs(
    sender: str, redis_url: str, signing_worker: Worker, signed_client: SkillClient,
    tmp_path: Path,
) -> None:
    target = tmp_path / "writes.txt"
    task_id = f"plain-{uuid.uuid4()}"
    request = _write_request(task_id, target)
    if sender == "raw kombu":
        body = json.dumps([[request], {}, _NO_LINKS]).encode()
        _publish(redis_url, body, task_id, content_type="application/json")
    else:
        attacker = Celery("attacker", broker=redis_url, backend=redis_url, set_as_current=False)
        attacker.conf.task_serializer = "json"
        attacker.send_task(TASK_INVOKE, args=[request], task_id=task_id, queue=QUEUE_READ)
    assert "signed messages only" in _refusal(signed_client, task_id)
    assert not target.exists()


@pytest.mark.parametrize(
    "forgery", ["an unknown key", "another key claiming a trusted certificate", "a changed body"]
)
def test_a_wrongly_signed_request_is_refused_and_never_runs(
    forgery: str, redis_url: str, keys: Keys, signing_worker: Worker,
    signed_client: SkillClient, tmp_path: Path,
) -> None:
    target = tmp_path / "writes.txt"
    task_id = f"forged-{uuid.uuid4()}"
    body = [[_write_request(task_id, target)], {}, _NO_LINKS]
    if forgery == "an unknown key":
        signed = _sign(keys.outsider, body)
    elif forgery == "another key claiming a trusted certificate":
        signed = _sign(keys.outsider, body, as_cert=keys.producer.cert)
    else:  # a producer's genuine message, its body changed on the way
        genuine = _sign(keys.producer, [[_write_request(task_id, tmp_path / "x.txt")], {}, {}])
        fields = b64decode(genuine).split(ENVELOPE_SEPARATOR, 4)
        fields[4] = fields[4].replace(b"x.txt", b"writes.txt")
        signed = b64encode(ENVELOPE_SEPARATOR.join(fields))
    _publish(redis_url, signed, task_id)
    assert "signature does not verify" in _refusal(signed_client, task_id)
    assert not target.exists()
    assert not (tmp_path / "x.txt").exists()


def test_a_signed_request_sent_again_under_another_task_id_is_refused(
    redis_url: str, keys: Keys, signing_worker: Worker, signed_client: SkillClient,
    tmp_path: Path,
) -> None:
    # Given a genuine signed write request for one id, captured from the broker
    target = tmp_path / "writes.txt"
    signed = _sign(keys.producer, [[_write_request("the-signed-id", target)], {}, _NO_LINKS])
    # When it is sent under another task id (Celery signs the body, not the headers)
    replay = f"replay-{uuid.uuid4()}"
    _publish(redis_url, signed, replay)
    # Then it is refused, and the write never ran
    assert "not the request id of the signed body" in _refusal(signed_client, replay)
    assert not target.exists()


def test_a_signed_pickle_is_refused_before_anything_unpickles_it(
    redis_url: str, keys: Keys, signing_worker: Worker, signed_client: SkillClient,
    tmp_path: Path,
) -> None:
    # Given a body that creates a file when unpickled, signed with a trusted key
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    task_id = f"pickle-{uuid.uuid4()}"
    assert pickle.dumps(Payload())  # it pickles
    _publish(redis_url, _sign(keys.producer, [[Payload()], {}, {}], inner="pickle"), task_id)
    assert "signed body is not JSON" in _refusal(signed_client, task_id)
    assert not marker.exists()


def test_remote_control_is_signed_too(
    redis_url: str, keys: Keys, signing_worker: Worker, signed_client: SkillClient
) -> None:
    def inspect_ping(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "worker", "inspect", "ping", "--timeout", "3"],
            env={**base, "PYTHONPATH": str(REPO), "CLEVERAGENTS_BROKER_URL": redis_url, **env},
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )

    # `celery inspect` (and Flower) with the signing settings: its broadcast is signed
    signed = inspect_ping(keys.env(keys.producer))
    assert signed.returncode == 0, signed.stderr
    assert "pong" in signed.stdout
    # Without them: the worker does not decode the broadcast, and keeps serving
    unsigned = inspect_ping({})
    assert "pong" not in unsigned.stdout
    assert signing_worker.alive()
    handle = signed_client.submit("local/text-tools", "local/word-count", {"text": "still here"})
    assert handle.result(timeout=60).output_data == {"words": 2}


def test_the_cli_signs_on_the_embedded_default(keys: Keys, tmp_path: Path) -> None:
    # One shared pair for the command and the local worker it starts
    env = {**_clean_env(), **keys.env(keys.producer), "PYTHONPATH": str(REPO),
           "CLEVERAGENTS_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", "local/text-tools", "local/word-count",
         "--args", '{"text": "x y z"}', "--wait", "--json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output_data"] == {"words": 3}


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}


@pytest.mark.parametrize("missing", SIGNING_VARIABLES)
def test_some_but_not_all_signing_settings_are_a_configuration_error(
    missing: str, keys: Keys, tmp_path: Path
) -> None:
    env = {k: v for k, v in keys.env(keys.producer).items() if k != missing}
    # A client raises on construction, naming what is missing
    with pytest.raises(ConfigurationError, match=f"{missing} is not set"):
        SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": "redis://x:1/0", **env}))
    # The command line says so in one line and exits 2, before it starts anything
    for command in (["submit", "local/text-tools", "local/word-count", "--wait"], ["worker"]):
        done = subprocess.run(
            [sys.executable, "-m", "cleveragents", *command],
            env={**_clean_env(), **env, "PYTHONPATH": str(REPO),
                 "CLEVERAGENTS_HOME": str(tmp_path / "home")},
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )
        assert done.returncode == 2, done.stderr
        assert re.fullmatch(r"error: message signing needs all of [^\n]+ is not set",
                            done.stderr.strip()), done.stderr
    assert not (tmp_path / "home").exists()


def test_a_worker_with_some_signing_settings_does_not_start(
    redis_url: str, start_worker: StartWorker, keys: Keys
) -> None:
    env = keys.env(keys.worker)
    del env["CLEVERAGENTS_SIGNING_CERT_STORE"]
    with pytest.raises(AssertionError, match="message signing needs all of"):
        start_worker(redis_url, **env)


def test_a_worker_whose_key_is_not_its_certificates_does_not_start(
    redis_url: str, start_worker: StartWorker, keys: Keys
) -> None:
    env = {**keys.env(keys.worker), "CLEVERAGENTS_SIGNING_KEY": str(keys.producer.key)}
    with pytest.raises(AssertionError, match="is not the key of the certificate"):
        start_worker(redis_url, **env)


def _expired(tmp_path: Path) -> MessageSigning:
    pair = _make_pair(tmp_path / "old", "old", days=-1)
    return MessageSigning(pair.key, pair.cert, str(pair.cert))


@pytest.mark.parametrize(
    ("case", "complaint"),
    [
        ("a key that is not the certificate's", "is not the key of the certificate"),
        ("a store without this certificate", "does not hold CLEVERAGENTS_SIGNING_CERT"),
        ("an empty store", "holds no certificate"),
        ("a key file that is not there", "CLEVERAGENTS_SIGNING_KEY: cannot read"),
        ("a certificate file that is not a certificate", "CLEVERAGENTS_SIGNING_CERT ("),
        ("an expired certificate", "has expired"),
    ],
)
def test_signing_files_that_do_not_fit_are_a_configuration_error(
    case: str, complaint: str, keys: Keys, tmp_path: Path
) -> None:
    good = keys.signing(keys.producer)
    bad = {
        "a key that is not the certificate's": MessageSigning(
            keys.worker.key, good.certificate, good.cert_store),
        "a store without this certificate": MessageSigning(
            keys.outsider.key, keys.outsider.cert, good.cert_store),
        "an empty store": MessageSigning(good.key, good.certificate, str(tmp_path / "none")),
        "a key file that is not there": MessageSigning(
            tmp_path / "nope.key", good.certificate, good.cert_store),
        "a certificate file that is not a certificate": MessageSigning(
            good.key, good.key, good.cert_store),
    }.get(case) or _expired(tmp_path)
    with pytest.raises(ConfigurationError, match=re.escape(complaint)):
        check_signing(bad)
    with pytest.raises(ConfigurationError, match=re.escape(complaint)):
        SkillClient(settings=Settings(**{**_plain_settings(tmp_path), "signing": bad}))


def _plain_settings(tmp_path: Path) -> dict[str, Any]:
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": "redis://x:1/0",
                                  "CLEVERAGENTS_HOME": str(tmp_path / "home")})
    return {f: getattr(settings, f) for f in Settings.__dataclass_fields__}


def test_a_process_signs_with_one_identity(keys: Keys, tmp_path: Path) -> None:
    # Given this process signing as a producer (kombu's registry is one per process)
    register_signing(keys.signing(keys.producer))
    register_signing(keys.signing(keys.producer))  # the same identity again is fine
    # When another identity is asked for, then it is an error, not a silent switch of key
    store = tmp_path / "outsiders"
    store.mkdir()
    (store / "outsider.pem").write_bytes(keys.outsider.cert.read_bytes())
    with pytest.raises(ConfigurationError, match="one signing identity per process"):
        register_signing(MessageSigning(keys.outsider.key, keys.outsider.cert, str(store)))


def test_the_signing_constants_are_celerys(keys: Keys) -> None:
    from celery.security.serialization import (  # type: ignore[attr-defined]
        DEFAULT_SEPARATOR,
    )

    register_signing(keys.signing(keys.producer))
    assert registry.name_to_type[SIGNED_SERIALIZER] == SIGNED_CONTENT_TYPE
    assert DEFAULT_SEPARATOR == ENVELOPE_SEPARATOR
    # A client registers the serializer and leaves kombu's default and decoders as they were
    assert registry._default_content_type == "application/json"


def test_the_documented_openssl_commands_make_keys_that_sign(tmp_path: Path) -> None:
    # Given the bash block of docs/security.md that makes the key pairs
    page = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "openssl req" in b]
    # When it runs in an empty folder
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    # Then each role's settings, as the page gives them, load and fit together
    for role in ("producer", "worker"):
        env = _documented_env(page, role, tmp_path)
        signing = MessageSigning.from_env(env)
        assert signing is not None
        check_signing(signing)


def _documented_env(page: str, role: str, folder: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for block in re.findall(r"```bash\n(.*?)```", page, re.S):
        if f"# {role}" not in block:
            continue
        for name, value in re.findall(r"^(CLEVERAGENTS_SIGNING_\w+)=(\S+)$", block, re.M):
            env[name] = str(folder / value)
    assert set(env) == set(SIGNING_VARIABLES), (role, env)
    return env
