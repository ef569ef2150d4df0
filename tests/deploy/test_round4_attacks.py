"""Hardening round 4 (issue 42): a worker acts only on what a role allowed to send it wrote.

Each test is one attack of the red-team pass, with the documented Redis users
(docs/deployment.md, "Redis users per role") on a private redis-server and real worker
processes: a record planted for the approval sweep, a parked call rewritten between
``show`` and ``approve``, a trimmed and forged audit trail, a forged limit slot, and a
write pushed onto a read queue by a role that may not send one.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import denied_join_result

from cleveragents.constants import (
    APPROVAL_INDEX_KEY,
    APPROVAL_KEY_PREFIX,
    AUDIT_KEY,
    BIND_KEY_PREFIX,
    DECISION_KEY_PREFIX,
    LIMIT_KEY_PREFIX,
    READ_ONLY_AUDIT_KEY,
    STATE_AWAITING_APPROVAL,
    TASK_INVOKE,
)
from cleveragents.pipeline.binding import content_digest
from cleveragents.skills.policies import Limits
from cleveragents.stores.quotas import Permit, RedisLimitGate
from tests.support.acl_roles import as_user as _as
from tests.support.acl_roles import cli_as as _cli
from tests.support.acl_roles import compose_worker, producer_client, role_app
from tests.support.acl_roles import refused as _refused
from tests.support.composefile import RedisWithUsers
from tests.support.procs import wait_until
from tests.support.worker_runs import run_keys

pytestmark = pytest.mark.timeout(240)

SKILL, PAY, RECORD = "test/approvals", "test/send-payment", "test/record"
#: The workers' audit key in these tests (a deployment's is its own secret).
AUDIT_SECRET = "round4-audit-key-0123456789abcdef"


# ---- 1: a record planted for the write fleet's approval sweep ---------------------------------


def test_a_readonly_worker_may_not_touch_the_write_fleets_approvals_limits_or_trail(
    server: RedisWithUsers,
) -> None:
    readonly = _as(server, "worker-readonly")
    planted = f"{APPROVAL_KEY_PREFIX}planted"
    for command in (
        ("HSET", planted, "record", "{}", "expires_at", "1", "state", "waiting"),
        ("HMGET", planted, "record"),
        ("ZADD", APPROVAL_INDEX_KEY, "1", "planted"),
        ("ZRANGE", APPROVAL_INDEX_KEY, "0", "-1"),
        ("ZADD", f"{LIMIT_KEY_PREFIX}test/limits|test/one-at-a-time:running", "9e15", "forged"),
        ("XADD", AUDIT_KEY, "MAXLEN", "1", "*", "event", "approved"),
    ):
        assert _refused(readonly, *command), command
    assert {d["username"] for d in server.denials()} == {"worker-readonly"}
    assert not server.admin().exists(planted, APPROVAL_INDEX_KEY, AUDIT_KEY)


def _planted_body(request_id: str, log: Path) -> dict[str, Any]:
    """A plain write (no approval needed) dressed as a parked call."""
    return {
        "request_id": request_id,
        "skill": SKILL,
        "tool": RECORD,
        "arguments": {"log": str(log), "key": "planted"},
        "allow_writes": True,
    }


def _plant(client: redis.Redis, request_id: str, body: dict[str, Any]) -> None:
    """HSET and ZADD a parked record past its expiry, as the red team did."""
    record = {
        "request_id": request_id,
        "skill": body["skill"],
        "tool": body["tool"],
        "digest": content_digest(body),
        "body": body,
        "asked_by": None,
        "trace": None,
    }
    client.hset(
        f"{APPROVAL_KEY_PREFIX}{request_id}",
        mapping={
            "record": json.dumps(record),
            "asked_at": "1",
            "expires_at": "1",
            "state": "waiting",
            "digest": record["digest"],
        },
    )
    client.zadd(APPROVAL_INDEX_KEY, {request_id: 1})


def test_a_planted_parked_record_is_refused_by_the_sweep_and_never_runs(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    log = tmp_path / "planted.jsonl"
    folder = tmp_path / "w"
    rid = f"planted-{uuid.uuid4()}"
    with compose_worker(
        server,
        "worker",
        folder,
        CLEVERAGENTS_APPROVAL_TTL_S="2",
        CLEVERAGENTS_AUDIT_KEY=AUDIT_SECRET,
    ):
        # Given a record planted by hand (with the write workers' own user: a read-only
        # worker's may no longer write there) for a write that needs no approval
        _plant(_as(server, "worker"), rid, _planted_body(rid, log))
        # Then the sweep, which looks every half second, says so once and leaves a
        # refused event instead of sending it on
        approver = _as(server, "approver")

        def refused() -> bool:
            events = [
                {k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in approver.xrange(AUDIT_KEY, "-", "+")
            ]
            return any(e["request_id"] == rid and e["event"] == "refused" for e in events)

        wait_until(refused, 30, "the sweep's refused event")
        text = (folder / "worker.log").read_text(encoding="utf-8", errors="replace")
        assert f"parked invocation {rid}" in text
        assert "not sent on" in text
        assert "planted" not in text.replace(rid, "").replace("planted-", "")  # no argument
    assert run_keys(log) == []
    assert server.admin().llen("skills.write") == 0


# ---- 2: a parked call rewritten between show and approve ---------------------------------------


def test_an_approval_names_the_digest_shown_and_a_rewritten_call_is_refused(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    admin: Any = server.admin()
    log = tmp_path / "payments.jsonl"
    rid = f"pay-{uuid.uuid4()}"
    with ExitStack() as stack:
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w"))
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        handle = producer.submit(
            SKILL, PAY, {"log": str(log), "key": "payee-A 1200"}, allow_writes=True, request_id=rid
        )
        wait_until(lambda: producer.state(rid) == STATE_AWAITING_APPROVAL, 60, "it to park")
        # Given a person who looked at it
        shown = _cli(server, "approver", tmp_path, "approvals", "show", rid, "--json")
        assert shown.returncode == 0, shown.stderr
        seen = json.loads(shown.stdout)
        assert seen["arguments"]["key"] == "payee-A 1200"
        assert seen["digest"] == content_digest(
            {"skill": SKILL, "tool": PAY, "arguments": seen["arguments"]}
        )
        # When the parked call, its digest and its binding are rewritten before the
        # approval (as whoever held a worker's password could)
        key = f"{APPROVAL_KEY_PREFIX}{rid}"
        record = json.loads(admin.hget(key, "record"))
        record["body"]["arguments"]["key"] = "payee-B 99999900"
        forged = content_digest(record["body"])
        record["digest"] = forged
        admin.hset(key, mapping={"record": json.dumps(record), "digest": forged})
        admin.set(f"{BIND_KEY_PREFIX}{rid}", forged)
        # Then approving what was shown is refused, exit 1, and nothing is decided
        approve = _cli(
            server,
            "approver",
            tmp_path,
            "approvals",
            "approve",
            rid,
            "--digest",
            seen["digest"][:12],
        )
        assert approve.returncode == 1, approve.stdout + approve.stderr
        assert "no longer the call that was shown" in approve.stderr
        assert not admin.exists(f"{DECISION_KEY_PREFIX}{rid}")
        # And a wrong or short digest is a clear one-line refusal too
        short = _cli(server, "approver", tmp_path, "approvals", "approve", rid, "--digest", "abc")
        assert short.returncode == 1
        assert "at least its first 12 hex digits" in short.stderr
        # And nothing ran
        assert not handle.ready()
    assert run_keys(log) == []


def test_a_worker_runs_only_a_delivery_whose_digest_is_the_decisions(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    admin: Any = server.admin()
    log = tmp_path / "payments.jsonl"
    rid = f"pay-{uuid.uuid4()}"
    with ExitStack() as stack:
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w"))
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        handle = producer.submit(
            SKILL, PAY, {"log": str(log), "key": "payee-A 1200"}, allow_writes=True, request_id=rid
        )
        wait_until(lambda: producer.state(rid) == STATE_AWAITING_APPROVAL, 60, "it to park")
        # Given the approver approves what they saw (the digest the desk reads)
        approved = _cli(server, "approver", tmp_path, "approvals", "approve", rid, "--by", "alice")
        assert approved.returncode == 0, approved.stderr
        assert "payee-A 1200" in approved.stdout  # the arguments it approved are printed
        result = handle.result(timeout=60)
        assert result.success, result.error
        # When a delivery of other content arrives under the same id afterwards (a
        # rewritten body sent on, with its binding rewritten to match)
        body = {
            "request_id": rid,
            "skill": SKILL,
            "tool": PAY,
            "arguments": {"log": str(log), "key": "payee-B 99999900"},
            "allow_writes": True,
        }
        admin.set(f"{BIND_KEY_PREFIX}{rid}", content_digest(body))
        admin.delete(f"celery-task-meta-{rid}")
        app = role_app(server, "worker")
        with denied_join_result():
            app.send_task(TASK_INVOKE, args=[body], task_id=rid, queue="skills.write")
        # Then it does not run: the decision is about the other digest; the call is parked
        wait_until(lambda: producer.state(rid) == STATE_AWAITING_APPROVAL, 60, "it to park again")
        app.close()
    assert run_keys(log) == ["payee-A 1200"]


# ---- 3: a trimmed and forged audit trail ------------------------------------------------------


def test_audit_verify_passes_a_whole_trail_and_names_a_trim_and_a_forged_event(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    log = tmp_path / "records.jsonl"
    key = {"CLEVERAGENTS_AUDIT_KEY": AUDIT_SECRET}
    with ExitStack() as stack:
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w", **key))
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        # Given a few writes, each with its events in the trail
        for n in range(4):
            handle = producer.submit(
                SKILL, RECORD, {"log": str(log), "key": f"k{n}"}, allow_writes=True
            )
            assert handle.result(timeout=60).success
    assert len(run_keys(log)) == 4
    # Then the trail verifies, with the workers' key
    whole = _cli(server, "approver", tmp_path, "audit", "--verify", **key)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "audit trail whole" in whole.stderr
    # And with another key, every event is said to be forged
    other = _cli(
        server,
        "approver",
        tmp_path,
        "audit",
        "--verify",
        CLEVERAGENTS_AUDIT_KEY="not-the-workers-key",
    )
    assert other.returncode == 1
    assert "seal that does not verify" in other.stdout
    # When a holder of a worker's password adds an approval and trims the stream to it
    worker = _as(server, "worker")
    forged = {
        "request_id": "never-sent",
        "event": "approved",
        "skill": SKILL,
        "tool": PAY,
        "at": "2026-01-01T00:00:00.000Z",
        "by": "alice",
        "digest": "0" * 64,
    }
    worker.xadd(AUDIT_KEY, forged, maxlen=1, approximate=False)  # type: ignore[arg-type]
    assert server.admin().xlen(AUDIT_KEY) == 1
    # Then verify fails, naming the forged event
    tampered = _cli(server, "approver", tmp_path, "audit", "--verify", **key)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert "forged: approved of never-sent" in tampered.stdout
    assert "NOT whole" in tampered.stderr


def test_audit_verify_names_a_trim_beyond_the_cap_and_a_gap(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    log = tmp_path / "records.jsonl"
    key = {"CLEVERAGENTS_AUDIT_KEY": AUDIT_SECRET}
    admin: Any = server.admin()
    with ExitStack() as stack:
        # One pool process: every event comes from one writer's chain
        stack.enter_context(
            compose_worker(server, "worker", tmp_path / "w", CLEVERAGENTS_CONCURRENCY="1", **key)
        )
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        for n in range(5):
            handle = producer.submit(
                SKILL, RECORD, {"log": str(log), "key": f"k{n}"}, allow_writes=True
            )
            assert handle.result(timeout=60).success
    entries = admin.xrange(AUDIT_KEY, "-", "+")
    assert len(entries) >= 10
    writers = [fields[b"chain"].split(b"/")[0] for _, fields in entries]
    # an event in the middle of a writer's chain (not its last: a cut tail shows nothing)
    middle = next(i for i in range(1, len(entries)) if writers[i] in writers[i + 1 :])
    # When the middle of the trail and then its start are cut (XDEL stands in for what
    # a trim with a chosen MAXLEN does to the oldest events)
    admin.xdel(AUDIT_KEY, entries[middle][0])
    gap = _cli(server, "approver", tmp_path, "audit", "--verify", **key)
    assert gap.returncode == 1, gap.stdout + gap.stderr
    assert "gap:" in gap.stdout
    # the first event of a writer whose chain goes on
    start = next(
        i for i, w in enumerate(writers) if writers.index(w) == i and w in writers[i + 1 :]
    )
    admin.xdel(AUDIT_KEY, entries[start][0])
    trimmed = _cli(server, "approver", tmp_path, "audit", "--verify", **key)
    assert trimmed.returncode == 1
    assert "trimmed:" in trimmed.stdout
    assert "below its cap" in trimmed.stdout


# ---- 5: a forged limit slot --------------------------------------------------------------------


def test_a_forged_far_future_slot_does_not_hold_a_limit(server: RedisWithUsers) -> None:
    running = f"{LIMIT_KEY_PREFIX}test/limits|test/one-at-a-time:running"
    # Given a token planted with a lease that ends in a thousand years (by a holder of the
    # write workers' password: a read-only worker's may not write there at all)
    attacker = _as(server, "worker")
    attacker.zadd(running, {"forged": time.time() * 1000 + 3.15e13})
    attacker.pexpire(running, 10**12)
    # When a worker asks for the one slot
    gate = RedisLimitGate(_as(server, "worker"), recovery_s=10)
    taken = gate.take("test/limits|test/one-at-a-time", Limits(concurrency=1))
    # Then it gets it at once: the forged token is swept
    assert isinstance(taken, Permit), f"waits {taken} s"
    assert server.admin().zscore(running, "forged") is None
    taken.release()


# ---- a write pushed onto a read queue ----------------------------------------------------------


def test_a_write_pushed_onto_the_read_queue_by_a_readonly_worker_runs_without_writes(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    log = tmp_path / "records.jsonl"
    rid = f"smuggled-{uuid.uuid4()}"
    body = {
        "request_id": rid,
        "skill": SKILL,
        "tool": RECORD,
        "arguments": {"log": str(log), "key": "smuggled"},
        "allow_writes": True,
    }
    with ExitStack() as stack:
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w"))
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        # Given a read-only worker's user, which may push onto skills.read (not skills.write),
        # sending a write there, with its message saying it is for skills.write
        app = role_app(server, "worker-readonly")
        with denied_join_result():
            app.send_task(
                TASK_INVOKE,
                args=[body],
                task_id=rid,
                queue="skills.read",
                routing_key="skills.read",
                exchange="skills.read",
            )
        app.close()
        # Then the write worker that takes it runs it without writes: refused
        wait_until(lambda: producer.get(rid) is not None, 60, "its result")
        result = producer.get(rid)
    assert result is not None
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == "permission_denied", result.error
    assert run_keys(log) == []


# ---- a route added to kombu's binding table by a read-only worker's user ---------------------

SEP = "\x06\x16"


def test_a_message_taken_from_the_read_queue_goes_back_to_it_whatever_the_binding_table_says(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    """Found by this round's review: the read-only user may add routes to kombu's binding
    tables, through which a worker put back (and sent back) a read queue's message."""
    admin = server.admin()
    log = tmp_path / "records.jsonl"
    rid = f"smuggled-{uuid.uuid4()}"
    body = {
        "request_id": rid,
        "skill": "test/limits",
        "tool": "test/limited-write",
        "arguments": {"log": str(log), "key": "smuggled"},
        "allow_writes": True,
    }
    with ExitStack() as stack:
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        first = ExitStack()
        first.enter_context(compose_worker(server, "worker", tmp_path / "w1"))
        # Given a write pushed onto skills.read by the read-only worker's user, delayed 12 s
        # (a limit's wait: a write worker holds it until then; its start and fetch fit)
        app = role_app(server, "worker-readonly")
        with denied_join_result():
            app.send_task(
                TASK_INVOKE,
                args=[body],
                task_id=rid,
                queue="skills.read",
                countdown=12,
                headers={"cleveragents_waits": 1},
            )
        app.close()
        # and a route from skills.read to skills.write in kombu's table, instead of its own
        readonly = _as(server, "worker-readonly")
        table = "_kombu.binding.skills.read"
        assert readonly.sadd(table, f"skills.read{SEP}{SEP}skills.write")
        readonly.srem(table, f"skills.read{SEP}{SEP}skills.read")
        wait_until(lambda: admin.hlen("unacked") == 1, 30, "a write worker to hold it")
        # When that worker stops (a restart, a deploy), putting back what it holds
        first.close()
        # Then the message is back on the queue it was taken from, not on skills.write
        assert (admin.llen("skills.read"), admin.llen("skills.write")) == (1, 0)
        # And a write worker that takes it runs it without writes
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w2"))
        wait_until(lambda: producer.get(rid) is not None, 90, "its result")
        result = producer.get(rid)
    assert result is not None
    assert result.error is not None
    assert result.error.error_type == "permission_denied", result.error
    assert run_keys(log) == []


def test_a_write_parked_under_the_read_only_fleets_keys_is_never_approved(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    """Found by this round's review: the read-only user writes its fleet's parked records,
    and the desk sent such a record's write on to skills.write once approved."""
    from cleveragents.approvals.model import Parked
    from cleveragents.stores.approvals_redis import READ_ONLY_FLEET, RedisApprovalStore

    rid = f"ro-pay-{uuid.uuid4()}"
    body = {"request_id": rid, "skill": SKILL, "tool": PAY,
            "arguments": {"log": str(tmp_path / "p.jsonl"), "key": "payee-B"},
            "allow_writes": True}  # fmt: skip
    # Given a write parked under the read-only fleet's keys by its user
    store = RedisApprovalStore(_as(server, "worker-readonly"), 600, (READ_ONLY_FLEET,))
    parked = Parked(rid, SKILL, PAY, content_digest(body), body, None)
    assert store.resolve(parked, 600).changed
    # When the approver approves it, with or without the digest
    for extra in ((), ("--digest", content_digest(body))):
        done = _cli(server, "approver", tmp_path, "approvals", "approve", rid, *extra)
        # Then it is refused, and nothing is decided or sent
        assert done.returncode == 1, done.stdout + done.stderr
        assert "parked under read-only workers' keys" in done.stderr
    admin: Any = server.admin()
    assert not admin.exists(f"{DECISION_KEY_PREFIX}{rid}")
    assert admin.llen("skills.write") == 0


def test_padding_another_stream_to_its_cap_hides_neither_a_trim_nor_a_forged_event(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    """Found by this round's review: a chain that started past 1 was never checked against
    its seal, and one stream at its cap counted as the whole trail's."""
    key = {"CLEVERAGENTS_AUDIT_KEY": AUDIT_SECRET, "CLEVERAGENTS_AUDIT_MAXLEN": "300"}
    with ExitStack() as stack:
        stack.enter_context(compose_worker(server, "worker", tmp_path / "w", **key))
        producer = stack.enter_context(producer_client(server, tmp_path / "producer"))
        for n in range(2):
            args = {"log": str(tmp_path / "log"), "key": f"k{n}"}
            assert (
                producer.submit(SKILL, RECORD, args, allow_writes=True).result(timeout=60).success
            )
    assert _cli(server, "approver", tmp_path, "audit", "--verify", **key).returncode == 0
    # When a worker user trims the write fleet's stream to one event of its own
    worker, readonly = _as(server, "worker"), _as(server, "worker-readonly")
    worker.execute_command("XADD", AUDIT_KEY, "MAXLEN", "1", "*", "chain", "t0/2", "seal", "0")
    # and the read-only user pads its own stream to the cap, then adds an approval
    with readonly.pipeline(transaction=False) as pipe:
        for i in range(300):
            pipe.xadd(READ_ONLY_AUDIT_KEY, {"chain": f"p{i}/2", "seal": "0"})
        pipe.execute()
    forged = {"event": "approved", "request_id": "never-existed-1", "skill": SKILL, "tool": PAY,
              "at": "2026-01-02T03:04:05.000Z", "digest": "0" * 64, "by": "alice",
              "chain": "0123456789abcdef/7", "prev": "", "seal": "f" * 64}  # fmt: skip
    readonly.xadd(READ_ONLY_AUDIT_KEY, forged)
    # Then verify names the forged approval and the padding, and exits 1
    done = _cli(server, "approver", tmp_path, "audit", "--verify", **key)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "forged: approved of never-existed-1" in done.stdout
    assert done.stdout.count("has a seal that does not verify") >= 300
