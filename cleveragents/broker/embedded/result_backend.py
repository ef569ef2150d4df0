"""Celery's file result backend, with a file name for every request id and whole writes.

Celery joins the folder and the key (``celery-task-meta-<id>``) as they are: an id
holding ``/`` names a file in a folder that does not exist, and the result is never
stored. Here ``%`` and ``/`` in a key are percent-encoded (a name past the file
system's limit is the key's SHA-256). Celery also writes a result
file in place, so a reader can see half of it; here it is written beside and renamed.
Celery's file is as the umask leaves it (0644, any local user reads every result);
here it is 0600 whatever the umask (``cleveragents.embedded.private``).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from celery.backends.filesystem import FilesystemBackend

from cleveragents.embedded.private import private_opener

__all__ = ["SafeFilesystemBackend", "backend_url"]

#: Room for a key's name and the ".<pid>.part" of a write in progress, under NAME_MAX.
_LONGEST_NAME = 230


def backend_url(folder: str) -> str:
    """The ``result_backend`` value of this backend over ``folder``."""
    return f"{__name__}:SafeFilesystemBackend+file://{folder}"


class SafeFilesystemBackend(FilesystemBackend):  # type: ignore[misc]
    """A file result backend whose keys are always file names in its folder, and whose
    files only their user reads."""

    def _filename(self, key: Any) -> Any:
        # Celery keeps the folder and the separator as bytes.
        raw = key if isinstance(key, bytes) else str(key).encode()
        name = raw.replace(b"%", b"%25").replace(b"/", b"%2F").replace(b"\0", b"%00")
        if len(name) > _LONGEST_NAME:  # ids of many "/": past NAME_MAX once encoded
            name = b"%H" + hashlib.sha256(raw).hexdigest().encode()
        return self.sep.join((self.path, name))  # type: ignore[attr-defined]

    def set(self, key: Any, value: Any) -> None:
        """Write the whole value beside the result (0600), then rename it into place."""
        final = self._filename(key)
        partial = final + f".{os.getpid()}.part".encode()
        with open(partial, "wb", opener=private_opener) as handle:
            handle.write(value if isinstance(value, bytes) else str(value).encode())
        os.replace(partial, final)
