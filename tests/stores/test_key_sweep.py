"""The sweep that gives producers' keys a time to live (``cleveragents/stores/key_sweep.py``).

Against a real Redis: a pass walks the whole keyspace over several rounds, gives
every binding, seal and cancel mark without a time to live the results', never
shortens one, leaves every other key alone, and one worker at a time sweeps.
"""

from __future__ import annotations

import redis

from cleveragents.stores.key_sweep import (
    CURSOR_KEY,
    LOCK_KEY,
    SCAN_COUNT,
    SCANS_PER_ROUND,
    KeySweep,
)


def test_a_pass_gives_every_producers_key_a_time_to_live_and_touches_nothing_else(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    # Given more keys than one round looks at: bindings, seals, cancel marks and others
    many = SCAN_COUNT * SCANS_PER_ROUND * 2
    with client.pipeline(transaction=False) as pipe:
        for n in range(many):
            pipe.set(f"cleveragents:bind:id-{n}", "digest")
        pipe.set("cleveragents:seal:b1", "2:abc")
        pipe.set("cleveragents:cancel:c1", "1")
        pipe.set("cleveragents:bind:kept", "digest", ex=50)
        pipe.set("cleveragents:claim:write:w1", "claim")
        pipe.set("celery-task-meta-r1", "{}")
        pipe.execute()
    sweep = KeySweep(client, ttl_s=3600, every_s=0.001)
    # When rounds run until the pass is over (the lock lasts a round's period)
    given, rounds = 0, 0
    while True:
        client.delete(LOCK_KEY)
        given += sweep.round()
        rounds += 1
        if int(client.get(CURSOR_KEY) or 0) == 0:
            break
    # Then it took several rounds, and every producer's key has the results' time to live
    assert rounds > 1
    assert given == many + 2
    sample = [f"cleveragents:bind:id-{n}" for n in (0, many // 2, many - 1)]
    for key in [*sample, "cleveragents:seal:b1", "cleveragents:cancel:c1"]:
        assert 3590 < client.ttl(key) <= 3600, key
    # a time to live it had is kept, never shortened nor lengthened
    assert client.ttl("cleveragents:bind:kept") <= 50
    # and other keys are left as they are
    assert client.ttl("cleveragents:claim:write:w1") == -1
    assert client.ttl("celery-task-meta-r1") == -1
    client.close()


def test_one_worker_sweeps_at_a_time(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("cleveragents:bind:one", "digest")
    first, second = KeySweep(client, 3600, every_s=60), KeySweep(client, 3600, every_s=60)
    assert first.round() == 1
    client.set("cleveragents:bind:two", "digest")
    # The other finds the lock taken for the round's period, and does nothing
    assert second.round() == 0
    assert client.ttl("cleveragents:bind:two") == -1
    client.close()
