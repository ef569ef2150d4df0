"""A worker whose Redis connections go silent (half-open: no FIN, no RST, no reply)
finds them dead within the bound docs/guarantees.md states, and serves again.

A real worker reaches a private redis-server through a proxy (``FreezingProxy``)
that stops every open connection from carrying anything while leaving it open;
connections made after pass. Measured: served 20 to 31 s after the freeze (each
silent pooled connection a process meets costs one 10 s time-out); 60.1 s with the
settings before (``REDIS_SOCKET_TIMEOUT_S``, ``HEALTH_CHECK_S`` in
broker/celery_settings.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault_rig import READ, FreezingProxy, Rig, request, rig, submit, wait_results

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Rig, FreezingProxy]]:
    with rig(tmp_path / "rig") as made:
        proxy = FreezingProxy(made.redis.port)
        try:
            yield made, proxy
        finally:
            proxy.close()


def test_a_worker_whose_redis_connections_go_silent_serves_again_within_the_bound(
    proxied: tuple[Rig, FreezingProxy],
) -> None:
    r, proxy = proxied
    # Given a worker on Redis through the proxy, serving
    r.start_worker(concurrency=2, url=proxy.url)
    client = r.client()  # straight to Redis: the producer is not the one cut off
    first = submit(client, request(READ, "before", r.records.path))
    assert wait_results(client, [first], 30)[first] is not None
    # When every connection the worker has goes silent
    proxy.freeze()
    frozen = time.monotonic()
    after = submit(client, request(READ, "after", r.records.path))
    # Then it notices, connects again, and serves the read sent as they went silent
    result = wait_results(client, [after], 60)[after]
    took = time.monotonic() - frozen
    print(f"served {took:.1f} s after its connections went silent")
    assert result is not None
    # (kombu drops the consumer's overdue wait within 7 s; each silent pooled connection
    # a process meets costs one 10 s time-out: 20 to 31 s measured, 60 s before)
    assert took < 45, took
