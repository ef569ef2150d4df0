"""Real processes for tests: private redis-servers and Celery workers, cleaned up by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]
FIXTURE_SKILLS = REPO / "tests" / "fixtures" / "skills"
EXAMPLE_SKILLS = REPO / "examples" / "skills"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true, or fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal a process started with ``start_new_session`` and everything it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie or a dead process is not alive)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


class RedisServer:
    """A private ``redis-server`` on a free port, for tests that stop or restart Redis."""

    def __init__(self, *, password: str | None = None, persistence: bool = True) -> None:
        self.port = free_port()
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="cleveragents-redis-"))
        self.persistence = persistence
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.persistence:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 10, f"redis-server on port {self.port}")
        return self

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            kill_group(self.proc, sig)
            self.proc.wait(10)
            self.proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class Worker:
    """A real ``celery -A worker worker`` process with its own environment."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        concurrency: int = 2,
        queues: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.env = dict(env)
        self.concurrency = concurrency
        self.queues = queues
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix="cleveragents-worker-"))
        self.log = self.dir / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Worker:
        ready = self.dir / "ready"
        ready.unlink(missing_ok=True)
        env = {
            **os.environ,
            **self.env,
            "CLEVERAGENTS_READY_FILE": str(ready),
            "PYTHONPATH": str(REPO),
        }
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            str(self.concurrency),
            "--hostname",
            f"test-{os.getpid()}-{id(self)}@%h",
            "--without-mingle",
            "--without-gossip",
            *self.extra,
        ]
        if self.queues:
            args += ["-Q", self.queues]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                args,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout, "worker ready")
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early:\n{self.log.read_text()[-3000:]}")
        return self

    def child_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            kill_group(self.proc, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
            kill_group(self.proc, signal.SIGKILL)
            self.proc = None

    def shut_down(self, timeout: float = 60) -> None:
        """A warm shutdown, as ``docker stop`` asks: SIGTERM to the main process only.

        Returns once the worker has exited; its pool processes flush their metric counts
        and spans as they leave (cleveragents/worker/startup.py), so by then every count
        and span the worker made has been sent.
        """
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout)
        self.proc = None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
