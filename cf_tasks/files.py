"""Writing a file so that no reader ever sees half of it: the one temp-then-rename writer of cf-tasks.

``atomic_write`` puts the bytes into a temp file of this process in the target's folder, flushes
them to disk (``fsync``) and renames the temp file over the target, so a reader sees the old file
or the new one, and a crash leaves no half-written file under the real name. The temp name is
``.<name>.<host>.<pid>.<random>.cftmp`` (the host's dots written as ``_``): concurrent writers of
the same file (sweep shards, two builds into one folder, even on other hosts of a shared file
system) never share a temp file, and ``cf_tasks.sweep.store.clean_leftovers`` can tell a dead
writer's temp from a live one's (``tmp_owner``). The file gets the umask's mode (0666 & ~umask),
as any other file the user creates; a failed write removes its temp file and leaves the target as
it was."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

TMP_MARK = ".cftmp"  # every temp name ends ``.<host>.<pid>.<random>.cftmp``
HOST = socket.gethostname()


def _host_tag(host: str) -> str:
    return host.replace(".", "_")  # a host name's dots would make the temp name ambiguous


def tmp_name(name: str) -> str:
    """A temp name for ``name`` (a file or a folder), unique to this process and call."""
    return f".{name}.{_host_tag(HOST)}.{os.getpid()}.{secrets.token_hex(4)}{TMP_MARK}"


def tmp_owner(name: str) -> tuple[str, int] | None:
    """(host, pid) of the process that made temp name ``name`` (``HOST`` itself when it is this
    host); None for any other name."""
    if not name.endswith(TMP_MARK):
        return None
    parts = name[: -len(TMP_MARK)].rsplit(".", 3)
    try:
        host, pid = parts[-3], int(parts[-2])
    except (IndexError, ValueError):
        return None
    return (HOST if host == _host_tag(HOST) else host), pid


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    # O_EXCL: never write into someone else's file; mode 0666 is narrowed by the umask, as open() does.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
