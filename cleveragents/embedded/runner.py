"""Start and stop a local Celery worker process for one command on the embedded default."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings

__all__ = ["LocalWorker", "worker_command"]

#: How long a local worker may take to become ready.
START_TIMEOUT_S = 60.0
#: How long a warm shutdown may take before the worker is killed.
STOP_TIMEOUT_S = 15.0


def worker_command(*extra: str) -> list[str]:
    """``celery -A worker worker`` run by this interpreter, with extra options."""
    return [sys.executable, "-m", "celery", "-A", "worker", "worker", *extra]


class LocalWorker:
    """A real Celery worker process over the embedded on-disk broker, for one command."""

    def __init__(self, settings: Settings, *, concurrency: int = 2) -> None:
        self.settings = settings
        self.concurrency = concurrency
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = settings.home.resolve() / "logs" / "local-worker.log"

    def start(self) -> LocalWorker:
        """Start the worker and wait until it consumes."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        ready = Path(tempfile.mkdtemp(prefix="cleveragents-ready-")) / "ready"
        env = dict(os.environ)
        env["CLEVERAGENTS_HOME"] = str(self.settings.home.resolve())
        env["CLEVERAGENTS_READY_FILE"] = str(ready)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        command = worker_command(
            "--loglevel",
            "WARNING",
            "--concurrency",
            str(self.concurrency),
            "--hostname",
            f"embedded-{os.getpid()}@%h",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise ConfigurationError(
                    f"the local worker did not start (log {self.log_path}): {' | '.join(tail)}"
                )
            time.sleep(0.05)
        return self

    def stop(self, *, drained: bool = False) -> None:
        """Stop the worker: warm shutdown (unfinished messages go back to the queue),
        then kill whatever is left of its process group.

        ``drained=True`` says every submitted invocation has its result, so nothing is
        in flight and the worker is killed at once instead of waiting seconds for a
        warm shutdown.
        """
        proc = self.process
        if proc is None:
            return
        self.process = None
        if proc.poll() is None and not drained:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    def __enter__(self) -> LocalWorker:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
