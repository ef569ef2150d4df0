"""Every connection to Redis drops a half-open link within seconds (a lost Redis host sends
no FIN or RST): cleveragents/stores/redis_sockets.py, measured in the multi-host rig."""

from __future__ import annotations

import socket
from typing import Any

import kombu
from celery import Celery

from cleveragents.broker.celery_settings import REDIS_SOCKET_TIMEOUT_S, celery_settings
from cleveragents.broker.redis.result_backend import RedisBackend
from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from cleveragents.stores.redis_sockets import HALF_OPEN_S


def _timeouts(sock: Any) -> tuple[int, int]:
    """(TCP_USER_TIMEOUT in ms, SO_KEEPALIVE) of a connected socket."""
    user = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
    return user, sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)


def test_broker_connections_give_up_a_silent_peer_within_half_open_s(redis_url: str) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    for producer in (True, False):
        options = celery_settings(settings, producer=producer)["broker_transport_options"]
        with kombu.Connection(redis_url, transport_options=options) as connection:
            client = connection.default_channel.client  # type: ignore[attr-defined]
            client.ping()
            pooled = client.connection_pool.get_connection()
            try:
                assert _timeouts(pooled._sock) == (HALF_OPEN_S * 1000, 1)
            finally:
                client.connection_pool.release(pooled)


def test_a_workers_result_backend_and_stores_give_up_a_silent_peer(redis_url: str) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    app = Celery("sockets", set_as_current=False)
    app.conf.update(celery_settings(settings))
    backend = RedisBackend(app=app, url=redis_url)
    backend.client.ping()
    pooled = backend.client.connection_pool.get_connection()
    try:
        assert _timeouts(pooled._sock) == (HALF_OPEN_S * 1000, 1)
    finally:
        backend.client.connection_pool.release(pooled)
    assert app.conf.redis_socket_timeout == REDIS_SOCKET_TIMEOUT_S  # producers' reads too


def test_a_producers_result_reads_give_up_a_silent_peer(redis_url: str) -> None:
    # Given a producer, whose result backend is Celery's own (no keepalive options)
    client = SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url}))
    try:
        # When it reads results (the stores share the backend's pool)
        assert client.results.get_payloads(["nobody"]) == [None]
        redis_client: Any = getattr(client.app.backend, "client")  # noqa: B009
        pooled = redis_client.connection_pool.get_connection()
        try:
            # Then its connections drop a half-open link within HALF_OPEN_S too
            assert _timeouts(pooled._sock) == (HALF_OPEN_S * 1000, 1)
        finally:
            redis_client.connection_pool.release(pooled)
    finally:
        client.close()
