"""What a hostile holder of one role's Redis user can still do to another's work (issue 29).

Each role logs in with the compose file's user (``tests/support/acl_roles.py``) on a
private redis-server; the attacks are those of hostile round 3: a producer squatting
request ids, appending to another's batch ledger, cancelling under its own user; a
read-only worker reading or holding write workers' messages.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from cleveragents.batch.api import as_items, batch_status, submit_batch
from cleveragents.constants import BIND_KEY_PREFIX, SEAL_KEY_PREFIX
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult
from cleveragents.stores import RedisGuardStore, open_stores
from tests.support.acl_roles import compose_worker, producer_client, role_app
from tests.support.composefile import RedisWithUsers, _program, _subprocess_env
from tests.support.procs import kill_group, wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def server() -> Iterator[RedisWithUsers]:
    """A private redis-server with the compose users: no other worker takes a message."""
    started = RedisWithUsers().start()
    try:
        yield started
    finally:
        started.stop()


def _as(server: RedisWithUsers, user: str) -> redis.Redis:
    return redis.Redis.from_url(server.url(user), socket_timeout=10)


def _refused(client: redis.Redis, *command: str) -> bool:
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError:
        return True
    return False


def _cli(server: RedisWithUsers, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script as a producer runs it (its URL, so its Redis user)."""
    env = {**_subprocess_env("worker", home), "CLEVERAGENTS_BROKER_URL": server.url("producer")}
    return subprocess.run(
        [*_program(["cleveragents"]), *args],
        cwd=home, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


# ---- 11: request-id squatting ------------------------------------------------------------------


def test_a_squatted_request_id_gets_a_time_to_live_from_the_workers_sweep(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    admin = server.admin()
    # Given a producer that binds ids nobody sends (SETNX: no time to live), and a
    # batch seal nobody sealed
    squatter = RedisGuardStore(_as(server, "producer"), 600)
    squatted = [f"victim-{uuid.uuid4()}" for _ in range(3)]
    assert squatter.bind([(rid, "forged") for rid in squatted]) == [None] * 3
    seal = f"{SEAL_KEY_PREFIX}squatted-{uuid.uuid4().hex[:8]}"
    assert _as(server, "producer").setnx(seal, "0:forged")
    for rid in squatted:
        assert admin.ttl(f"{BIND_KEY_PREFIX}{rid}") == -1
    # When a worker runs
    with compose_worker(server, "worker", tmp_path / "w", CLEVERAGENTS_RESULT_EXPIRES_S="3600"):
        # Then it gives each a time to live, at most the results' (never shorter)
        keys = [f"{BIND_KEY_PREFIX}{rid}" for rid in squatted] + [seal]
        wait_until(lambda: all(admin.ttl(k) > 0 for k in keys), 30, "a time to live for each")
        assert all(3500 < admin.ttl(k) <= 3600 for k in keys), [admin.ttl(k) for k in keys]
        # and the squatter may neither shorten nor remove one
        producer = _as(server, "producer")
        for command in (("EXPIRE", keys[0], "1"), ("PERSIST", keys[0]), ("DEL", keys[0])):
            assert _refused(producer, *command), command
    assert server.denials()
    assert {d["username"] for d in server.denials()} == {"producer"}


# ---- 10: a forged success inside a batch -------------------------------------------------------


def _stored_success(server: RedisWithUsers, rid: str) -> None:
    """A success stored by a worker under ``rid``: the attacker's own invocation's."""
    worker = role_app(server, "worker")
    stores = open_stores(Settings.from_env({}), worker.backend, worker=True)
    ok = SkillResult(skill_name="s", tool_name="t", success=True, output_data={"forged": 1})
    stores.results.put_many([(rid, ok)])
    worker.close()


def _victims_batch(server: RedisWithUsers, home: Path) -> str:
    lines = [
        {"request_id": f"line-{n}-{uuid.uuid4()}", "skill": "local/text-tools",
         "tool": "local/word-count", "arguments": {"text": "a b"}}
        for n in range(2)
    ]  # fmt: skip
    with producer_client(server, home) as victim:
        bid, total = submit_batch(victim, as_items(lines))
    assert total == 2
    return bid


def test_an_id_appended_to_another_producers_batch_is_reported_never_counted(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    # Given a victim's background batch of two lines (no worker yet: both pending)
    bid = _victims_batch(server, tmp_path)
    # When another producer appends an id whose stored success is its own
    forged = f"forged-{uuid.uuid4()}"
    _stored_success(server, forged)
    _as(server, "producer").rpush(f"cleveragents:batch:{bid}:ids", forged)
    # Then the status counts the two sealed lines only, and says the ledger was changed
    with producer_client(server, tmp_path) as reader:
        status = batch_status(reader, bid)
    assert status is not None
    assert (status.total, status.done, status.succeeded) == (2, 0, 0)
    assert status.tampered is not None
    assert "3 ids where 2 were sealed" in status.tampered
    shown = _cli(server, tmp_path, "batch", "status", bid)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "changed after it was submitted" in shown.stderr
    assert "3 of 2" not in shown.stdout + shown.stderr
    # and `batch results` writes nothing from a changed ledger
    out = tmp_path / "out.jsonl"
    written = _cli(server, tmp_path, "batch", "results", bid, "--out", str(out), "--no-wait")
    assert written.returncode == 1, written.stdout + written.stderr
    assert "changed after it was submitted" in written.stderr
    assert forged not in (out.read_text(encoding="utf-8") if out.exists() else "")


def test_a_replaced_ledger_or_seal_is_reported(server: RedisWithUsers, tmp_path: Path) -> None:
    bid = _victims_batch(server, tmp_path)
    attacker = _as(server, "producer")
    ids_key, seal = f"cleveragents:batch:{bid}:ids", f"{SEAL_KEY_PREFIX}{bid}"
    # The seal is the producers' to make once, never to replace or remove
    for command in (("SET", seal, "3:forged"), ("DEL", seal), ("EXPIRE", seal, "1")):
        assert _refused(attacker, *command), command
    assert not attacker.setnx(seal, "3:forged")
    # When the ids are replaced by as many others, one of them a forged success
    first = attacker.lrange(ids_key, 0, 0)[0]
    forged = f"forged-{uuid.uuid4()}"
    _stored_success(server, forged)
    attacker.expire(ids_key, 1)
    wait_until(lambda: not server.admin().exists(ids_key), 10, "the ids to expire")
    attacker.rpush(ids_key, first, forged)
    # Then the status says so, and counts no forged success
    with producer_client(server, tmp_path) as reader:
        status = batch_status(reader, bid)
    assert status is not None
    assert status.succeeded == 0
    assert status.tampered is not None
    assert "differ from those sealed" in status.tampered


def test_a_batch_id_whose_seal_is_taken_is_refused_at_submit(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    assert _as(server, "producer").setnx(f"{SEAL_KEY_PREFIX}nightly-42", "0:squatted")
    line = '{"request_id": "n42-1", "skill": "local/text-tools", "tool": "local/word-count", ' \
        '"arguments": {"text": "a"}}\n'  # fmt: skip
    source = tmp_path / "in.jsonl"
    source.write_text(line, encoding="utf-8")
    done = _cli(server, tmp_path, "batch", "submit", str(source), "--batch-id", "nightly-42")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "batch id nightly-42 is taken" in done.stderr
    assert server.admin().llen("skills.batch") == 0


# ---- 6: cancelling under the producer user -----------------------------------------------------


def test_a_cancel_under_the_producer_user_stops_a_queued_write_with_no_traceback(
    server: RedisWithUsers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ExitStack() as stack:
        client = stack.enter_context(producer_client(server, tmp_path))
        # Given a queued write (no worker yet)
        rid = f"cancel-{uuid.uuid4()}"
        handle = client.submit(
            "local/notes", "local/write-note", {"name": "cancelled", "text": "never"},
            allow_writes=True, request_id=rid,
        )  # fmt: skip
        # When the producer cancels it, as its own Redis user (no pidbox to publish to)
        with caplog.at_level(logging.INFO):
            assert client.revoke(rid, terminate=True) is True
        # Then at most one warning line, no traceback
        assert not [r for r in caplog.records if r.exc_info], caplog.text
        # And a worker, started later, never runs it: its result says it was cancelled
        folder = tmp_path / "w"
        stack.enter_context(compose_worker(server, "worker", folder))
        result = handle.result(timeout=60)
    assert not result.success
    assert result.error is not None
    assert result.error.details.get("reason") == "cancelled", result.error
    assert not list((folder / "notes").glob("cancelled*")), "the write ran"


# ---- 5: roles that separate --------------------------------------------------------------------


@pytest.mark.slow
def test_a_readonly_worker_neither_holds_nor_gives_back_write_workers_messages(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    fast = {"CLEVERAGENTS_VISIBILITY_TIMEOUT_S": "6", "CLEVERAGENTS_RECOVERY_S": "6"}
    admin = server.admin()
    with ExitStack() as stack:
        client = stack.enter_context(producer_client(server, tmp_path))
        # Given a read-only worker that dies while it runs a read
        first_ro = compose_worker(server, "worker-readonly", tmp_path / "ro1", **fast)
        ro = stack.enter_context(first_ro)
        marks = tmp_path / "tally"
        reads = {"path": str(tmp_path / "reads"), "key": "r", "sleep_s": 3}
        read = client.submit("test/batch", "test/tally", reads)
        wait_until(lambda: admin.hlen("cleveragents:ro:unacked") == 1, 30, "the ro worker holds it")
        # its message is held under its role's keys, which a write worker's user cannot touch
        assert admin.hlen("unacked") == 0
        kill_group(ro, signal.SIGKILL)
        ro.wait(10)
        # And a write worker that dies while it runs a write
        w1 = stack.enter_context(compose_worker(server, "worker", tmp_path / "w1", **fast))
        args = {"path": str(marks), "key": "k", "sleep_s": 2}
        write = client.submit("test/batch", "test/tally", args, allow_writes=True)
        wait_until(lambda: admin.hlen("unacked") == 1, 30, "the write worker to take it")
        kill_group(w1, signal.SIGKILL)
        w1.wait(10)
        # When only a read-only worker runs, past the recovery time
        stack.enter_context(compose_worker(server, "worker-readonly", tmp_path / "ro2", **fast))
        # Then it gives back (and runs) its own role's read, and leaves the write alone
        # (its reaper gave back the read: the same round would have found the write)
        assert read.result(timeout=60).success
        assert admin.hlen("unacked") == 1
        assert admin.llen("skills.write") == 0
        # And a write worker gives it back and runs it
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w2", **fast))
        result = write.result(timeout=60)
        assert result.success, (result.error, server.denials())
        assert marks.read_text(encoding="utf-8") == "k\n"
        assert server.denials() == []
