"""A worker whose subscription the server closes, while the server stays up, keeps serving.

kombu reads a worker's fanout subscription (remote control) with a blocking read once
its socket is readable. When the server closes it (``CLIENT KILL``, a pub/sub output
buffer over its limit, a proxy's idle time-out, the Sentinel watch's cut after a
failover), redis-py's retry reconnected inline and then blocked on the new connection
until the next broadcast: the worker's event loop stopped and it fetched nothing more.
And as the consumer closed its channel to reconnect, that channel sent one more fetch,
whose message stayed held by the closed channel until its beat expired.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.conftest import worker_env
from tests.support.procs import RedisServer, Worker

pytestmark = pytest.mark.timeout(120)

#: Seconds an invocation may take once the subscription is closed: a reconnection of
#: the worker's broker connection (milliseconds), on a machine of 2 busy cores.
SERVED_WITHIN_S = 8
#: CLEVERAGENTS_RECOVERY_S: a message held by a closed channel would come back only
#: after half of it, far over ``SERVED_WITHIN_S``.
RECOVERY_S = "60"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    made = RedisServer(persistence=False).start()
    try:
        yield made
    finally:
        made.stop()


def test_a_worker_serves_on_after_the_server_closes_its_subscription(
    server: RedisServer, tmp_path: Path
) -> None:
    # Given a worker that has served, with its remote-control subscription open
    env = {"CLEVERAGENTS_HOME": str(tmp_path / "home"), "CLEVERAGENTS_RECOVERY_S": RECOVERY_S}
    worker = Worker({**worker_env(server.url), **env}).start()
    try:
        client = SkillClient(settings=Settings.from_env(
            {**env, "CLEVERAGENTS_BROKER_URL": server.url,
             "CLEVERAGENTS_RESULT_BACKEND": server.url}
        ))
        assert client.submit("local/text-tools", "local/word-count",
                             {"text": "a b"}).result(timeout=30).success
        # When the server closes every subscription, and stays up
        killed = redis.Redis.from_url(server.url).client_kill_filter(_type="pubsub")
        assert killed >= 1
        # Then the next invocation is served: the worker's event loop did not stop
        handle = client.submit("local/text-tools", "local/word-count", {"text": "x"})
        result = handle.result(timeout=SERVED_WITHIN_S)
    finally:
        worker.stop()
    assert result.success, worker.log_text()[-3000:]
    assert "gave back" not in worker.log_text()
