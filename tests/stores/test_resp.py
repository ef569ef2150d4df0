"""Commands packed by the stores themselves (cleveragents/stores/resp.py), on a real Redis.

The replies must be redis-py's own, an error reply must leave the connection in
step, and a connection whose replies were not all read must not hand them to
the next caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from cleveragents.stores.resp import Script, pack, pipelined


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


def test_a_command_is_packed_as_redis_py_packs_it() -> None:
    command = ("SET", "k\u00e9y", b"\x00\xff", "EX", 60)
    connection: Any = redis.Connection()  # type: ignore[no-untyped-call]
    assert pack(command) == b"".join(connection.pack_command(*command))


def test_an_argument_that_is_neither_text_bytes_nor_a_number_is_refused() -> None:
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match="bytes, str or int"):
            pack(("SET", "k", bad))  # type: ignore[arg-type]


def test_replies_are_redis_own_in_order(client: redis.Redis) -> None:
    client.set("a", "1")
    replies = pipelined(
        client,
        [
            ("SET", "b", "2", "NX", "GET", "EX", 60),
            ("SET", "a", "3", "NX", "GET"),
            ("MGET", "a", "b", "c"),
        ],
    )
    assert replies == [None, b"1", [b"1", b"2", None]]
    assert client.ttl("b") > 0


def test_an_error_reply_is_raised_after_every_reply_is_read(client: redis.Redis) -> None:
    client.set("text", "x")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        pipelined(client, [("INCR", "text"), ("SET", "after", "1")])
    # the command behind the error ran, and the connection is in step for the next call
    assert pipelined(client, [("GET", "after"), ("GET", "text")]) == [b"1", b"x"]


def test_a_connection_cut_between_replies_hands_no_reply_to_the_next_call(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.set("one", "1")
    client.set("two", "2")
    pool = client.connection_pool
    get_connection = pool.get_connection
    reads: list[int] = []

    def cut_after_one_reply() -> Any:
        conn = get_connection()
        read = conn.read_response

        def read_once(*args: Any, **kwargs: Any) -> Any:
            reads.append(1)
            if len(reads) == 2:  # the second reply, once
                raise redis.ConnectionError("connection lost (test)")
            return read(*args, **kwargs)

        monkeypatch.setattr(conn, "read_response", read_once)
        return conn

    monkeypatch.setattr(pool, "get_connection", cut_after_one_reply)
    with pytest.raises(redis.ConnectionError):
        pipelined(client, [("GET", "one"), ("GET", "two")])
    monkeypatch.setattr(pool, "get_connection", get_connection)
    # the reply to GET two was never read: the next call must not take it for its own
    assert pipelined(client, [("GET", "one")]) == [b"1"]
    assert pipelined(client, [("GET", "two")]) == [b"2"]


def test_a_script_is_loaded_where_redis_lacks_it(client: redis.Redis) -> None:
    script = Script(client, "return {#KEYS, ARGV[1]}")
    assert script(["a", "b"], ["x"]) == [2, b"x"]
    client.script_flush()  # as a restarted Redis
    assert script(["a"], ["y"]) == [1, b"y"]
    assert script.sha == client.script_load(script.source)


def test_nothing_to_send_sends_nothing(client: redis.Redis) -> None:
    assert pipelined(client, []) == []


def test_a_large_argument_is_sent_as_it_is_and_stored_whole(client: redis.Redis) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB, past the size sent without copying
    replies = pipelined(client, [("SET", "big", big), ("SET", "small", "s"), ("GET", "big")])
    assert replies == [b"OK", b"OK", big]
    assert pack(("SET", "big", big)) == b"".join(
        redis.Connection().pack_command("SET", "big", big)  # type: ignore[no-untyped-call]
    )


def test_an_id_holding_protocol_text_stays_one_argument(client: redis.Redis) -> None:
    # A producer picks its request ids: one that spells out a command must not become one.
    hostile = "x\r\n*1\r\n$8\r\nFLUSHALL\r\n"
    client.set("kept", "1")
    assert pipelined(client, [("SET", hostile, "v"), ("GET", hostile)]) == [b"OK", b"v"]
    assert client.get("kept") == b"1"
    assert client.get(hostile) == b"v"
