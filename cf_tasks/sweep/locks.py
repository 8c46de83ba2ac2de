"""The sweep's lock protocol: a claim on a checkpoint while a process scores it, and the short lock
while the views are rebuilt (``claims/`` of an output folder).

Any number of processes (shards, Slurm array elements, a ``--watch`` beside a manual run) may share
one output folder: each claims a checkpoint with a lock file created atomically (``O_CREAT |
O_EXCL``) that names its owner: host name, boot id (``/proc/sys/kernel/random/boot_id``) and pid.
Ownership is proved as follows. On the owner's host, the owner is alive while a process of that pid
runs and the host has not rebooted since (same boot id); otherwise the lock is taken over at once.
The owner renews the lock's modification time while it scores (a heartbeat every ``HEARTBEAT``
seconds), so a process on another host takes over a lock whose time stamp is older than
``STALE_HEARTBEATS`` heartbeats (its owner's host died or lost the shared file system), and a lock
without a heartbeat (an older cf-tasks) once it is older than the lock timeout. A lock file that is
empty or unreadable (its writer died or the disk filled between creating and writing it) is taken
over once it is ``EMPTY_GRACE`` seconds old.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Iterator

from ..errors import RunError
from ..files import HOST, tmp_name

CLAIMS = "claims"
VIEWS_LOCK_TIMEOUT = 120.0
HEARTBEAT = 30.0  # seconds between renewals of a held claim's time stamp
STALE_HEARTBEATS = 10  # a claim with a heartbeat not renewed for this many periods is taken over
EMPTY_GRACE = 10.0  # seconds a claim file may stay empty (created, not yet written)


def owner_alive(host: str, pid: int) -> bool | None:
    """Whether process ``pid`` runs; None when it is on another host (unknown from here)."""
    if host != HOST:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Busy(RunError):
    """Another live process held the lock for longer than the wait (exit 1, one line: what to run
    once it has finished; every stored result stays)."""


def _boot_id() -> str:
    """This host's boot id (Linux): a pid seen under another boot id belongs to a process of a
    previous boot, gone since."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT = _boot_id()
_HELD: set[Path] = set()  # claims this process holds: their time stamps are renewed (the heartbeat)
_HELD_GUARD = threading.Lock()
_beating: list[threading.Thread] = []


_QUIET = threading.Event()  # never set: its wait() is the heartbeat's sleep, apart from time.sleep


def _beat() -> None:
    while True:
        _QUIET.wait(HEARTBEAT)
        with _HELD_GUARD:
            held = list(_HELD)
        for path in held:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if _mine(json.loads(path.read_text())):
                    os.utime(path)


def _hold(path: Path) -> None:
    with _HELD_GUARD:
        _HELD.add(path)
        if not _beating or not _beating[0].is_alive():
            _beating[:] = [threading.Thread(target=_beat, name="cf-tasks claim heartbeat", daemon=True)]
            _beating[0].start()


def _lock_info() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": HOST, "boot": BOOT, "time": time.time(),
                       "heartbeat": HEARTBEAT}).encode()


def _mine(info: dict) -> bool:
    return info.get("pid") == os.getpid() and info.get("host") == HOST and info.get("boot", BOOT) == BOOT


def _stale(path: Path, timeout: float) -> bool:
    """Whether the owner of lock file ``path`` is gone (see the module's docstring for how)."""
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # unreadable for now: leave it to its owner
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return age > min(EMPTY_GRACE, timeout)  # empty or cut short: its writer died or the disk filled
    if _mine(info):
        return True  # this very process, interrupted before it could remove it
    if info.get("host") == HOST:
        if info.get("boot") and BOOT and info["boot"] != BOOT:
            return True  # made before this host rebooted
        return owner_alive(HOST, info["pid"]) is False or age > timeout
    beat = info.get("heartbeat")
    if isinstance(beat, (int, float)) and beat > 0:
        return age > min(beat * STALE_HEARTBEATS, timeout)
    return age > timeout


def try_lock(path: Path, timeout: float) -> bool:
    """Create lock file ``path`` atomically; a stale one (its owner is gone: see the module's
    docstring) is moved aside first. False: a live process holds it. A lock that cannot be written
    in full (a full disk) is removed again and the OSError raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            if not _stale(path, timeout):
                return False
            aside = path.with_name(tmp_name(path.name))
            try:
                seen = path.read_bytes()
                os.rename(path, aside)  # one taker wins the rename
            except FileNotFoundError:
                continue
            if aside.read_bytes() != seen:  # a fresh lock got in between: put it back
                with contextlib.suppress(OSError):
                    os.link(aside, path)
                aside.unlink(missing_ok=True)
                return False
            aside.unlink(missing_ok=True)
            continue
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_lock_info())
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException as err:
            path.unlink(missing_ok=True)  # never leave an empty claim behind
            if isinstance(err, OSError) and err.filename is None:
                err.filename = str(path)
            raise
        _hold(path)
        return True
    return False


def unlock(path: Path) -> None:
    """Remove our own lock (one a taker replaced stays)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        info = None
    with _HELD_GUARD:
        _HELD.discard(path)
    if isinstance(info, dict) and _mine(info):
        path.unlink(missing_ok=True)


def claim_path(out: Path, ckpt_id: str, settings: str) -> Path:
    return Path(out) / CLAIMS / f"{ckpt_id}.{settings}.lock"


@contextlib.contextmanager
def views_lock(out: Path, wait: float = VIEWS_LOCK_TIMEOUT) -> Iterator[None]:
    """A short lock while the views are rebuilt, so that an older rebuild never lands last."""
    path = Path(out) / CLAIMS / "views.lock"
    deadline = time.monotonic() + wait
    while not try_lock(path, timeout=wait):
        if time.monotonic() > deadline:
            raise Busy(f"{path}: another process has been rebuilding the views for over {wait:.0f} s; every "
                       f"result is stored: run `cf-tasks report {Path(out)}` once it has finished")
        time.sleep(0.05)
    try:
        yield
    finally:
        unlock(path)
