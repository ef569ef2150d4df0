"""Where the embedded broker and the on-disk result store keep their files.

Naming the folders is pure; ``create_folders`` is the one place that makes them,
called when a client is built and when a worker starts (never at import). It
first checks the home is this user's alone, and makes every folder 0700
(``cleveragents.embedded.private``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cleveragents.embedded.private import private_folder, private_home
from cleveragents.settings import Settings

__all__ = ["EmbeddedFolders", "create_folders", "needed_folders", "uses_redis"]

#: URL schemes of kombu's Redis transport.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class EmbeddedFolders:
    """The embedded default's folders under ``CLEVERAGENTS_HOME``."""

    queue: Path
    control: Path
    results: Path

    @classmethod
    def under(cls, home: Path) -> EmbeddedFolders:
        """The folders below ``home`` (resolved, so a worker started elsewhere finds them)."""
        base = home.resolve()
        return cls(base / "broker" / "queue", base / "broker" / "control", base / "results")

    @property
    def results_url(self) -> str:
        """The result backend for the results folder (Celery's, made safe for any id)."""
        from cleveragents.broker.embedded.result_backend import (
            backend_url,  # Celery only when asked
        )

        return backend_url(str(self.results))


def uses_redis(settings: Settings) -> bool:
    """True when the broker is Redis."""
    return (settings.broker_url or "").startswith(REDIS_SCHEMES)


def needed_folders(settings: Settings) -> tuple[Path, ...]:
    """The folders the Celery settings of ``settings`` point at, which must exist before use."""
    folders = EmbeddedFolders.under(settings.home)
    if settings.embedded:
        return (folders.queue, folders.control, folders.results)
    if settings.result_backend is None and not uses_redis(settings):
        return (folders.results,)  # another broker (RabbitMQ): results on disk
    return ()


def create_folders(settings: Settings) -> None:
    """Create the folders ``settings`` needs (nothing with Redis), in a home of this user's.

    Raises:
        ConfigurationError: the home is another user's, others may write to it, or
            a folder in it is another user's (``cleveragents.embedded.private``).
    """
    needed = needed_folders(settings)
    if not needed:
        return
    private_home(settings.home)
    for folder in needed:
        private_folder(folder.parent)  # broker/ or the home itself
        private_folder(folder)
