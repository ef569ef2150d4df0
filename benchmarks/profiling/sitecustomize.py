"""Counts every Redis round trip of a process, by caller: ``benchmarks/profile_paths.py``.

Put this folder first on ``PYTHONPATH`` and set ``BENCH_PROFILE_DIR``: Python imports
``sitecustomize`` at start-up, and this one wraps redis-py's ``send_packed_command``
(one call per request sent: a command, or a whole pipeline) and writes
``rt-<pid>.json`` in that folder every 0.2 s and at exit: the counts by the first
caller outside redis-py (``kombu/transport/redis.py:_brpop_start``, ...) and the
process's CPU seconds. A forked child (a Celery pool process) counts from zero in
a file of its own. Without ``BENCH_PROFILE_DIR`` it does nothing; it is never on
the path of a normal run.
"""

from __future__ import annotations

import os

_DIR = os.environ.get("BENCH_PROFILE_DIR")


def _install(folder: str) -> None:
    import atexit
    import collections
    import json
    import resource
    import sys
    import threading
    import time
    import types

    import redis
    from redis.connection import AbstractConnection

    counts: collections.Counter[str] = collections.Counter()
    original = AbstractConnection.send_packed_command
    inside_redis = os.path.dirname(os.path.abspath(redis.__file__)) + os.sep

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def short(frame: types.FrameType) -> str:
        parts = frame.f_code.co_filename.split(os.sep)
        for root in ("cleveragents", "kombu", "celery", "tasks", "worker", "billiard"):
            if root in parts:
                parts = parts[len(parts) - 1 - parts[::-1].index(root) :]
                break
        return f"{'/'.join(parts[-3:])}:{frame.f_code.co_name}"

    def caller() -> str:
        """The first caller outside redis-py, and the first of this repository above it."""
        frame: types.FrameType | None = sys._getframe(2)
        first = None
        while frame is not None:
            name = frame.f_code.co_filename
            if first is None and not name.startswith(inside_redis) and name != __file__:
                first = short(frame)
            if first is not None and name.startswith(repo + os.sep):
                ours = short(frame)
                return first if ours == first else f"{first} < {ours}"
            frame = frame.f_back
        return first or "?"

    def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        counts[caller()] += 1
        return original(self, command, check_health)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]

    def write() -> None:
        path = os.path.join(folder, f"rt-{os.getpid()}.json")
        usage = resource.getrusage(resource.RUSAGE_SELF)
        data = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "argv": sys.argv,
            "counts": dict(counts),
            "cpu_s": usage.ru_utime + usage.ru_stime,
        }
        tmp = f"{path}.tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)

    def writer() -> None:
        while True:
            time.sleep(0.2)
            write()

    def start() -> None:
        threading.Thread(target=writer, name="bench-round-trips", daemon=True).start()

    def in_child() -> None:
        counts.clear()
        start()

    os.register_at_fork(after_in_child=in_child)
    atexit.register(write)
    start()


if _DIR:
    _install(_DIR)
