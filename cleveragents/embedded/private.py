"""An embedded home only its user can read: the home checked, folders 0700, files 0600.

The home's server keeps every invocation's arguments and every output on disk (its
append-only file), so the home is closed to other users, whatever the umask:

* a home owned by another user is refused (its owner could read, change or plant
  anything in it), and so is one its group or others may write to (they may have
  planted a socket, a server record or a worker record already): one line naming the fix;
* a home of this user that others may only read (made before homes were
  private: 0755) is tightened to 0700 in place; nobody else could have written
  to it, and closing it takes nothing from its user;
* every folder made in it is 0700 and every file 0600, set explicitly, not left
  to the umask; a folder found there owned by another user is refused.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from cleveragents.errors import ConfigurationError

__all__ = ["FILE_MODE", "FOLDER_MODE", "private_folder", "private_home", "private_opener"]

#: The mode of every folder of an embedded home, the home included.
FOLDER_MODE = 0o700
#: The mode of every file of an embedded home (records, logs, locks; the server's own).
FILE_MODE = 0o600


def private_home(home: Path) -> Path:
    """Make or check ``home`` (resolved, returned): this user's, and no one else's.

    Raises:
        ConfigurationError: it is not a folder, belongs to another user, may be
            written by its group or others, or cannot be created.
    """
    base = home.resolve()
    try:
        _make(base)
        info = base.stat()
    except OSError as exc:
        raise ConfigurationError(
            f"CLEVERAGENTS_HOME {base}: cannot create it ({exc.strerror or exc})"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"CLEVERAGENTS_HOME {base} is not a folder: point it at one")
    me = os.geteuid()
    if info.st_uid != me:
        raise ConfigurationError(
            f"CLEVERAGENTS_HOME {base} is owned by uid {info.st_uid}, not you (uid {me}): "
            "use a home of your own, or chown it"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if info.st_mode & stat.S_IWOTH else "its group"
        raise ConfigurationError(f"CLEVERAGENTS_HOME {base} is writable by {who}: chmod 700 {base}")
    if stat.S_IMODE(info.st_mode) != FOLDER_MODE:
        os.chmod(base, FOLDER_MODE)  # readable by others only: ours to close
    return base


def private_folder(folder: Path) -> Path:
    """Make ``folder`` (and missing parents) 0700, or close an existing one of this user's.

    Raises:
        ConfigurationError: it is not a folder, or it belongs to another user.
    """
    _make(folder)
    info = folder.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"{folder} in CLEVERAGENTS_HOME is not a folder: remove it")
    me = os.geteuid()
    if info.st_uid != me:
        raise ConfigurationError(
            f"{folder} in CLEVERAGENTS_HOME is owned by uid {info.st_uid}, not you "
            f"(uid {me}): remove it, or chown it"
        )
    if stat.S_IMODE(info.st_mode) != FOLDER_MODE:
        os.chmod(folder, FOLDER_MODE)
    return folder


def private_opener(path: str | bytes, flags: int) -> int:
    """``open(..., opener=private_opener)``: the file is 0600, and never a link's target."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)  # created under a umask, or left by an older version
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make(folder: Path) -> None:
    """Create ``folder`` and its missing parents, each 0700 whatever the umask."""
    missing: list[Path] = []
    here = folder
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another command made it meanwhile
            path.mkdir(mode=FOLDER_MODE)
            os.chmod(path, FOLDER_MODE)
