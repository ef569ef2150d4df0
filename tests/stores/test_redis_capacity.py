"""A worker refuses a Redis that evicts keys and warns before one fills (redis_capacity.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from cleveragents.metrics.exporter import render
from cleveragents.stores.redis_capacity import (
    WARN_EVERY_S,
    MemoryWatch,
    RedisMemory,
    check_eviction,
)
from tests.conftest import worker_env
from tests.support.procs import RedisServer, Worker
from tests.support.prom import parse, value

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer(persistence=False).start()
    try:
        yield server
    finally:
        server.stop()


def _policy(server: RedisServer, policy: str, maxmemory: str = "0") -> None:
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory", maxmemory)


def test_a_worker_refuses_a_redis_that_evicts_and_names_the_fix(
    private_redis: RedisServer,
) -> None:
    _policy(private_redis, "allkeys-lru", "100mb")
    worker = Worker(worker_env(private_redis.url), concurrency=1)
    try:
        with pytest.raises(AssertionError, match="worker exited early"):
            worker.start(timeout=60)
        assert worker.proc is not None
        assert worker.proc.wait(10) != 0
        log = worker.log_text()
        assert "cannot start: Redis at redis://127.0.0.1:" in log
        assert "maxmemory-policy allkeys-lru, maxmemory 100.0 MB" in log
        assert "fix: set maxmemory-policy noeviction" in log
        assert "CLEVERAGENTS_ALLOW_EVICTION=1" in log
        assert "Traceback" not in log
    finally:
        worker.stop()


def test_a_worker_runs_on_an_evicting_redis_when_told_to_and_says_so(
    private_redis: RedisServer,
) -> None:
    _policy(private_redis, "volatile-ttl")
    worker = Worker(worker_env(private_redis.url, CLEVERAGENTS_ALLOW_EVICTION="1"), concurrency=1)
    try:
        worker.start(timeout=60)
        log = worker.log_text()
        assert "CLEVERAGENTS_ALLOW_EVICTION is set: running on it." in log
        assert "maxmemory-policy volatile-ttl, no maxmemory yet" in log
    finally:
        worker.stop()


def test_a_noeviction_redis_is_passed_in_silence_and_one_not_readable_is_said(
    private_redis: RedisServer,
) -> None:
    assert check_eviction([private_redis.url, private_redis.url], allow=False) == []
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser(
        "noinfo", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-info"]
    )
    url = f"redis://noinfo:pw@127.0.0.1:{private_redis.port}/0"
    [(_, line)] = check_eviction([url], allow=False)
    assert "could not read Redis's maxmemory-policy at redis://noinfo:**@127.0.0.1" in line
    assert "make sure it is noeviction" in line
    assert ":pw@" not in line


def test_the_metrics_export_the_memory_and_whether_the_policy_evicts(
    private_redis: RedisServer,
) -> None:
    client = redis.Redis.from_url(private_redis.url)
    _policy(private_redis, "noeviction", "64mb")
    samples = parse(render(client))
    assert value(samples, "cleveragents_redis_maxmemory_bytes") == 67108864
    assert ("cleveragents_redis_evicting", (("policy", "noeviction"),)) in samples
    assert value(samples, "cleveragents_redis_evicting", policy="noeviction") == 0
    used = [name for name, _ in samples if name.startswith("cleveragents_redis_used_memory")]
    assert len(used) == 1
    assert value(samples, "cleveragents_redis_used_memory_bytes") > 0
    _policy(private_redis, "allkeys-lfu", "64mb")
    samples = parse(render(client))
    assert value(samples, "cleveragents_redis_evicting", policy="allkeys-lfu") == 1


MB = 2**20
DAY = 86_400.0


def _watch(expires_s: float = 7 * DAY) -> MemoryWatch:
    return MemoryWatch(None, "redis://127.0.0.1:6379/0", expires_s)


def test_the_watch_warns_when_the_growth_fills_redis_before_results_expire() -> None:
    watch = _watch()
    # 1 GB limit, 100 MB used, growing 10 MB a minute: full in 90 minutes, results live 7 days
    assert watch.observe(RedisMemory(100 * MB, 1000 * MB, "noeviction"), 0.0) is None
    line = watch.observe(RedisMemory(200 * MB, 1000 * MB, "noeviction"), 600.0)
    assert line is not None
    assert "uses 200.0 MB of its maxmemory 1,000.0 MB and grows by 600.0 MB an hour" in line
    assert "full in about 1.3 hours, before the results stored now expire" in line
    assert "fix: raise maxmemory, or lower CLEVERAGENTS_RESULT_EXPIRES_S" in line
    # Said once an hour at most
    assert watch.observe(RedisMemory(210 * MB, 1000 * MB, "noeviction"), 660.0) is None
    later = 600.0 + WARN_EVERY_S
    assert watch.observe(RedisMemory(400 * MB, 1000 * MB, "noeviction"), later - 600) is None
    assert watch.observe(RedisMemory(500 * MB, 1000 * MB, "noeviction"), later)


def test_the_watch_is_quiet_when_the_results_expire_first_or_there_is_no_limit() -> None:
    watch = _watch(expires_s=3600.0)  # 10 MB a minute, full in 80 minutes, results live 1 h
    watch.observe(RedisMemory(100 * MB, 1000 * MB, "noeviction"), 0.0)
    assert watch.observe(RedisMemory(200 * MB, 1000 * MB, "noeviction"), 600.0) is None
    unlimited = _watch()
    unlimited.observe(RedisMemory(100 * MB, 0, "noeviction"), 0.0)
    assert unlimited.observe(RedisMemory(900 * MB, 0, "noeviction"), 600.0) is None
    # Growth over less than the least window is not judged
    early = _watch()
    early.observe(RedisMemory(100 * MB, 1000 * MB, "noeviction"), 0.0)
    assert early.observe(RedisMemory(200 * MB, 1000 * MB, "noeviction"), 60.0) is None


def test_the_watch_says_a_nearly_full_redis_whatever_its_growth() -> None:
    watch = _watch()
    line = watch.observe(RedisMemory(950 * MB, 1000 * MB, "noeviction"), 0.0)
    assert line is not None
    assert "it is nearly full, and then refuses new invocations" in line
