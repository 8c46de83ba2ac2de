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

import errno
import os
import secrets
import socket
from pathlib import Path

from .errors import UsageError

TMP_MARK = ".cftmp"  # every temp name ends ``.<host>.<pid>.<random>.cftmp``
HOST = socket.gethostname()


def host_tag(host: str) -> str:
    return host.replace(".", "_")  # a host name's dots would make the temp name ambiguous


def tmp_name(name: str) -> str:
    """A temp name for ``name`` (a file or a folder), unique to this process and call."""
    return f".{name}.{host_tag(HOST)}.{os.getpid()}.{secrets.token_hex(4)}{TMP_MARK}"


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
    return (HOST if host == host_tag(HOST) else host), pid


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
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _named(err, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _named(err: OSError, path: Path) -> OSError:
    """``err`` with the path it was about (a failed write on an open file carries none)."""
    if err.filename is None:
        err.filename = str(path)
    return err


FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left, disk quota exceeded
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def write_failure(err: OSError) -> str | None:
    """One line for a write that failed for lack of space or of permission: the folder it was in and
    the fix; None for any other error."""
    if err.errno not in FULL + READ_ONLY:
        return None
    name = (err.filename2 or err.filename) if err.errno in FULL else err.filename
    folder = Path(str(name)) if name else None
    if folder is not None and not folder.is_dir():
        folder = folder.parent
    while folder is not None and tmp_owner(folder.name) and folder != folder.parent:
        folder = folder.parent  # a temp folder of the write is gone: name the folder it was in
    where = f"{folder}: " if folder is not None else ""
    if err.errno in FULL:
        return (f"{where}cannot write there ({err.strerror or 'no space left'}); free space on that disk (or pass "
                "another output folder) and run again: finished results are kept")
    return (f"{where}cannot write there ({err.strerror or 'not writable'}); make that folder writable (or pass "
            "another output folder) and run again: finished results are kept")


class atomic_open:
    """``with atomic_open(path) as fh: fh.write(...)``: the streaming form of ``atomic_write``, for
    outputs too large to hold in memory. The lines go to a temp file of this process; a clean exit
    flushes it to disk and renames it over ``path``; an exception removes it and leaves ``path`` as it was."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.tmp = self.path.with_name(tmp_name(self.path.name))

    def __enter__(self):
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.fh = os.fdopen(fd, "wb")
        return self.fh

    def __exit__(self, kind, value, tb) -> None:
        try:
            if kind is None:
                self.fh.flush()
                os.fsync(self.fh.fileno())
            self.fh.close()
            if kind is None:
                os.replace(self.tmp, self.path)
        except OSError as err:
            raise _named(err, self.path) from None
        finally:
            self.tmp.unlink(missing_ok=True)
        if isinstance(value, OSError):
            _named(value, self.path)


# The path arguments of every command (dest -> how the user wrote it, the fix): an empty one would
# mean the working folder (``Path("") == Path(".")``), so it is refused before any work.
PATH_ARGUMENTS = {"output_path": ("--output_path", "pass a folder"), "out": ("--output_path", "pass a folder"),
                  "report_path": ("--report_path", "pass a folder, or leave it out for the default"),
                  "run_dir": ("RUN_DIR", "pass the run folder"), "outputs": ("OUTPUTS", "pass sweep output folders"),
                  "data": ("DATA", "pass a JSONL file, a datasets folder or a Hub dataset id"),
                  "base": ("--base", "pass the base model's folder or Hub id, or leave it out"),
                  "model": ("--model", "pass a model folder, or leave it out for the default model")}
# Arguments whose empty value would silently mean their default.
EMPTY_MEANS_DEFAULT = {"metadata": ("--metadata", "pass a JSON object, e.g. '{\"seed\": 7}', or leave it out"),
                       "model_args": ("--model_args", "pass KEY=VALUE pairs, or leave it out"),
                       "context_field": ("--context_field", "name the context's field, or leave it out for 'input'"),
                       "report_to": ("--report_to", "name the trackers, e.g. --report_to tensorboard, or leave it out"),
                       "report_args": ("--report_args", "pass KEY=VALUE pairs, or leave it out")}


def _ascii_number(kind):
    """An argparse ``type`` that reads ``kind`` (int or float) from ASCII text only: Python's own
    would read other scripts' digits ("٣" is 3), which no one types as a number of steps."""

    def read(text: str):
        if not text.isascii():
            raise ValueError(text)
        return kind(text)

    read.__name__ = kind.__name__  # argparse's message: "invalid int value: '٣'"
    return read


ascii_int, ascii_float = _ascii_number(int), _ascii_number(float)


def check_not_empty(args) -> None:
    """A ``UsageError`` for the first path argument of ``args`` that is an empty string (or blanks),
    or an argument whose empty value would silently mean its default."""
    command = getattr(args, "command", None)
    for dest, (flag, fix) in PATH_ARGUMENTS.items():
        if dest == "model" and command not in ("filter-data", "experiment"):
            continue  # cf-tasks eval's --model is a model type, checked by its own command
        if dest == "out" and command == "publish":
            flag = "--out"
        value = getattr(args, dest, None)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not item.strip():
                raise UsageError(f"{flag} is empty ({item!r}), which would mean the working folder; {fix}")
    for dest, (flag, fix) in EMPTY_MEANS_DEFAULT.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"{flag} is empty ({value!r}); {fix}")


def writable_dir(path: str, flag: str = "--output_path") -> Path:
    """The output folder ``path``, created if needed and checked writable; a ``UsageError`` naming
    ``flag`` when it cannot be written."""
    if not str(path).strip():
        raise UsageError(f"{flag} is empty, which would mean the working folder; pass a folder name")
    out = Path(path)
    if out.exists() and not out.is_dir():  # mkdir would say only "File exists"
        raise UsageError(f"{flag} {out} is a file, not a folder; pass a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".cf-tasks-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UsageError(f"cannot write to output folder {out}: {reason}; choose a writable {flag}") from None
    return out


# ---------------------------------------------------------------- one run's outputs, landing together


class OutputLock:
    """``with OutputLock(out, "filter-data"):`` one run of a command per output folder: an advisory
    ``flock`` on ``out/.<command>.lock``, released when the process ends however it ends. A second
    run into the folder gets a ``UsageError`` naming it. With ``on_folder`` the lock is on the folder
    itself, for a folder that must hold only its own files (a repository layout, a study)."""

    def __init__(self, out: Path, command: str, on_folder: bool = False):
        self.out, self.command, self.on_folder = Path(out), command, on_folder
        self.path = self.out if on_folder else self.out / f".{command}.lock"

    def __enter__(self):
        import fcntl

        flags = os.O_RDONLY | os.O_DIRECTORY if self.on_folder else os.O_RDWR | os.O_CREAT
        self.fd = os.open(self.path, flags, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise UsageError(f"--output_path {self.out}: another cf-tasks {self.command} is writing there "
                             "now; wait for it to finish or pass another --output_path") from None
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def stage_dir(out: Path, label: str) -> Path:
    """A temp folder inside ``out`` for one run's outputs, moved into place by ``publish``."""
    stage = Path(out) / tmp_name(label)
    stage.mkdir()
    return stage


def clean_stages(out: Path, label: str) -> None:
    """The temp folders of ``label`` runs that died (call it under the folder's ``OutputLock``)."""
    import shutil

    for p in Path(out).glob(f".{label}.*{TMP_MARK}"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def publish(stage: Path, out: Path, record_name: str, record: dict, names: set[str]) -> None:
    """Move a run's staged outputs into ``out`` so that the folder never mixes two runs: the old
    record (``record_name``, what the outputs are from) goes first, then every output of ``names``
    that this run did not write (a stale plot, a view of another input kind), then the new files
    come in, and the new record last. A folder without a record is a run cut short."""
    import json
    import shutil

    out = Path(out)
    try:
        (out / record_name).unlink(missing_ok=True)
        made = {p.name for p in stage.iterdir()}
        for name in sorted(names - made - {record_name}):
            old = out / name
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            elif old.exists() or old.is_symlink():
                old.unlink()
        for name in sorted(made):
            target = out / name
            if target.is_dir() and not target.is_symlink():
                aside = out / tmp_name(name)
                target.rename(aside)
                os.replace(stage / name, target)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.replace(stage / name, target)
        atomic_write(out / record_name, (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode())
    finally:
        shutil.rmtree(stage, ignore_errors=True)
