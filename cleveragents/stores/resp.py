"""Many Redis commands in one round trip, packed here rather than by redis-py.

redis-py spends about 20 us of the caller's CPU on each command of a pipeline
(building the command, packing it, looking up its reply callback), and packs a
long command (a script's thousand arguments) an argument at a time into a
growing buffer. A batch binds, looks up and stores hundreds of keys per round
trip: that was a fifth to a third of a producer's CPU per line. ``pipelined``
packs the commands itself and reads the replies straight off one pooled
connection, with redis-py's parser: 5 to 10 us per command. The replies are as
Redis sends them, decoded or not as the client is set, without redis-py's
per-command callbacks (a ``SET`` answers ``b"OK"``, not True); the errors are
redis-py's. A large argument (a big result) is sent as it is, not copied into the
packed text.

A connection whose replies were not all read (a broken connection, an
interrupted read) is disconnected before it goes back to the pool, so that no
later caller reads another's reply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["Arg", "Script", "pack", "pipelined"]

#: What a command is made of: text (UTF-8), bytes or a whole number.
Arg = bytes | str | int


def _bytes(arg: Arg) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    raise TypeError(f"a Redis argument must be bytes, str or int, not {type(arg).__name__}")


#: Arguments at least this long are sent as they are, not copied into the packed text.
_SEND_AS_IS = 1 << 16


def _pieces(commands: Sequence[Sequence[Arg]]) -> list[bytes]:
    """The commands in the Redis protocol (RESP), as few pieces as large arguments allow."""
    pieces: list[bytes] = []
    small: list[bytes] = []
    for command in commands:
        small.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = arg.encode() if isinstance(arg, str) else _bytes(arg)
            if len(data) < _SEND_AS_IS:
                small.append(b"$%d\r\n%b\r\n" % (len(data), data))
                continue
            small.append(b"$%d\r\n" % len(data))
            pieces += (b"".join(small), data)
            small = [b"\r\n"]
    pieces.append(b"".join(small))
    return pieces


def pack(command: Sequence[Arg]) -> bytes:
    """One command in the Redis protocol (RESP): an array of bulk strings."""
    return b"".join(_pieces([command]))


def pipelined(
    client: redis.Redis, commands: Sequence[Sequence[Arg]], *, inline_errors: bool = False
) -> list[Any]:
    """Send ``commands`` in one round trip; their replies, in order.

    Raises the first error reply (``ResponseError``) once every reply is read (with
    ``inline_errors``: returns it in its place), and a connection error as redis-py
    does (``cleveragents.stores.redis_retry.retrying`` retries it).
    """
    if not commands:
        return []
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        conn.send_packed_command(_pieces(commands))
        replies: list[Any] = []
        failed: ResponseError | None = None
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:  # a reply like any other: read on
                failed = failed or exc
                replies.append(exc)
    except BaseException:
        conn.disconnect()  # replies may be left unread on it
        raise
    finally:
        pool.release(conn)
    if failed is not None and not inline_errors:
        raise failed
    return replies


class Script:
    """A Lua script called by its SHA (``EVALSHA``), loaded once where Redis lacks it."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run the script on ``keys`` with ``args``; its reply."""
        return self.then(keys, args, ())[0]

    def then(
        self, keys: Sequence[Arg], args: Sequence[Arg], after: Sequence[Sequence[Arg]]
    ) -> list[Any]:
        """Run the script, then ``after`` on the same connection in the same round trip;
        the script's reply, then those of ``after`` (error replies in their place)."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        replies = pipelined(self.client, [command, *after], inline_errors=True)
        if isinstance(replies[0], NoScriptError):  # a new or restarted Redis: load it
            pipelined(self.client, [("SCRIPT", "LOAD", self.source)])
            replies = pipelined(self.client, [command, *after], inline_errors=True)
        if isinstance(replies[0], ResponseError):
            raise replies[0]
        return replies
