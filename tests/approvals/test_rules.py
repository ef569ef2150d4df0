"""The rules of approvals, the same in every store: park once, decide once, in time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cleveragents.approvals.model import (
    APPROVED,
    EXPIRED,
    REJECTED,
    WAITING,
    ApprovalError,
    Decision,
    Parked,
)
from cleveragents.embedded.server import join_server, leave_server
from cleveragents.embedded.urls import HomeUrls
from cleveragents.stores.approvals import ApprovalStore, MemoryApprovalStore
from cleveragents.stores.approvals_redis import RedisApprovalStore
from tests.support.procs import wait_until


def _asked(request_id: str = "r1") -> Parked:
    body = {"skill": "s", "tool": "t", "arguments": {"amount": 12}, "allow_writes": True}
    return Parked(request_id, "s", "t", "digest-1", body, asked_by="gen1@host")


def _past(expires_at: float) -> None:
    """Wait until the wall clock has passed ``expires_at``: the clock the stores compare
    an expiry with (the Redis store asks the local server's TIME, the same clock), not an
    event a test could wait for instead."""
    wait_until(lambda: time.time() > expires_at + 0.01, 5, "the expiry", interval=0.01)


@pytest.fixture(params=["memory", "embedded", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ApprovalStore]:
    if request.param == "memory":
        yield MemoryApprovalStore()
    elif request.param == "embedded":  # the home's private server
        join_server(tmp_path / "home")
        client = redis.Redis.from_url(HomeUrls.of(tmp_path / "home").client)
        yield RedisApprovalStore(client, keep_s=3600)
        client.close()
        leave_server(tmp_path / "home")
    else:
        url = request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(url)
        yield RedisApprovalStore(client, keep_s=3600)
        client.close()


def test_the_first_delivery_parks_and_the_next_finds_it_still_waiting(store: ApprovalStore) -> None:
    first = store.resolve(_asked(), ttl_s=60)
    assert (first.state, first.changed) == (WAITING, True)
    assert first.record.expires_at == pytest.approx(first.record.asked_at + 60, abs=0.01)
    again = store.resolve(_asked(), ttl_s=60)
    assert (again.state, again.changed) == (WAITING, False)
    assert again.record.asked_at == pytest.approx(first.record.asked_at, abs=0.001)
    [(waiting, decision)] = store.waiting()
    assert waiting.request_id == "r1"
    assert decision is None
    assert waiting.body["arguments"] == {"amount": 12}  # the approver sees what they approve


def test_an_approval_is_taken_once_and_settles_the_next_delivery(store: ApprovalStore) -> None:
    store.resolve(_asked(), ttl_s=60)
    _record, decision = store.decide("r1", Decision(APPROVED, "alice", "looks right"))
    assert (decision.outcome, decision.by, decision.reason) == (APPROVED, "alice", "looks right")
    assert decision.at == pytest.approx(time.time(), abs=5)
    with pytest.raises(ApprovalError, match="already approved by alice"):
        store.decide("r1", Decision(APPROVED, "bob", None))
    with pytest.raises(ApprovalError, match="already approved by alice"):
        store.decide("r1", Decision(REJECTED, "bob", "no"))
    settled = store.resolve(_asked(), ttl_s=60)
    assert (settled.state, settled.changed) == (APPROVED, True)
    assert settled.decision is not None
    assert settled.decision.by == "alice"
    # A later delivery (a redelivery) finds it approved, and changes nothing
    later = store.resolve(_asked(), ttl_s=60)
    assert (later.state, later.changed) == (APPROVED, False)
    assert store.waiting() == []


def test_a_rejection_keeps_its_reason(store: ApprovalStore) -> None:
    store.resolve(_asked(), ttl_s=60)
    store.decide("r1", Decision(REJECTED, "carol", "not today"))
    settled = store.resolve(_asked(), ttl_s=60)
    assert settled.state == REJECTED
    assert settled.decision is not None
    assert settled.decision.reason == "not today"


def test_an_unknown_id_cannot_be_decided(store: ApprovalStore) -> None:
    with pytest.raises(ApprovalError, match="no invocation nope awaits approval"):
        store.decide("nope", Decision(APPROVED, "alice", None))
    assert store.get("nope") == (None, None)


def test_an_expired_approval_cannot_be_decided_and_expires_on_delivery(
    store: ApprovalStore,
) -> None:
    parked = store.resolve(_asked(), ttl_s=0.3)
    _past(parked.record.expires_at)
    with pytest.raises(ApprovalError, match="expired unapproved"):
        store.decide("r1", Decision(APPROVED, "alice", None))
    record, decision = store.get("r1")
    assert record is not None
    assert decision is None
    ended = store.resolve(_asked(), ttl_s=0.3)
    assert (ended.state, ended.changed) == (EXPIRED, True)
    with pytest.raises(ApprovalError, match="expired unapproved"):
        store.decide("r1", Decision(REJECTED, "alice", "late"))
    assert store.waiting() == []


def test_a_decision_taken_in_time_wins_over_a_late_delivery(store: ApprovalStore) -> None:
    parked = store.resolve(_asked(), ttl_s=0.5)
    store.decide("r1", Decision(APPROVED, "alice", None))
    _past(parked.record.expires_at)  # past its expiry, but decided before it
    assert store.resolve(_asked(), ttl_s=0.5).state == APPROVED


def test_a_decision_about_other_arguments_does_not_count(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisApprovalStore(client, keep_s=3600)
    store.resolve(_asked(), ttl_s=60)
    # A decision written past the approver's script, for no digest (or another one)
    client.hset("cleveragents:decision:r1", mapping={"outcome": APPROVED, "by": "x", "at": 1})
    assert store.resolve(_asked(), ttl_s=60).state == WAITING
    client.hset("cleveragents:decision:r1", "digest", "digest-of-something-else")
    assert store.resolve(_asked(), ttl_s=60).state == WAITING
    client.close()


@pytest.mark.parametrize("pair", [("p/q", "p_q"), ("a/b", "a%2Fb"), ("/" * 200, "/" * 199 + "x")])
def test_ids_a_file_name_cannot_hold_stay_apart(
    store: ApprovalStore, pair: tuple[str, str]
) -> None:
    # The embedded store names a file per id: two ids must never share one (the first
    # would wait forever, and a decision about one would settle the other).
    first, second = (f"{pair[0]}-{id(store)}", f"{pair[1]}-{id(store)}")
    store.resolve(_asked(first), ttl_s=60)
    store.resolve(_asked(second), ttl_s=60)
    assert {parked.request_id for parked, _ in store.waiting()} >= {first, second}
    store.decide(first, Decision(APPROVED, "alice", None))
    assert store.resolve(_asked(first), ttl_s=60).state == APPROVED
    assert store.resolve(_asked(second), ttl_s=60).state == WAITING
