"""What a hostile holder of one role's Redis user can still do to another's work (issue 29).

Each role logs in with the compose file's user (``tests/support/acl_roles.py``) on a
private redis-server; the attacks are those of hostile round 3: a producer squatting
request ids, appending to another's batch ledger, cancelling under its own user; a
read-only worker reading or holding write workers' messages. And who may decide an
approval: the approver's user only; workers park and read decisions, producers do neither
and cannot write the audit log.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import denied_join_result

from cleveragents.approvals.model import APPROVED, REASON_EXPIRED, REJECTED, Decision, Parked
from cleveragents.batch.api import as_items, batch_status, submit_batch
from cleveragents.client import SkillClient
from cleveragents.constants import (
    APPROVAL_INDEX_KEY,
    APPROVAL_KEY_PREFIX,
    AUDIT_KEY,
    BIND_KEY_PREFIX,
    DECISION_KEY_PREFIX,
    READ_ONLY_AUDIT_KEY,
    SEAL_KEY_PREFIX,
    STATE_AWAITING_APPROVAL,
)
from cleveragents.pipeline.binding import content_digest
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult
from cleveragents.stores import RedisGuardStore, open_stores
from cleveragents.stores.approvals_redis import READ_ONLY_FLEET, WRITE_FLEET, RedisApprovalStore
from cleveragents.stores.audit import RedisAuditLog, event
from cleveragents.worker.approval_sweep import ApprovalSweep
from tests.support.acl_roles import as_user as _as
from tests.support.acl_roles import cli_as, compose_worker, producer_client, role_app
from tests.support.acl_roles import refused as _refused
from tests.support.composefile import RedisWithUsers, _program, _subprocess_env
from tests.support.procs import kill_group, wait_until

pytestmark = pytest.mark.timeout(240)


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


# ---- approvals: only the approver user decides, only workers write the audit log --------------

SKILL, PAY, PEEK = "test/approvals", "test/send-payment", "test/peek"
#: The audit events of an approved write that succeeds, in order.
APPROVED_TRAIL = ["requested", "awaiting_approval", "approved", "started", "succeeded"]


def _client_as(server: RedisWithUsers, user: str, home: Path) -> SkillClient:
    """A SkillClient logged in as ``user`` (the approver has no compose service: its URL is
    the one a person writes into their own CLEVERAGENTS_BROKER_URL)."""
    env = {"CLEVERAGENTS_BROKER_URL": server.url(user), "CLEVERAGENTS_HOME": str(home)}
    return SkillClient(settings=Settings.from_env(env))


def _parked(request_id: str, body: dict[str, Any]) -> Parked:
    return Parked(request_id, body["skill"], body["tool"], content_digest(body), body, None)


def _every_tool_needs_approval(skill: str, tool: str) -> bool:
    return True


def _body(request_id: str, tool: str, log: Path, *, writes: bool) -> dict[str, Any]:
    return {"request_id": request_id, "skill": SKILL, "tool": tool,
            "arguments": {"log": str(log), "key": "k"}, "allow_writes": writes}  # fmt: skip


def _denied_in(log: Path) -> list[str]:
    """The lines of a worker's log where Redis refused it something."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return [line for line in text.splitlines() if "NOPERM" in line or "no permissions" in line]


#: What no producer may do to the approvals or the audit log, even by hand: decide (or
#: read a decision), park or unlist an invocation, write, trim or delete the audit log.
PRODUCER_MAY_NOT = [
    ("HSET", f"{DECISION_KEY_PREFIX}victim", "outcome", "approved", "by", "me"),
    ("HMGET", f"{DECISION_KEY_PREFIX}victim", "outcome"),
    ("DEL", f"{DECISION_KEY_PREFIX}victim"),
    ("HSET", f"{APPROVAL_KEY_PREFIX}victim", "state", "approved"),
    ("HMGET", f"{APPROVAL_KEY_PREFIX}victim", "record"),
    ("ZREM", APPROVAL_INDEX_KEY, "victim"),
    ("ZRANGE", APPROVAL_INDEX_KEY, "0", "-1"),
    ("XADD", AUDIT_KEY, "*", "event", "approved", "request_id", "victim"),
    ("XADD", AUDIT_KEY, "MAXLEN", "0", "*", "event", "approved"),
    ("XTRIM", AUDIT_KEY, "MAXLEN", "0"),
    ("XDEL", AUDIT_KEY, "0-1"),
    ("DEL", AUDIT_KEY),
    ("XRANGE", AUDIT_KEY, "-", "+"),
    ("EVALSHA", "0" * 40, "2", f"{APPROVAL_KEY_PREFIX}victim", f"{DECISION_KEY_PREFIX}victim"),
]
#: A worker reads decisions; it never writes one, nor removes or rewrites the audit log.
WORKER_MAY_NOT = [
    ("HSET", f"{DECISION_KEY_PREFIX}victim", "outcome", "approved", "by", "worker"),
    ("HDEL", f"{DECISION_KEY_PREFIX}victim", "outcome"),
    ("DEL", f"{DECISION_KEY_PREFIX}victim"),
    ("PEXPIRE", f"{DECISION_KEY_PREFIX}victim", "1"),
    ("DEL", AUDIT_KEY),
    ("XDEL", AUDIT_KEY, "0-1"),
]
#: An approver decides and reads the trail; it parks nothing and writes no audit event.
APPROVER_MAY_NOT = [
    ("HSET", f"{APPROVAL_KEY_PREFIX}victim", "state", "approved"),
    ("DEL", f"{APPROVAL_KEY_PREFIX}victim"),
    ("ZREM", APPROVAL_INDEX_KEY, "victim"),
    ("ZADD", APPROVAL_INDEX_KEY, "0", "victim"),
    ("DEL", f"{DECISION_KEY_PREFIX}victim"),
    ("XADD", AUDIT_KEY, "*", "event", "approved"),
    ("XTRIM", AUDIT_KEY, "MAXLEN", "0"),
    ("DEL", AUDIT_KEY),
    ("KEYS", "*"),
    ("EVAL", "return 1", "0"),
]
#: The exporter reads when the oldest parked invocation was asked, nothing of it.
METRICS_MAY_NOT = [
    ("HMGET", f"{APPROVAL_KEY_PREFIX}victim", "record"),
    ("HMGET", f"{DECISION_KEY_PREFIX}victim", "outcome"),
    ("ZADD", APPROVAL_INDEX_KEY, "0", "victim"),
    ("XRANGE", AUDIT_KEY, "-", "+"),
]
MAY_NOT = [
    *[("producer", command) for command in PRODUCER_MAY_NOT],
    *[("metrics", command) for command in METRICS_MAY_NOT],
    *[("worker", command) for command in WORKER_MAY_NOT],
    *[("worker-readonly", command) for command in WORKER_MAY_NOT],
    *[("approver", command) for command in APPROVER_MAY_NOT],
]


@pytest.fixture(scope="module")
def shared_server() -> Iterator[RedisWithUsers]:
    """One server for the refusals below (no worker runs on it)."""
    started = RedisWithUsers().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.parametrize(
    ("user", "command"), MAY_NOT, ids=[f"{user}-{' '.join(c)[:50]}" for user, c in MAY_NOT]
)
def test_each_role_is_refused_what_approvals_and_the_audit_log_do_not_give_it(
    shared_server: RedisWithUsers, user: str, command: tuple[str, ...]
) -> None:
    admin = shared_server.admin()
    admin.acl_log_reset()
    client = _as(shared_server, user)
    assert _refused(client, *command), f"{user} may {' '.join(command)}"
    client.close()
    # Refused by its ACL, and nothing was written
    assert [entry["username"] for entry in shared_server.denials()] == [user]
    assert not admin.exists(f"{DECISION_KEY_PREFIX}victim", f"{APPROVAL_KEY_PREFIX}victim")
    assert not admin.exists(AUDIT_KEY, APPROVAL_INDEX_KEY)


def test_workers_park_and_sweep_and_only_the_approver_decides_or_reads_the_trail(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    admin = server.admin()
    log = tmp_path / "payments.jsonl"
    # Given a write parked by a worker's user, and a read by a read-only worker's
    worker = RedisApprovalStore(_as(server, "worker"), 600, (WRITE_FLEET,))
    readonly = RedisApprovalStore(_as(server, "worker-readonly"), 600, (READ_ONLY_FLEET,))
    write, read = f"pay-{uuid.uuid4()}", f"peek-{uuid.uuid4()}"
    parked = worker.resolve(_parked(write, _body(write, PAY, log, writes=True)), 600)
    assert (parked.state, parked.changed) == ("waiting", True)
    assert readonly.resolve(_parked(read, _body(read, PEEK, log, writes=False)), 600).changed
    # which the exporter's user sees waiting, for its gauge of the oldest
    oldest = RedisApprovalStore(_as(server, "metrics"), 600).oldest_asked_at()
    assert oldest is not None
    assert oldest == parked.record.asked_at
    # and their audit events, written by the workers' users
    trail = [event("requested", write, SKILL, PAY, "digest"),
             event("awaiting_approval", write, SKILL, PAY, "digest")]  # fmt: skip
    RedisAuditLog(_as(server, "worker"), 1000, (AUDIT_KEY,)).append(trail[:1])
    RedisAuditLog(_as(server, "worker-readonly"), 1000, (READ_ONLY_AUDIT_KEY,)).append(trail[1:])
    # Then a worker's user may not decide, not even through the approver's script (whose
    # HSET on the decision Redis refuses, as it would outside one)
    for store, parked_id in ((worker, write), (readonly, read)):
        with pytest.raises(redis.exceptions.ResponseError, match="script can't access"):
            store.decide(parked_id, Decision(APPROVED, "a worker", None))
    # nor may the producer's, whose own approvals fail as plainly
    producer = RedisApprovalStore(_as(server, "producer"), 600)
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.decide(write, Decision(APPROVED, "a producer", None))
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.waiting()
    with pytest.raises(redis.exceptions.NoPermissionError):
        RedisAuditLog(_as(server, "producer"), 1000).append(trail)
    assert not admin.exists(f"{DECISION_KEY_PREFIX}{write}")
    assert {d["username"] for d in server.denials()} == {"worker", "worker-readonly", "producer"}
    admin.acl_log_reset()
    # When the approver lists, approves one and rejects the other
    approver = RedisApprovalStore(_as(server, "approver"), 600)
    assert {r.request_id for r, _ in approver.waiting()} == {write, read}
    assert approver.decide(write, Decision(APPROVED, "alice", "ok"))[1].by == "alice"
    assert approver.decide(read, Decision(REJECTED, "alice", "no"))[1].outcome == REJECTED
    # Then a worker's sweep, as its user, sends on the decided invocations whose message
    # was lost (a minute later), each on its own queue; as in a worker's main process
    # (its prefork pool's setting), a message sent waits on no result notification
    later = time.time() + 120
    with denied_join_result():
        sweep = ApprovalSweep(
            role_app(server, "worker"), worker, 600, needs=_every_tool_needs_approval
        )
        assert sweep.sweep_once(now=later) == 1
    assert (admin.llen("skills.write"), admin.llen("skills.read")) == (1, 0)
    # and the worker's user settles the write by the decision it reads
    settled = worker.resolve(_parked(write, _body(write, PAY, log, writes=True)), 600)
    assert settled.state == APPROVED
    # and a read-only worker's sweep, as its user, sends the read again, and its user
    # settles it
    sweep = ApprovalSweep(
        role_app(server, "worker-readonly"), readonly, 600, needs=_every_tool_needs_approval
    )
    with denied_join_result():
        assert sweep.sweep_once(now=later) == 1
    assert admin.llen("skills.read") == 1
    settled = readonly.resolve(_parked(read, _body(read, PEEK, log, writes=False)), 600)
    assert settled.state == REJECTED
    assert worker.waiting() == []
    # and the approver reads the trail
    read_back = list(RedisAuditLog(_as(server, "approver"), 1000).read(request_id=write))
    assert [e["event"] for e in read_back] == ["requested", "awaiting_approval"]
    assert server.denials() == [], [(d["username"], d["object"]) for d in server.denials()]


@pytest.mark.slow
def test_the_producer_cannot_decide_and_the_approver_approves_through_a_worker_of_its_role(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    admin = server.admin()
    log = tmp_path / "payments.jsonl"
    rid = f"pay-{uuid.uuid4()}"
    folder = tmp_path / "w"
    with ExitStack() as stack:
        stack.enter_context(compose_worker(server, "worker", folder))
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        # Given a write that needs approval, parked by a worker under its own user
        handle = producer.submit(
            SKILL, PAY, {"log": str(log), "key": "k"}, allow_writes=True, request_id=rid
        )
        wait_until(lambda: producer.state(rid) == STATE_AWAITING_APPROVAL, 60, f"{rid} to park")
        # When the producer tries to approve or reject it, by the library or the CLI
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.approve(rid)
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.approvals.reject(rid, reason="mine to refuse")
        for args in (("approve", rid), ("reject", rid, "--reason", "no")):
            tried = cli_as(server, "producer", tmp_path, "approvals", *args)
            assert tried.returncode != 0, tried.stdout + tried.stderr
            assert "approved" not in tried.stdout
            assert "rejected" not in tried.stdout
            # one line that says Redis refused it, no traceback
            assert "no permissions to" in tried.stderr, tried.stderr
            assert len(tried.stderr.strip().splitlines()) == 1, tried.stderr
            assert "Traceback" not in tried.stderr
        # Then nothing was decided and nothing ran
        assert not admin.exists(f"{DECISION_KEY_PREFIX}{rid}")
        assert admin.hget(f"{APPROVAL_KEY_PREFIX}{rid}", "state") == b"waiting"
        assert not log.exists()
        assert {d["username"] for d in server.denials()} == {"producer"}
        admin.acl_log_reset()
        # When the approver, from their own machine, lists and approves it
        approver = stack.enter_context(_client_as(server, "approver", tmp_path / "approver"))
        assert [r.request_id for r in approver.approvals.pending()] == [rid]
        done = cli_as(server, "approver", tmp_path, "approvals", "approve", rid, "--by", "alice")
        assert done.returncode == 0, done.stdout + done.stderr
        # Then it runs once, through the worker, and the producer's wait gets its result
        result = handle.result(timeout=60)
        assert result.success, (result.error, server.denials())
        assert [json.loads(line)["key"] for line in log.read_text().splitlines()] == ["k"]
        # and the trail, read by the approver, tells its story
        trail = list(approver.approvals.audit(request_id=rid))
        assert [e["event"] for e in trail] == APPROVED_TRAIL
        assert trail[2]["by"] == "alice"
        shown = cli_as(server, "approver", tmp_path, "audit", "--request-id", rid, "--json")
        assert shown.returncode == 0, shown.stderr
        assert [json.loads(line)["event"] for line in shown.stdout.splitlines()] == APPROVED_TRAIL
    assert server.denials() == []
    assert _denied_in(folder / "worker.log") == []


@pytest.mark.slow
def test_a_worker_of_its_role_expires_an_undecided_write_by_its_sweep(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"
    folder = tmp_path / "w"
    with ExitStack() as stack:
        stack.enter_context(
            compose_worker(server, "worker", folder, CLEVERAGENTS_APPROVAL_TTL_S="2")
        )
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        rid = f"pay-{uuid.uuid4()}"
        handle = producer.submit(
            SKILL, PAY, {"log": str(log), "key": "k"}, allow_writes=True, request_id=rid
        )
        # Nobody decides: the worker's sweep sends it on past its expiry, and it ends
        result = handle.result(timeout=60)
        assert result.error is not None
        assert result.error.details.get("reason") == REASON_EXPIRED, result.error
        assert not log.exists()
        approver = stack.enter_context(_client_as(server, "approver", tmp_path / "approver"))
        events = [e["event"] for e in approver.approvals.audit(request_id=rid)]
        assert events == ["requested", "awaiting_approval", "expired"]
    assert server.denials() == []
    assert _denied_in(folder / "worker.log") == []
